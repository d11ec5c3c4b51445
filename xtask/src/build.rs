//! `cargo xtask build`: the build tools (`setup::build_tools`), then
//! observer with cargo; release builds take the committed Cargo.lock as is
//! (`--locked`).
use std::{path::PathBuf, process::Command};

use anyhow::Result;
use clap::Args;

use crate::{run_cmd, setup, workspace_root};

#[derive(Args)]
pub struct Options {
    /// Build with optimisations (target/release).
    #[arg(long)]
    pub release: bool,
}

/// Returns the path of the built `observer` binary.
pub fn run(opts: &Options) -> Result<PathBuf> {
    build(opts, false)
}

/// `run`; `in_background` builds at the lowest CPU priority (nice 19),
/// beside work that should not wait for it.
pub fn build(opts: &Options, in_background: bool) -> Result<PathBuf> {
    let nightly = setup::build_tools()?;
    let mut cmd = crate::cargo(in_background);
    cmd.current_dir(workspace_root()).args(["build", "--package", "observer", "--bins"]);
    if opts.release {
        cmd.args(["--release", "--locked"]);
    }
    cmd.env("OBSERVER_NIGHTLY", &nightly.name);
    run_cmd(&mut cmd)?;
    let profile = if opts.release { "release" } else { "debug" };
    Ok(workspace_root().join("target").join(profile).join("observer"))
}

/// Build the churn generator (observer-testing's `observer-churn`, a test
/// tool kept out of the product); returns its path.
pub fn churn(release: bool) -> Result<PathBuf> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root()).args(["build", "--package", "observer-testing", "--bin", "observer-churn"]);
    if release {
        cmd.arg("--release");
    }
    run_cmd(&mut cmd)?;
    let profile = if release { "release" } else { "debug" };
    Ok(workspace_root().join("target").join(profile).join("observer-churn"))
}
