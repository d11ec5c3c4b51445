use which::which;

/// Rebuild the eBPF object when bpf-linker changes (e.g. `cargo xtask setup`
/// rebuilt it against another LLVM): cargo does not track linkers itself.
fn main() {
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
