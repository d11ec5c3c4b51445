//! `cargo xtask test`: every test, the kernel ones included. They load real
//! eBPF programs and create network namespaces, so they need root; they
//! never skip.
use std::process::Command;

use anyhow::{bail, Result};
use clap::Args;

use crate::{build, run_cmd, setup, vm, workspace_root};

#[derive(Args)]
pub struct Options {
    /// Skip the kernel matrix (the kernel tests inside VMs of stock Debian
    /// kernels, in the fentry and kprobe modes); for quick local runs.
    #[arg(long, conflicts_with = "vm_only")]
    pub host_only: bool,
    /// Run only the kernel matrix.
    #[arg(long, visible_alias = "vm")]
    pub vm_only: bool,
    /// Extra arguments for `cargo test` (after `--`), e.g. `-- time_wait`.
    #[arg(last = true)]
    pub args: Vec<String>,
}

pub fn run(opts: &Options) -> Result<()> {
    if !setup::nix_is_root() {
        bail!("the kernel tests load eBPF programs and create network namespaces: run `cargo xtask test` as root");
    }
    let nightly = setup::run()?;
    if opts.vm_only {
        return matrix(&nightly.name);
    }
    let host = run_cmd(
        Command::new("cargo")
            .current_dir(workspace_root())
            // The eBPF crate only builds for the bpf target (via observer/build.rs).
            .args(["test", "--workspace", "--exclude", "observer-ebpf", "--no-fail-fast"])
            .args(&opts.args)
            .env("OBSERVER_NIGHTLY", &nightly.name),
    );
    if opts.host_only {
        return host;
    }
    let matrix = matrix(&nightly.name);
    host.and(matrix)
}

/// Run the kernel tests on every kernel of the matrix; print the report and
/// keep it in target/vm/report.txt.
fn matrix(nightly: &str) -> Result<()> {
    let kernels = vm::setup()?;
    let bins = vm::test_binaries(nightly)?;
    let observer = build::run(&build::Options { release: false })?;
    let mut report = String::new();
    let mut all_ok = true;
    for kernel in &kernels {
        let (summary, ok) = vm::run_kernel(kernel, &bins, &observer)?;
        print!("{summary}");
        report.push_str(&summary);
        all_ok &= ok;
    }
    std::fs::write(workspace_root().join("target/vm/report.txt"), &report)?;
    if !all_ok {
        bail!("the kernel matrix failed (consoles in target/vm/console-*.log)");
    }
    println!("kernel matrix: all kernels and modes passed");
    Ok(())
}
