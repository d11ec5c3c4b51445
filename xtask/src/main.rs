//! cargo xtask: what cargo alone cannot do for observer. One module per
//! subcommand. `setup` runs implicitly before `run` and `test`; `build`
//! and `image` set up only what building needs.
mod bench;
mod build;
mod image;
mod run;
mod setup;
mod test;
mod timing;
mod toolchain;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, run and test observer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what building and testing need (idempotent, fast when done):
    /// rust-src for the pinned nightly, bpf-linker against its LLVM (under
    /// target/tools), and the Debian tools the tests call.
    Setup,
    /// Build observer (the eBPF object is built and embedded by build.rs).
    Build(build::Options),
    /// Build the container image offline: target/image/observer.oci.tar
    /// (`podman load -i` / `docker load -i`), its SBOM beside it, and into
    /// podman's storage where podman is installed.
    Image(image::Options),
    /// Build and start the daemon: `cargo xtask run -- --interval 1s`.
    Run(run::Options),
    /// Run every test, the kernel ones included (needs root).
    Test(test::Options),
    /// Measure overhead and lossless counting against peers; writes
    /// BENCHMARKS.md and checks the targets.
    Bench(bench::Options),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Setup => setup::run().map(|_| ()),
        Command::Build(opts) => build::run(&opts).map(|_| ()),
        Command::Image(opts) => image::run(&opts).map(|_| ()),
        Command::Run(opts) => run::run(&opts),
        Command::Test(opts) => test::run(&opts),
        Command::Bench(opts) => bench::run(&opts),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Where `program` is on the PATH, if it is.
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.exists())
}

/// `cargo`, at the lowest CPU priority (nice 19) if `in_background`: a
/// build beside work that should not wait for it (the kernel matrix's
/// guests).
pub fn cargo(in_background: bool) -> std::process::Command {
    if in_background {
        let mut nice = std::process::Command::new("nice");
        nice.args(["-n", "19", "cargo"]);
        nice
    } else {
        std::process::Command::new("cargo")
    }
}

/// Run a command, failing with its name if it does not succeed.
pub fn run_cmd(cmd: &mut std::process::Command) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    anyhow::ensure!(status.success(), "{cmd:?} failed ({status})");
    Ok(())
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is in the workspace").to_path_buf()
}
