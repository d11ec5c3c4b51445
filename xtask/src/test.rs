//! `cargo xtask test`: every test, the kernel ones included. They load real
//! eBPF programs and create network namespaces, so they need root; they
//! never skip.
use std::process::Command;

use anyhow::{bail, Result};
use clap::Args;

use crate::{run_cmd, setup, workspace_root};

#[derive(Args)]
pub struct Options {
    /// Extra arguments for `cargo test` (after `--`), e.g. `-- time_wait`.
    #[arg(last = true)]
    pub args: Vec<String>,
}

pub fn run(opts: &Options) -> Result<()> {
    if !setup::nix_is_root() {
        bail!("the kernel tests load eBPF programs and create network namespaces: run `cargo xtask test` as root");
    }
    let nightly = setup::run()?;
    run_cmd(
        Command::new("cargo")
            .current_dir(workspace_root())
            // The eBPF crate only builds for the bpf target (via observer/build.rs).
            .args(["test", "--workspace", "--exclude", "observer-ebpf", "--no-fail-fast"])
            .args(&opts.args)
            .env("OBSERVER_NIGHTLY", &nightly.name),
    )
}
