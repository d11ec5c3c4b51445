//! `cargo xtask setup`: make this machine able to build and test observer.
//! Every step checks first and prints what it does, so a second run is
//! fast and quiet.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{run_cmd, toolchain, workspace_root};

/// bpf-linker version; 0.13 supports LLVM 21, 22 and 23 by feature.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages the tests call: ip/ss/nstat, setpriv, sysctl, iptables,
/// jsonnet (renders the monitoring mixin), tmux (a real terminal for
/// `observer top`), bpftool (which programs a trace loaded).
const PACKAGES: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("nstat", "iproute2"),
    ("setpriv", "util-linux"),
    ("sysctl", "procps"),
    ("iptables", "iptables"),
    ("jsonnet", "jsonnet"),
    ("tmux", "tmux"),
    ("bpftool", "bpftool"),
    // Real clients for the incidents' replays: a pool (wrk keeps its
    // connections alive) and a new connection per request (a curl loop).
    ("wrk", "wrk"),
    ("curl", "curl"),
];

/// Where setup installs its tools.
pub fn tools_dir() -> PathBuf {
    workspace_root().join("target/tools")
}

/// Everything: what building needs, what running needs (tracefs) and what
/// the tests call.
pub fn run() -> Result<toolchain::Nightly> {
    let nightly = build_tools()?;
    tracefs()?;
    debian_packages()?;
    prometheus()?;
    nginx()?;
    redis()?;
    kubernetes_tools()?;
    container_tools()?;
    Ok(nightly)
}

/// Only what building needs (the pinned nightly's rust-src and
/// bpf-linker): no test tools, no system changes, so it also runs inside
/// an image build (deploy/Dockerfile).
pub fn build_tools() -> Result<toolchain::Nightly> {
    let nightly = toolchain::nightly()?;
    rust_src(&nightly)?;
    bpf_linker(&nightly)?;
    Ok(nightly)
}

/// What running the daemon needs besides the binary: tracefs mounted.
pub fn run_tools() -> Result<()> {
    tracefs()
}

/// podman with runc, which the image tests run the DaemonSet's container
/// with (crun, podman's default, refuses hybrid cgroup hosts).
fn container_tools() -> Result<()> {
    apt_install(&[("podman", "podman"), ("runc", "runc")])
}

/// kubernetes-validate (PyPI), pinned: validates the deploy/ manifests
/// against the Kubernetes schemas, offline.
const KUBERNETES_VALIDATE: &str = "1.37.0";

/// The venv with kubernetes-validate (and PyYAML, its dependency, which
/// the deploy tests use to read the manifests).
pub fn k8s_venv_bin(program: &str) -> PathBuf {
    tools_dir().join("k8s-venv/bin").join(program)
}

/// kubectl (its built-in kustomize builds deploy/) and kubernetes-validate.
fn kubernetes_tools() -> Result<()> {
    if !have("kubectl") {
        apt_install_packages(&["kubernetes-client"])?;
    }
    let venv = tools_dir().join("k8s-venv");
    let stamp = venv.join("observer.stamp");
    if fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == KUBERNETES_VALIDATE) {
        return Ok(());
    }
    println!("setup: installing kubernetes-validate {KUBERNETES_VALIDATE} into {}", venv.display());
    if !have("python3") || !Command::new("python3").args(["-c", "import venv, ensurepip"]).status()?.success() {
        apt_install_packages(&["python3-venv"])?;
    }
    run_cmd(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run_cmd(Command::new(venv.join("bin/pip")).args([
        "install",
        "-q",
        &format!("kubernetes-validate=={KUBERNETES_VALIDATE}"),
    ]))
    .context("pip install kubernetes-validate failed (no network to PyPI?)")?;
    fs::write(&stamp, KUBERNETES_VALIDATE)?;
    Ok(())
}

/// Prometheus server and promtool, for the tests that scrape observer with
/// a real server: Debian's package unpacked under target/tools (installing
/// it would start a system service we do not want).
pub fn prometheus_bin(program: &str) -> PathBuf {
    tools_dir().join("prometheus/usr/bin").join(program)
}

/// nginx, the real server the doctor and alert tests replay the incidents
/// against: unpacked likewise (installing it starts a server on port 80).
pub fn nginx_bin() -> PathBuf {
    tools_dir().join("nginx/usr/sbin/nginx")
}

fn prometheus() -> Result<()> {
    unpacked("prometheus", &["prometheus"], &[prometheus_bin("prometheus"), prometheus_bin("promtool")])
}

fn nginx() -> Result<()> {
    unpacked("nginx", &["nginx"], &[nginx_bin()])
}

/// redis-server, the real database the server-limit tests turn away
/// connections with (`maxclients`): Debian's redis-server (a link) and
/// redis-tools (the binary) unpacked likewise (installing them starts a
/// service), its two libraries installed.
pub fn redis_bin() -> PathBuf {
    tools_dir().join("redis/usr/bin/redis-server")
}

fn redis() -> Result<()> {
    apt_install_packages(&["libjemalloc2", "liblzf1"])?;
    unpacked("redis", &["redis-server", "redis-tools"], &[redis_bin()])
}

/// Debian's `packages` unpacked into target/tools/`dir` (not installed:
/// no service started, no maintainer script run), unless `binaries` are
/// there already. Their libraries must be on the machine (those of nginx
/// and prometheus are in Debian's base; redis's are installed first).
fn unpacked(dir: &str, packages: &[&str], binaries: &[PathBuf]) -> Result<()> {
    if binaries.iter().all(|b| b.exists()) {
        return Ok(());
    }
    println!("setup: fetching Debian's {} into {}", packages.join(", "), tools_dir().join(dir).display());
    let download = tools_dir().join(format!("{dir}-download"));
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)?;
    // apt fetches as its own user (_apt) when it may write there.
    fs::set_permissions(&download, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let fetch = || apt_get().current_dir(&download).args(["download", "-q"]).args(packages).status();
    if !fetch().is_ok_and(|s| s.success()) {
        // A fresh machine may have no package lists yet.
        run_cmd(apt_get().args(["update", "-qq"]))?;
        run_cmd(apt_get().current_dir(&download).args(["download", "-q"]).args(packages))
            .with_context(|| format!("cannot download {}", packages.join(", ")))?;
    }
    let debs: Vec<PathBuf> = fs::read_dir(&download)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    if debs.len() != packages.len() {
        bail!("apt-get download left {} .deb files for {}", debs.len(), packages.join(", "));
    }
    for deb in debs {
        run_cmd(Command::new("dpkg").arg("-x").arg(&deb).arg(tools_dir().join(dir)))?;
    }
    fs::remove_dir_all(&download)?;
    Ok(())
}

fn rust_src(nightly: &toolchain::Nightly) -> Result<()> {
    if nightly.sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    println!("setup: adding rust-src to {} (build-std needs it)", nightly.name);
    run_cmd(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", &nightly.name]))
        .context("cannot add rust-src (no network?)")
}

/// Build bpf-linker against the nightly's own libLLVM (no system LLVM
/// needed), into target/tools. A stamp file records what it was built for.
fn bpf_linker(nightly: &toolchain::Nightly) -> Result<()> {
    let tools = tools_dir();
    let stamp = tools.join("bpf-linker.stamp");
    let want = format!("{BPF_LINKER_VERSION} llvm-{} {}", nightly.llvm_major, nightly.commit_hash);
    if tools.join("bin/bpf-linker").exists() && fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == want) {
        return Ok(());
    }
    println!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against {}'s LLVM {} (a few minutes, once)",
        nightly.name, nightly.llvm_major
    );
    let llvm_prefix = tools.join(format!("llvm-{}", nightly.llvm_major));
    link_libllvm(&nightly.sysroot.join("lib"), &llvm_prefix.join("lib"), nightly.llvm_major)?;
    run_cmd(
        Command::new("cargo")
            .args(["install", "--force", "--locked", "--root"])
            .arg(&tools)
            .args(["--version", BPF_LINKER_VERSION, "bpf-linker", "--no-default-features", "--features"])
            .arg(format!("llvm-{}", nightly.llvm_major))
            .env("LLVM_PREFIX", &llvm_prefix),
    )
    .context("building bpf-linker failed (no network to crates.io?)")?;
    fs::write(&stamp, want)?;
    Ok(())
}

/// llvm-sys links `-lLLVM` from $LLVM_PREFIX/lib: point that at the
/// nightly's `libLLVM.so.<major>.<minor>-rust-*`.
fn link_libllvm(sysroot_lib: &Path, prefix_lib: &Path, major: u32) -> Result<()> {
    let wanted = format!("libLLVM.so.{major}.");
    let found = fs::read_dir(sysroot_lib)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&wanted)));
    let Some(lib) = found else {
        bail!("no {wanted}* in {}: is this a rustup nightly?", sysroot_lib.display());
    };
    fs::create_dir_all(prefix_lib)?;
    let link = prefix_lib.join("libLLVM.so");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link)?;
    Ok(())
}

fn have(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into(), "/bin".into()])
        .any(|d| d.join(program).exists())
}

fn debian_packages() -> Result<()> {
    apt_install(PACKAGES)
}

/// `apt-get`, one at a time in this process: the kernel matrix's set-up
/// runs beside the host's, and a second apt-get would fail on dpkg's lock.
/// A download that stalls is given up after 30 s and retried (apt's own
/// wait is 120 s): a fresh machine's set-up once spent 9 minutes reading
/// 24 MB of package lists that took 3 s a moment later.
pub fn apt_get() -> AptGet {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut command = Command::new("apt-get");
    command.args(["-o", "Acquire::http::Timeout=30", "-o", "Acquire::Retries=3"]);
    AptGet { command, _turn: turn }
}

/// An `apt-get` command and this process's turn at apt, held until the
/// command is dropped (run it in the statement that makes it).
pub struct AptGet {
    command: Command,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for AptGet {
    type Target = Command;
    fn deref(&self) -> &Command {
        &self.command
    }
}

impl std::ops::DerefMut for AptGet {
    fn deref_mut(&mut self) -> &mut Command {
        &mut self.command
    }
}

/// Install the Debian packages (binary, package) whose binary is missing.
pub fn apt_install(packages: &[(&str, &str)]) -> Result<()> {
    let mut missing: Vec<&str> = packages.iter().filter(|(bin, _)| !have(bin)).map(|(_, pkg)| *pkg).collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    println!("setup: installing {} (the tests call them)", missing.join(" "));
    if !have("apt-get") {
        bail!("missing {}: install them with your package manager", missing.join(", "));
    }
    run_cmd(apt_get().args(["update", "-qq"]))?;
    run_cmd(apt_get().args(["install", "-y", "-qq"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Install the Debian packages that are not installed yet.
pub fn apt_install_packages(packages: &[&str]) -> Result<()> {
    let installed = |pkg: &str| {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", pkg])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
    };
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("setup: installing {}", missing.join(" "));
    run_cmd(apt_get().args(["update", "-qq"]))?;
    run_cmd(apt_get().args(["install", "-y", "-qq"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive"))
}

/// The classic tracepoints need tracefs; Debian does not mount it at boot.
fn tracefs() -> Result<()> {
    if Path::new("/sys/kernel/tracing/events").is_dir() || Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        return Ok(());
    }
    if !nix_is_root() {
        println!("setup: tracefs is not mounted; as root: mount -t tracefs nodev /sys/kernel/tracing");
        return Ok(());
    }
    println!("setup: mounting tracefs at /sys/kernel/tracing");
    run_cmd(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
}

pub fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { geteuid() == 0 }
}

unsafe extern "C" {
    fn geteuid() -> u32;
}
