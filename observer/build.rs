//! Builds the eBPF object (observer-ebpf) with the pinned nightly and embeds
//! it: `include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"))`.
use std::{env, path::PathBuf};

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

/// The nightly toolchain the eBPF crate is built with. Pinned by version in
/// xtask/src/toolchain.rs, which checks it and installs the matching
/// bpf-linker; here only its rustup name is needed (OBSERVER_NIGHTLY).
const NIGHTLY_DEFAULT: &str = "nightly";

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir.parent().context("workspace root")?;
    // `cargo xtask setup` installs bpf-linker under target/tools/bin rather
    // than the user's PATH; put it on the PATH of the nested eBPF build so a
    // plain `cargo build` works after setup too.
    let tools = workspace.join("target/tools/bin");
    println!("cargo:rerun-if-changed={}", tools.join("bpf-linker").display());
    let path = env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![tools];
    paths.extend(env::split_paths(&path));
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { env::set_var("PATH", env::join_paths(paths)?) };

    println!("cargo:rerun-if-env-changed=OBSERVER_NIGHTLY");
    let nightly = env::var("OBSERVER_NIGHTLY").unwrap_or_else(|_| NIGHTLY_DEFAULT.to_string());
    let ebpf_dir = workspace.join("observer-ebpf");
    let root_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [Package { name: "observer-ebpf", root_dir, ..Default::default() }],
        Toolchain::Custom(&nightly),
    )
}
