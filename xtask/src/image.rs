//! `cargo xtask image`: observer's container image, built offline from this
//! machine's files, no base image and no registry: the release binary, the
//! shared libraries it links (from `ldd`, as Debian ships them) and the CA
//! certificates OTLP over https needs. No shell, no package manager, no
//! compiler: nothing the daemon does not run.
//!
//! Written as an OCI archive (`oci.rs`) with its SBOM beside it (`sbom.rs`),
//! and loaded into podman's storage where podman is installed.
//! Reproducible: file times are the commit's, owners root, entries sorted,
//! so the same commit built with the same toolchains gives the same
//! archive.
mod oci;
mod sbom;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Args;

use crate::{run_cmd, workspace_root};

#[derive(Args)]
pub struct Options {
    /// Only put the image's files into DIR (what deploy/Dockerfile copies
    /// into its `FROM scratch` stage), no archive.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// Build at the lowest CPU priority (`cargo xtask test`: beside the
    /// kernel matrix's guests, which are the run's longest part).
    #[arg(skip)]
    pub in_background: bool,
}

/// The image's name without its tag; tagged with the version and the commit.
pub const NAME: &str = "localhost/observer";

/// Where the binary sits in the image; the entrypoint.
pub const BINARY: &str = "/usr/local/bin/observer";

/// What the container runs when the DaemonSet gives no arguments.
pub const DEFAULT_ARGS: [&str; 3] = ["run", "--config", "/etc/observer/observer.toml"];

/// The image's port (`--prometheus-listen` in deploy/kubernetes).
pub const METRICS_PORT: u16 = 9464;

/// The CA bundle Debian's ca-certificates installs, where rustls's
/// native-certs loader looks first.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// One file of the image: where it goes, where it comes from, its mode.
pub struct ImageFile {
    pub path: String,
    pub source: PathBuf,
    pub mode: u32,
    /// The Debian package that made it, where none installed it (the CA
    /// bundle, which ca-certificates' update-ca-certificates writes).
    pub made_by: Option<&'static str>,
}

/// The archive and SBOM written; returns the archive's path.
pub fn run(opts: &Options) -> Result<PathBuf> {
    let binary = build_release(opts.in_background)?;
    let files = files(&binary)?;
    if let Some(dir) = &opts.rootfs {
        write_rootfs(&files, dir)?;
        println!("image: the image's files are in {}", dir.display());
        return Ok(dir.clone());
    }
    let version = env!("CARGO_PKG_VERSION");
    let commit = commit()?;
    let epoch = source_date_epoch()?;
    let tags = [format!("{NAME}:{version}"), format!("{NAME}:{commit}")];
    let out = workspace_root().join("target/image");
    std::fs::create_dir_all(&out)?;
    let archive = out.join("observer.oci.tar");
    let written = oci::write(&oci::Image { files: &files, tags: &tags, version, commit: &commit, epoch }, &archive)?;
    let sbom_path = out.join("observer.spdx.json");
    sbom::write(&files, version, &commit, epoch, &written.manifest_digest, &sbom_path)?;
    println!(
        "image: {} ({} as {}; layer {:.1} MiB compressed, {:.1} MiB unpacked), SBOM {}",
        archive.display(),
        written.manifest_digest,
        tags.join(", "),
        written.layer_size as f64 / 1048576.0,
        written.unpacked_size as f64 / 1048576.0,
        sbom_path.display()
    );
    if crate::which("podman").is_some() {
        run_cmd(Command::new("podman").arg("load").arg("-i").arg(&archive))
            .context("podman could not load the image (the archive is still there)")?;
    } else {
        println!("image: no podman here: load it with `docker load -i {}`", archive.display());
    }
    Ok(archive)
}

/// The release binary, built as `cargo xtask build --release` builds it
/// (the pinned toolchains, the committed Cargo.lock), nothing else set up.
fn build_release(in_background: bool) -> Result<PathBuf> {
    crate::build::build(&crate::build::Options { release: true }, in_background)
}

/// The binary, its shared libraries and the CA bundle.
fn files(binary: &Path) -> Result<Vec<ImageFile>> {
    let mut files = vec![ImageFile { path: BINARY.into(), source: binary.to_path_buf(), mode: 0o755, made_by: None }];
    for lib in shared_libraries(binary)? {
        let source =
            std::fs::canonicalize(&lib).with_context(|| format!("{} (a library of observer)", lib.display()))?;
        files.push(ImageFile { path: lib.display().to_string(), source, mode: 0o755, made_by: None });
    }
    ensure!(
        Path::new(CA_BUNDLE).exists(),
        "{CA_BUNDLE} is missing: install the CA certificates (apt-get install ca-certificates)"
    );
    files.push(ImageFile {
        path: CA_BUNDLE.into(),
        source: CA_BUNDLE.into(),
        mode: 0o644,
        made_by: Some("ca-certificates"),
    });
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The libraries the dynamic loader maps for `binary`, the loader itself
/// included, at the paths it finds them (`ldd`'s answer).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output().context("cannot run ldd (package libc-bin)")?;
    ensure!(out.status.success(), "ldd {}: {}", binary.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout)?;
    let libs = parse_ldd(&text);
    ensure!(!libs.is_empty(), "ldd found no libraries for {}:\n{text}", binary.display());
    Ok(libs)
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x...)`; the vDSO has no file.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once(" => ") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn write_rootfs(files: &[ImageFile], dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for f in files {
        let to = dir.join(f.path.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("a file path has a parent"))?;
        std::fs::copy(&f.source, &to).with_context(|| format!("copy {} to {}", f.source.display(), to.display()))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(f.mode))?;
    }
    Ok(())
}

/// The commit the image is built from (12 hex digits), `-dirty` when the
/// work tree has changes the commit does not.
fn commit() -> Result<String> {
    let git = |args: &[&str]| -> Result<String> {
        let out = Command::new("git").current_dir(workspace_root()).args(args).output().context("cannot run git")?;
        ensure!(out.status.success(), "git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok(if dirty { format!("{commit}-dirty") } else { commit })
}

/// The image's time: SOURCE_DATE_EPOCH if set (reproducible-builds.org),
/// else the commit's.
fn source_date_epoch() -> Result<u64> {
    if let Ok(s) = std::env::var("SOURCE_DATE_EPOCH") {
        return s.parse().with_context(|| format!("SOURCE_DATE_EPOCH={s} is not a number of seconds"));
    }
    let out = Command::new("git").current_dir(workspace_root()).args(["log", "-1", "--format=%ct"]).output()?;
    let text = String::from_utf8(out.stdout)?;
    match text.trim().parse() {
        Ok(t) if out.status.success() => Ok(t),
        _ => bail!("no commit time (git log): set SOURCE_DATE_EPOCH"),
    }
}

/// RFC 3339 UTC of seconds since the epoch.
pub fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_every_library_with_a_file() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        let libs: Vec<String> = parse_ldd(text).iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            libs,
            ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
        );
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_124_153), "2026-12-01T11:22:33Z");
    }
}
