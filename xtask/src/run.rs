//! `cargo xtask run`: build and start the daemon in the foreground.
use std::{os::unix::process::CommandExt, process::Command};

use anyhow::{Result, bail};
use clap::Args;

use crate::{build, setup};

#[derive(Args)]
pub struct Options {
    #[arg(long)]
    pub release: bool,
    /// Arguments for `observer run` (after `--`), e.g. `-- --interval 1s`.
    #[arg(last = true)]
    pub args: Vec<String>,
}

pub fn run(opts: &Options) -> Result<()> {
    let binary = build::run(&build::Options { release: opts.release })?;
    setup::run_tools()?;
    let mut cmd = if setup::nix_is_root() {
        Command::new(&binary)
    } else {
        // eBPF needs privileges; sudo keeps the user's build untouched.
        let mut c = Command::new("sudo");
        c.arg(&binary);
        c
    };
    cmd.arg("run").args(&opts.args);
    println!("xtask: starting {}", binary.display());
    let err = cmd.exec();
    bail!("cannot start {}: {err}", binary.display())
}
