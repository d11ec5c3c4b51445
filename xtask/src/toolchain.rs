//! The pinned nightly that builds the eBPF crate.
//!
//! bpf-linker must be built against the same LLVM major as the rustc that
//! emits the bitcode, so a floating nightly breaks builds. We pin the
//! nightly by its commit date; `OBSERVER_NIGHTLY` names the rustup
//! toolchain that has it (default: `nightly`).
use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// rustc 1.97.0-nightly (e50aa6fba 2026-05-19), LLVM 22.
pub const PINNED_COMMIT_DATE: &str = "2026-05-19";
/// The rustup name of that toolchain (from a dated release: the day after).
pub const PINNED_RUSTUP_NAME: &str = "nightly-2026-05-20";

pub fn rustup_name() -> String {
    std::env::var("OBSERVER_NIGHTLY").unwrap_or_else(|_| "nightly".to_string())
}

pub struct Nightly {
    pub name: String,
    pub commit_hash: String,
    pub llvm_major: u32,
    pub sysroot: std::path::PathBuf,
}

pub fn nightly() -> Result<Nightly> {
    let name = rustup_name();
    let out = Command::new("rustc")
        .arg(format!("+{name}"))
        .arg("-vV")
        .output()
        .context("cannot run rustc: is rustup installed?")?;
    if !out.status.success() {
        bail!(
            "the Rust toolchain `{name}` is not installed; the eBPF programs need the pinned nightly: \
             `rustup toolchain install {PINNED_RUSTUP_NAME} --component rust-src` then \
             `export OBSERVER_NIGHTLY={PINNED_RUSTUP_NAME}`"
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).map(str::to_string);
    let date = field("commit-date:").unwrap_or_default();
    if date != PINNED_COMMIT_DATE {
        bail!(
            "toolchain `{name}` is from {date}, observer pins the nightly of {PINNED_COMMIT_DATE}: \
             `rustup toolchain install {PINNED_RUSTUP_NAME} --component rust-src` then \
             `export OBSERVER_NIGHTLY={PINNED_RUSTUP_NAME}`"
        );
    }
    let llvm = field("LLVM version:").context("rustc -vV shows no LLVM version")?;
    let llvm_major = llvm.split('.').next().unwrap_or_default().parse().context("LLVM version")?;
    let sysroot = Command::new("rustc").arg(format!("+{name}")).args(["--print", "sysroot"]).output()?;
    let sysroot = String::from_utf8(sysroot.stdout)?.trim().into();
    Ok(Nightly { name, commit_hash: field("commit-hash:").unwrap_or_default(), llvm_major, sysroot })
}
