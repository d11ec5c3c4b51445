//! The kernel matrix: boot stock distribution kernels under virtme-ng and
//! run the kernel tests inside, once per attach mode, so the preferred
//! modes (fentry/fexit, kprobes), which our CI host kernel refuses, are
//! tested too. Everything is fetched once and cached under target/.
//!
//! The guest sees the host's filesystem (9p), so the test binaries built
//! here run there unchanged (from a snapshot in target/vm/bin); only the
//! kernel differs.
use std::{
    fs,
    io::{BufRead as _, BufReader, Read},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{run_cmd, setup, timing::BinaryTime, workspace_root};

mod kernel_fault;
mod queue;

pub use queue::Queue;

/// virtme-ng version (PyPI), pinned.
const VIRTME_NG: &str = "1.42";

/// Kernel series of the matrix: Debian's stock kernels, newest build of
/// each series in the archive (cached once fetched). 5.10, the oldest many
/// nodes still run (Debian 11, Amazon Linux 2), comes from Debian 11's
/// archive, read through a private apt state (`Bullseye`).
///
/// Each runs `auto` (trampolines); forced `kprobe` runs at both ends,
/// which bracket what differs for kprobes between kernels: 5.10's
/// kretprobes predate rethook and its kernel skips kprobe runs silently,
/// 6.12 counts them (6.7+). 6.1 sits between (rethook, uncounted), and its
/// `auto` already puts the listen-overflow hooks on kprobes: a forced
/// kprobe run there would repeat the others for ~5 min of emulation.
const SERIES: &[Series] = &[
    Series {
        name: "5.10",
        prefix: "linux-image-5.10.0-",
        suffix: "-amd64-unsigned",
        archive: Some(Bullseye),
        modes: &["auto", "kprobe"],
    },
    Series { name: "6.1", prefix: "linux-image-6.1.0-", suffix: "-amd64-unsigned", archive: None, modes: &["auto"] },
    Series {
        name: "6.12",
        prefix: "linux-image-6.12.",
        suffix: "+deb12-amd64-unsigned",
        archive: None,
        modes: &["auto", "kprobe"],
    },
];

struct Series {
    name: &'static str,
    /// The kernel package's name around its build number.
    prefix: &'static str,
    suffix: &'static str,
    /// Another archive than the host's apt sources.
    archive: Option<Bullseye>,
    /// The attach modes its guests (one a mode) run the kernel tests in,
    /// the first first: the preferred ones, which the CI host kernel refuses (its
    /// own run covers the tracepoint fallbacks). `auto` puts every hook on
    /// trampolines (fentry/fexit) where this kernel's take its functions,
    /// and says where they do not (Debian's 6.1 cannot trace
    /// tcp_v4_syn_recv_sock: kprobes count overflows there); attach_modes
    /// checks that it did (OBSERVER_TEST_TRAMPOLINES).
    modes: &'static [&'static str],
}

/// Debian 11 (bullseye) and its security archive, for its 5.10 kernels
/// only: apt runs with its own sources and state under target/vm, so the
/// host's sources and package lists stay as they are.
#[derive(Clone, Copy)]
struct Bullseye;

impl Bullseye {
    const SOURCES: &str = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                           http://deb.debian.org/debian bullseye main\n\
                           deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                           http://deb.debian.org/debian-security bullseye-security main\n";

    /// apt options for this archive alone; its lists fetched once.
    fn apt_options(self) -> Result<Vec<String>> {
        let dir = vm_dir().join("apt-bullseye");
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        fs::write(dir.join("sources.list"), Self::SOURCES)?;
        let options: Vec<String> = [
            format!("Dir::Etc::SourceList={}", dir.join("sources.list").display()),
            "Dir::Etc::SourceParts=/dev/null".into(),
            format!("Dir::State::Lists={}", dir.join("lists").display()),
            format!("Dir::Cache={}", dir.join("cache").display()),
            "Dir::State::status=/dev/null".into(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect();
        if !dir.join("lists").read_dir()?.flatten().any(|e| e.file_name().to_string_lossy().contains("bullseye")) {
            println!("vm: reading Debian 11's package lists (for its 5.10 kernels) into {}", dir.display());
            run_cmd(setup::apt_get().args(&options).args(["update", "-qq"]))?;
        }
        Ok(options)
    }
}

/// The test binaries that exercise the kernel side. The daemon and CLI
/// tests do not depend on the attach mode and stay on the host: software
/// emulation makes every second in the guest count. The longer first (2-3
/// minutes in a guest down to ~15 s): guests take them in this order, so
/// that two guests sharing a kernel's runs (`Queue`) end close together.
pub const KERNEL_TESTS: &[&str] = &[
    "connections",
    "trace",
    "listen_overflow",
    "time_wait",
    "connection_times",
    "connects_accepts",
    "attach_modes",
    "scanner",
    "port_exhaustion",
    "connection_ends",
];

/// The kernel tests run in the first mode only, as a second run would
/// repeat the first under emulation: `attach_modes` forces each mode
/// itself (it never reads OBSERVER_TEST_ATTACH_MODE; ~1 min a kernel);
/// `connections` tests the open-connection ledger and `connection_times`
/// lifetimes and handshakes, which the tp_btf program of every mode keeps,
/// while the kprobe wrappers that record a socket's owner for it are
/// tested by `connects_accepts`, `time_wait` and `trace` (~3 min a kernel);
/// `connection_ends` tests that tp_btf program's path when its map is full.
const FIRST_MODE_ONLY_TESTS: &[&str] = &["attach_modes", "connections", "connection_times", "connection_ends"];

/// Single tests of the other binaries run in the first mode only: what
/// they test is the daemon's or the CLI's own logic, which no attach mode
/// changes, while what their kernel part needs of the mode's programs is
/// asserted in that mode by the binary's other tests. The checks against
/// the kernel's counts (a burst before a namespace's first check, misses
/// injected by failpoint, a namespace gone from some sweeps) count from
/// the programs' per-namespace totals (so does the churn beside other
/// daemons coming and going), whose exactness in each mode
/// `drops_equal_listen_overflows_and_are_charged_to_the_owner`,
/// `client_first_close_is_charged_to_the_client` and
/// `no_time_wait_entry_is_lost_under_full_speed_churn` assert; the
/// trace's filters and its closed pipe act on events whose delivery in
/// each mode the trace's other tests assert. 41-52 s of a kprobe guest's
/// 241-278 under emulation here.
const FIRST_MODE_ONLY_CASES: &[(&str, &[&str])] = &[
    (
        "listen_overflow",
        &[
            "overflows_before_a_namespaces_first_check_do_not_hide_later_misses",
            "overflows_the_programs_missed_are_counted_as_unseen",
            "a_namespace_missing_from_some_sweeps_does_not_count_its_drops_twice",
        ],
    ),
    (
        "time_wait",
        &[
            "entries_seen_before_a_namespaces_first_check_do_not_hide_later_misses",
            "time_wait_entries_the_programs_missed_are_counted_as_unseen",
            "entries_lost_while_another_tool_attaches_are_counted_as_unseen",
        ],
    ),
    ("trace", &["filters_keep_what_they_name_and_nothing_else", "a_reader_that_goes_away_ends_the_trace_quietly"]),
];

/// That each case FIRST_MODE_ONLY_CASES names for test binary `name` is
/// one of its tests (a renamed test would otherwise run in every mode
/// unnoticed, its old name skipping nothing).
fn cases_exist(name: &str, bin: &Path) -> Result<()> {
    let Some((_, cases)) = FIRST_MODE_ONLY_CASES.iter().find(|(binary, _)| *binary == name) else {
        return Ok(());
    };
    let out = Command::new(bin).args(["--list", "--format", "terse"]).output()?;
    anyhow::ensure!(out.status.success(), "listing the tests of {name} failed");
    let listed = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = listed.lines().filter_map(|l| l.strip_suffix(": test")).collect();
    for case in *cases {
        anyhow::ensure!(listed.contains(case), "FIRST_MODE_ONLY_CASES names {case}, which {name} has no test of");
    }
    Ok(())
}

/// libtest's arguments that leave out of `run` the cases it runs in the
/// first mode only (FIRST_MODE_ONLY_CASES).
fn skipped_in(run: &Run, first_mode: &str) -> String {
    if run.mode == first_mode {
        return String::new();
    }
    let cases = FIRST_MODE_ONLY_CASES.iter().filter(|(binary, _)| *binary == run.name).flat_map(|(_, cases)| *cases);
    let skips: Vec<String> = cases.map(|case| format!(" --skip {case}")).collect();
    if skips.is_empty() { String::new() } else { format!("{} --exact", skips.concat()) }
}

pub fn vm_dir() -> PathBuf {
    workspace_root().join("target/vm")
}

#[derive(Clone)]
pub struct Kernel {
    pub series: &'static str,
    pub version: String,
    pub vmlinuz: PathBuf,
    /// The attach modes the kernel tests run in there (`Series::modes`,
    /// or those of them a run asked for; one, where each mode boots a
    /// guest of its own).
    pub modes: Vec<&'static str>,
    /// The series' first mode, which also runs FIRST_MODE_ONLY_TESTS.
    pub first_mode: &'static str,
}

impl Kernel {
    /// What its guest's files are named by: the series and its modes.
    pub fn unit(&self) -> String {
        std::iter::once(self.series).chain(self.modes.iter().copied()).collect::<Vec<_>>().join("-")
    }
}

/// Install qemu, virtme-ng and the kernels (those of the series in `only`,
/// if any); idempotent.
pub fn setup(only: &[String]) -> Result<Vec<Kernel>> {
    for name in only {
        anyhow::ensure!(
            SERIES.iter().any(|series| series.name == name),
            "no kernel series {name} in the matrix; it has {}",
            SERIES.iter().map(|series| series.name).collect::<Vec<_>>().join(", ")
        );
    }
    // virtme-ng needs a statically linked busybox for its initramfs, and
    // a venv (this runs beside the host's set-up, which may not have
    // installed python3-venv yet).
    setup::apt_install_packages(&["qemu-system-x86", "kmod", "busybox-static", "python3-venv"])?;
    let venv = setup::tools_dir().join("vm-venv");
    let vng_ok = Command::new(venv.join("bin/vng"))
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(VIRTME_NG));
    if !vng_ok {
        println!("vm: installing virtme-ng {VIRTME_NG} into {}", venv.display());
        run_cmd(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run_cmd(Command::new(venv.join("bin/pip")).args(["install", "-q", &format!("virtme-ng=={VIRTME_NG}")]))
            .context("pip install virtme-ng failed (no network to PyPI?)")?;
    }
    SERIES.iter().filter(|series| only.is_empty() || only.iter().any(|o| o == series.name)).map(fetch_kernel).collect()
}

fn fetch_kernel(&Series { name: series, prefix, suffix, archive, modes }: &Series) -> Result<Kernel> {
    let dir = vm_dir();
    fs::create_dir_all(&dir)?;
    // Reuse a kernel fetched before, so runs are cached and repeatable.
    let cached = fs::read_dir(&dir)?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .find(|n| n.starts_with(&format!("kernel-{series}-")));
    let version = match cached {
        Some(name) => name.trim_start_matches(&format!("kernel-{series}-")).to_string(),
        None => {
            let apt_options = archive.map(Bullseye::apt_options).transpose()?.unwrap_or_default();
            let package = newest_package(prefix, suffix, &apt_options)?;
            println!("vm: fetching {package}");
            run_cmd(setup::apt_get().current_dir(&dir).args(&apt_options).args(["download", "-q", &package]))?;
            let deb = fs::read_dir(&dir)?
                .flatten()
                .map(|e| e.path())
                .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_"))))
                .context("downloaded .deb not found")?;
            let tmp = dir.join(format!("extract-{series}"));
            let _ = fs::remove_dir_all(&tmp);
            run_cmd(Command::new("dpkg").arg("-x").arg(&deb).arg(&tmp))?;
            let version = fs::read_dir(tmp.join("lib/modules"))?
                .flatten()
                .next()
                .context("no modules in the kernel package")?
                .file_name()
                .to_string_lossy()
                .into_owned();
            fs::rename(&tmp, dir.join(format!("kernel-{series}-{version}")))?;
            let _ = fs::remove_file(&deb);
            version
        }
    };
    let root = dir.join(format!("kernel-{series}-{version}"));
    // virtme-ng boots over the host's filesystem and loads modules (9p,
    // virtio) from /lib/modules/<version> there.
    let modules = Path::new("/lib/modules").join(&version);
    let ours = root.join("lib/modules").join(&version);
    let is_dir = fs::symlink_metadata(&modules).is_ok_and(|m| m.is_dir());
    if !is_dir && fs::read_link(&modules).ok().as_deref() != Some(ours.as_path()) {
        // Missing, or a link to an older extraction: (re)link ours. A real
        // directory (the kernel installed by the distribution) is left alone.
        fs::create_dir_all("/lib/modules")?;
        let _ = fs::remove_file(&modules);
        std::os::unix::fs::symlink(&ours, &modules).with_context(|| format!("cannot link {}", modules.display()))?;
    }
    Ok(Kernel {
        series,
        vmlinuz: root.join(format!("boot/vmlinuz-{version}")),
        version,
        modes: modes.to_vec(),
        first_mode: modes[0],
    })
}

/// The newest `prefix<N...>suffix` package apt knows (with `options`).
fn newest_package(prefix: &str, suffix: &str, options: &[String]) -> Result<String> {
    let out = Command::new("apt-cache")
        .args(options)
        .args(["search", "--names-only", &format!("^{}", prefix.replace('.', "\\."))])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found: Vec<(u32, String)> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|name| {
            let middle = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            Some((middle.parse().ok()?, name.to_string()))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, name)) => Ok(name),
        None => bail!("apt knows no {prefix}*{suffix} (run apt-get update?)"),
    }
}

/// What the guest runs: a private copy of the kernel test binaries, the
/// daemon and the churn generator, taken when the matrix starts, so that
/// building on the host while the (slow) guests run cannot change what they
/// execute halfway through.
pub struct GuestBinaries {
    pub tests: Vec<(String, PathBuf)>,
    pub observer: PathBuf,
    pub churn: PathBuf,
}

/// Build the observer package's tests and binaries and snapshot the kernel
/// tests among them (those named in `only`, if any) into target/vm/bin.
pub fn guest_binaries(nightly: &str, only: &[String]) -> Result<GuestBinaries> {
    for name in only {
        anyhow::ensure!(
            KERNEL_TESTS.contains(&name.as_str()),
            "{name} is not a kernel test; the matrix runs {}",
            KERNEL_TESTS.join(", ")
        );
    }
    // The kernel tests only (and the daemon, which they run): the guests
    // start as soon as these are built, the host's other test binaries are
    // built beside them.
    let wanted: Vec<&str> =
        if only.is_empty() { KERNEL_TESTS.to_vec() } else { only.iter().map(String::as_str).collect() };
    let out = crate::test::cargo_test(nightly)
        .args(["--no-run", "--message-format=json"])
        .args(wanted.iter().flat_map(|name| ["--test", name]))
        .output()?;
    anyhow::ensure!(out.status.success(), "building the tests failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let snapshot = vm_dir().join("bin");
    let _ = fs::remove_dir_all(&snapshot);
    fs::create_dir_all(&snapshot)?;
    let copy = |exe: &str, name: &str| -> Result<PathBuf> {
        let to = snapshot.join(name);
        fs::copy(exe, &to).with_context(|| format!("copying {exe} to {}", to.display()))?;
        Ok(to)
    };
    let (mut tests, mut observer) = (Vec::new(), None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(exe) = msg["executable"].as_str() else { continue };
        let kind = |k: &str| msg["target"]["kind"].as_array().is_some_and(|ks| ks.iter().any(|x| x == k));
        let name = msg["target"]["name"].as_str().unwrap_or("?");
        // `cargo test` also builds each binary as its own unit-test harness.
        let program = kind("bin") && msg["profile"]["test"] == false;
        match name {
            "observer" if program => observer = Some(copy(exe, name)?),
            _ if kind("test")
                && KERNEL_TESTS.contains(&name)
                && (only.is_empty() || only.iter().any(|o| o == name)) =>
            {
                tests.push((name.to_string(), copy(exe, name)?))
            }
            _ => {}
        }
    }
    // In KERNEL_TESTS' order (the longer first), not cargo's.
    tests.sort_by_key(|(name, _)| KERNEL_TESTS.iter().position(|t| t == name));
    for (name, bin) in &tests {
        cases_exist(name, bin)?;
    }
    Ok(GuestBinaries {
        tests,
        observer: observer.context("cargo built no observer binary")?,
        churn: copy(crate::build::churn(false)?.to_str().context("path")?, "observer-churn")?,
    })
}

/// One test binary in one attach mode.
#[derive(Clone)]
struct Run<'a> {
    mode: &'static str,
    name: &'a str,
    bin: &'a Path,
}

/// Boot guest number `instance` of `kernel`'s unit (one mode), which
/// takes that unit's runs from `queue` until none is left.
///
/// A guest whose kernel failed (kernel_fault.rs: a lockup, an oops) is
/// stopped then, and the runs it took and had not ended go back into the
/// queue for another guest: every test still runs to its end on that
/// kernel, once, and the report says the guest's kernel failed, with the
/// kernel's own words. A second failure of the unit's kernel, or any
/// failed test, fails it.
pub fn run_guest(kernel: &Kernel, bins: &GuestBinaries, queue: &Queue, instance: u32) -> Result<KernelRun> {
    anyhow::ensure!(kernel.modes.len() == 1, "a guest runs one mode's tests (the queue's units): {:?}", kernel.modes);
    let runs = runs_of(&kernel.modes, kernel.first_mode, &bins.tests);
    let boot = boot_for(kernel, bins, &runs, queue, instance)?;
    let times = binary_times(kernel.series, &boot.report);
    let Some(fault) = &boot.fault else {
        return Ok(KernelRun { summary: boot.summary, ok: boot.ok, times, kernel_failed: false });
    };
    let (unended, failed_before) = unended(&boot.report);
    let given_back = queue.give_back(&kernel.unit(), &unended)?;
    let summary = format!(
        "{}MATRIX kernel-failed kernel={}: the guest was stopped; {} of the runs it took had not ended{}. \
         The kernel's report:\n{fault}\n",
        boot.summary,
        kernel.version,
        unended.len(),
        if given_back {
            ", given back to the queue".to_string()
        } else {
            format!(
                " and fail: one met a failed kernel before, or the matrix is past the {} kernel failures it re-runs",
                queue::KERNEL_FAILURES_RERUN
            )
        },
    );
    Ok(KernelRun { summary, ok: !failed_before && (given_back || unended.is_empty()), times, kernel_failed: true })
}

/// What the matrix ran on one kernel: its report, whether every test
/// passed, and each test binary's wall time.
pub struct KernelRun {
    pub summary: String,
    pub ok: bool,
    pub times: Vec<BinaryTime>,
    /// Its kernel failed in the first boot (an oops, a lockup: under
    /// emulation, at a patched kernel site), so it was booted again.
    pub kernel_failed: bool,
}

/// The tests a unit (a kernel in one mode) runs, by name.
pub fn runs_of_unit(unit: &Kernel, bins: &GuestBinaries) -> Vec<String> {
    runs_of(&unit.modes, unit.first_mode, &bins.tests).iter().map(|run| run.name.to_string()).collect()
}

/// Each test binary in each of `modes`, but those of FIRST_MODE_ONLY_TESTS
/// in the series' `first_mode` only.
fn runs_of<'a>(modes: &[&'static str], first_mode: &'static str, tests: &'a [(String, PathBuf)]) -> Vec<Run<'a>> {
    modes
        .iter()
        .flat_map(|&mode| {
            tests
                .iter()
                .filter(move |(name, _)| mode == first_mode || !FIRST_MODE_ONLY_TESTS.contains(&name.as_str()))
                .map(move |(name, bin)| Run { mode, name, bin })
        })
        .collect()
}

/// The tests a guest's `report` says it took (`MATRIX took mode=M NAME`)
/// and has no result for (the one it was stopped in), and whether it says
/// any failed (a test, or the daemon's attach check): a failed test is not
/// run again, its verdict stands.
fn unended(report: &[String]) -> (Vec<String>, bool) {
    let results: Vec<_> = report.iter().filter_map(|line| test_result(line)).collect();
    let failed = results.iter().any(|&(_, _, passed)| !passed)
        || report.iter().any(|line| line.starts_with("MATRIX attach-failed"));
    let unended = report
        .iter()
        .filter_map(|line| line.strip_prefix("MATRIX took mode=")?.split_once(' '))
        .filter(|&(mode, name)| !results.iter().any(|&(m, n, _)| (m, n) == (mode, name)))
        .map(|(_, name)| name.to_string())
        .collect();
    (unended, failed)
}

/// The mode, test and verdict of a `MATRIX test mode=M NAME rc=N ...` line.
fn test_result(line: &str) -> Option<(&str, &str, bool)> {
    let mut words = line.strip_prefix("MATRIX test mode=")?.split_whitespace();
    let (mode, name, rc) = (words.next()?, words.next()?, words.next()?);
    Some((mode, name, rc == "rc=0"))
}

/// Each test binary's wall time in a guest of `series`, from its report's
/// `MATRIX test mode=M NAME rc=N secs=S [test result: ...] [retried ...]`
/// lines (its retry included).
fn binary_times(series: &str, report: &[String]) -> Vec<BinaryTime> {
    report
        .iter()
        .filter_map(|line| {
            let (mode, name, passed) = test_result(line)?;
            let secs = line.split_whitespace().find_map(|w| w.strip_prefix("secs="))?.parse().ok()?;
            let outcome = match (passed, line.contains("retried after")) {
                (true, false) => "ok",
                (true, true) => "retried",
                (false, _) if line.contains("test result") => "FAILED",
                (false, _) => "died",
            };
            Some(BinaryTime {
                place: format!("{series}/{mode}"),
                binary: name.to_string(),
                wall: Duration::from_secs(secs),
                outcome,
            })
        })
        .collect()
}

/// What one boot of a guest left: its summary for the report, the lines
/// its script wrote, whether all passed, and its kernel's report if it
/// failed.
struct Boot {
    summary: String,
    report: Vec<String>,
    ok: bool,
    fault: Option<String>,
}

/// Boot `kernel` once, as guest `instance` of its unit, and run those of
/// `runs` it takes from `queue`; its files are named
/// target/vm/guest-<series>-<mode>-<instance>.sh, out-..., console-....
fn boot_for(kernel: &Kernel, bins: &GuestBinaries, runs: &[Run], queue: &Queue, instance: u32) -> Result<Boot> {
    let unit = kernel.unit();
    let guest = format!("{unit}-{instance}");
    let script = vm_dir().join(format!("guest-{guest}.sh"));
    // Shared read-write with the guest: progress and logs can be followed
    // from the host while the (slow) guest runs.
    let out_dir = vm_dir().join(format!("out-{guest}"));
    let _ = fs::remove_dir_all(&out_dir);
    fs::create_dir_all(&out_dir)?;
    let mut s = format!(
        "#!/bin/sh\n# Generated by cargo xtask test; runs inside the guest.\nfail=0\nout={}\n\
         exec > $out/progress.log 2>&1\necho \"MATRIX guest {guest} kernel=$(uname -r)\"\n",
        out_dir.display()
    );
    for mode in kernel.modes.iter().filter(|mode| runs.iter().any(|run| run.mode == **mode)) {
        // What attached, checked by a daemon before the mode's first run
        // (not in a guest that finds every run taken).
        s.push_str(&format!(
            "attach_check_{mode}() {{\n\
             echo \"MATRIX mode={mode} kernel=$(uname -r)\"\n\
             {obs} run --attach-mode {mode} --prometheus-listen 127.0.0.1:0 >$out/observer-{mode}.log 2>&1 & p=$!\n\
             for i in $(seq 300); do grep -q serving $out/observer-{mode}.log && break; kill -0 $p 2>/dev/null || break; sleep 1; done\n\
             kill -INT $p 2>/dev/null\n\
             for i in $(seq 30); do kill -0 $p 2>/dev/null || break; sleep 1; done\n\
             kill -0 $p 2>/dev/null && {{ echo \"MATRIX shutdown-slow mode={mode}: observer still running 30 s after SIGINT\"; kill -9 $p; }}\n\
             wait $p\n\
             grep ' attached ' $out/observer-{mode}.log | grep -o 'hook=\"[a-z_]*\" mode=[a-z_]*' | sed 's/^/MATRIX attached /'\n\
             grep -q serving $out/observer-{mode}.log || {{ echo \"MATRIX attach-failed mode={mode}\"; tail -3 $out/observer-{mode}.log; fail=1; }}\n\
             }}\nchecked_{mode}=\n",
            obs = bins.observer.display()
        ));
        for run @ Run { name, bin, .. } in runs.iter().filter(|run| run.mode == *mode) {
            // One test at a time: each test loads its own probes, and
            // attaching or detaching an fexit program rebuilds the
            // function's BPF trampoline, which makes the kernel skip the
            // fexit programs of calls sleeping in that function at the time
            // (a parallel test's server blocked in accept(): a lost accept
            // that production does not see from observer itself).
            //
            // A failure while the kernel reported skipped runs of our
            // programs (recursion protection, which software emulation's
            // slow programs make far likelier: see probes/stats.rs), or
            // on a kernel that skips some of them silently (kprobes and
            // tracepoints before 6.7, trampolines before 5.12: the test
            // says so, as it cannot tell), is retried once, and the
            // report says why; any other failure, or a second one, fails.
            //
            // Each test's time is in its log (libtest's --report-time,
            // unstable: RUSTC_BOOTSTRAP lets the stable build's test
            // harness take it), for whoever trims the matrix's time.
            // The VM kernels have the netem qdisc this host's lacks: the
            // tests that need it must run there (OBSERVER_TEST_NETEM).
            s.push_str(&format!(
                "if {take}; then\n\
                 echo \"MATRIX took mode={mode} {name}\"\n\
                 [ -n \"$checked_{mode}\" ] || {{ attach_check_{mode}; checked_{mode}=1; }}\n\
                 log=$out/{name}-{mode}.log; retried=; t0=$(date +%s)\n\
                 {env} {bin} {args} >$log 2>&1; rc=$?\n\
                 if [ $rc != 0 ] && grep -qE 'OBSERVER_KERNEL_MISSED=[1-9]|OBSERVER_KERNEL_SKIPS_UNCOUNTED' $log; then\n\
                   mv $log $log.first; retried=\"retried after kernel-skipped runs: $(grep -oE 'OBSERVER_KERNEL_MISSED=[1-9].*|OBSERVER_KERNEL_SKIPS_UNCOUNTED.*' $log.first | head -1)\"\n\
                   {env} {bin} {args} >$log 2>&1; rc=$?\n\
                   grep -A 8 panicked $log.first | head -20 | sed 's/^/MATRIX first run: /'\n\
                 fi\n\
                 echo \"MATRIX test mode={mode} {name} rc=$rc secs=$(( $(date +%s) - t0 )) $(grep '^test result' $log | tail -1) $retried\"\n\
                 [ $rc = 0 ] || {{ fail=1; grep -A 60 -E 'panicked|OBSERVER_KERNEL_MISSED|OBSERVER_KERNEL_SKIPS_UNCOUNTED' $log | head -150; }}\n\
                 fi\n",
                take = queue.take_command(&unit, name),
                bin = bin.display(),
                env = format!(
                    "OBSERVER_TEST_ATTACH_MODE={mode} OBSERVER_TEST_TRAMPOLINES=1 OBSERVER_TEST_NETEM=1 \
                     OBSERVER_CHURN={} RUSTC_BOOTSTRAP=1",
                    bins.churn.display()
                ),
                args = format!(
                    "--test-threads=1 -Zunstable-options --report-time{}",
                    skipped_in(run, kernel.first_mode)
                ),
            ));
        }
    }
    s.push_str("echo \"MATRIX exit $fail\"\nexit $fail\n");
    fs::write(&script, s)?;
    run_cmd(Command::new("chmod").arg("+x").arg(&script))?;

    println!("vm: booting {} (guest {guest}) under virtme-ng, software emulation", kernel.version);
    let started = Instant::now();
    // A hang guard only: a guest's whole run takes ~8-13 min under
    // emulation (its connections binary alone ~2 min).
    let Guest { console, exit, fault } = boot(kernel, &script, &[&out_dir, queue.dir()], 2400)?;
    fs::write(vm_dir().join(format!("console-{guest}.log")), &console)?;
    let progress = fs::read_to_string(out_dir.join("progress.log")).unwrap_or_default();
    // The guest writes only the MATRIX lines and the excerpts of failed
    // tests (panic messages with their diagnostics) there: all of it is
    // the report.
    let report: Vec<String> = progress.lines().map(str::to_string).collect();
    // A guest that found every run taken passes with none: that every run
    // ran is the matrix's check (`guests`).
    let ok = exit == Some(0) && report.iter().any(|l| l == "MATRIX exit 0");
    let mut summary = format!(
        "== kernel {} (guest {guest}), {:.0?}: {}\n{}\n",
        kernel.version,
        started.elapsed(),
        if ok {
            "PASS"
        } else if fault.is_some() {
            "KERNEL FAILED"
        } else {
            "FAIL"
        },
        report.join("\n")
    );
    if !report.iter().any(|l| l.starts_with("MATRIX exit")) {
        // The guest died or hung mid-test (a panic, an OOM, the timeout):
        // CI keeps only what is printed, so print why.
        summary.push_str(&ended_early(exit, &console, &out_dir));
    }
    Ok(Boot { summary, report, ok, fault })
}

/// What a guest that never reached its script's end left behind: its exit
/// code, the console's last lines and those of the test log written last.
fn ended_early(exit: Option<i32>, console: &str, out_dir: &Path) -> String {
    let tail = |text: &str, n: usize| {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    };
    let mut s = format!(
        "MATRIX ended-early: the guest script stopped before its end (exit code {exit:?}); the console's last lines:\n{}\n",
        tail(console, 40)
    );
    let newest_log = fs::read_dir(out_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name() != "progress.log")
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    if let Some((_, log)) = newest_log {
        let text = fs::read_to_string(&log).unwrap_or_default();
        s.push_str(&format!("MATRIX ended-early: the last lines of {}:\n{}\n", log.display(), tail(&text, 30)));
    }
    s
}

/// What a guest left: its console, its script's exit code (None if the
/// script never ended) and, if its kernel failed, the kernel's report.
pub struct Guest {
    pub console: String,
    pub exit: Option<i32>,
    pub fault: Option<String>,
}

/// Boot `kernel` under virtme-ng, run `script` in it with `rw_dirs` shared
/// read-write, and return what it left. A guest whose kernel failed
/// (kernel_fault.rs) is stopped as soon as the console says so; any other
/// that hangs is killed after `timeout_secs`: it fails the run rather
/// than blocking it.
pub fn boot(kernel: &Kernel, script: &Path, rw_dirs: &[&Path], timeout_secs: u32) -> Result<Guest> {
    let venv_bin = setup::tools_dir().join("vm-venv/bin");
    let path = format!("{}:{}", venv_bin.display(), std::env::var("PATH").unwrap_or_default());
    // `timeout` runs vng in a process group of its own and, on the
    // deadline or on our SIGTERM, signals the whole group (qemu too).
    // Niced: the guests run beside the host suite, whose tests keep to
    // time where the guests' (slow under emulation anyway) have slack.
    let mut child = Command::new("nice")
        .args(["-n", "10", "timeout", "--kill-after=30", &timeout_secs.to_string()])
        .arg(venv_bin.join("vng"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("PATH", path)
        .current_dir(workspace_root())
        .arg("--run")
        .arg(&kernel.vmlinuz)
        // Nested KVM hangs on these hosts; TCG boots in ~10-40 s.
        .args(["--disable-kvm", "--force-9p", "--verbose", "--memory", "2G", "--cpus", "2"])
        // Both vCPUs on one host thread (qemu's default for x86 is a thread
        // per vCPU). With a thread each, the emulated 6.1, 6.12 and 5.10
        // kernels failed at code being patched under running callers (a
        // stale int3 at a tracepoint's jump, a lockup at a call into a BPF
        // trampoline; twice in one clean-clone run), where the patching
        // protocol holds on hardware: most likely the other vCPU's thread
        // ran translated code of the bytes being replaced. On one thread a
        // write to code and every vCPU's next look at it are in order, and
        // the matrix's kernel failures are the measure. Not slower: the
        // connections binary in a 6.12 guest took 81-91 s on one thread,
        // 85-102 s on two (three runs each, alternating), as a guest beside
        // another uses about one core anyway.
        .args(["--qemu-opt=-accel", "--qemu-opt=tcg,thread=single"])
        .args(rw_dirs.iter().flat_map(|dir| [std::ffi::OsStr::new("--rwdir"), dir.as_os_str()]))
        .arg("--exec")
        .arg(script)
        .spawn()?;
    // The console as it comes (vng --verbose prints it on stdout, its own
    // messages on stderr), so a kernel failure is seen while the guest
    // still runs.
    let console = Arc::new(Mutex::new(String::new()));
    let readers: Vec<_> = [
        child.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>),
        child.stderr.take().map(|e| Box::new(e) as _),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let console = console.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let mut console = console.lock().unwrap();
                console.push_str(&line);
                console.push('\n');
            }
        })
    })
    .collect();
    let mut stopped = false;
    while child.try_wait()?.is_none() {
        // Every second: a test that runs on after an oops should not get
        // to fail for the kernel's sake before the guest is stopped.
        std::thread::sleep(Duration::from_secs(1));
        if !stopped {
            stopped = kernel_fault::failure(&console.lock().unwrap()).is_some();
            if stopped {
                println!("vm: the {} kernel failed (an oops, a panic or a lockup): stopping the guest", kernel.version);
                let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            }
        }
    }
    for reader in readers {
        let _ = reader.join();
    }
    let console = std::mem::take(&mut *console.lock().unwrap());
    // From the whole console: a panic can end the guest between two looks,
    // and a report's last lines can come after the look that saw it.
    let fault = kernel_fault::failure(&console);
    // vng's own exit status is not the guest's (it can run the script on
    // the console fallback); the guest init prints the script's exit code.
    let exit = console
        .lines()
        .find_map(|l| l.split("script exited with code ").nth(1))
        .and_then(|c| c.trim().parse::<i32>().ok());
    Ok(Guest { console, exit, fault })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_series_runs_its_modes_and_the_first_mode_only_tests_once() {
        let tests: Vec<(String, PathBuf)> =
            KERNEL_TESTS.iter().map(|name| (name.to_string(), PathBuf::from("/bin/true"))).collect();
        let of = |series: &str| {
            let modes = SERIES.iter().find(|s| s.name == series).unwrap().modes;
            runs_of(modes, modes[0], &tests).iter().map(|r| format!("{}/{}", r.mode, r.name)).collect::<Vec<_>>()
        };
        let runs = of("6.12");
        assert_eq!(runs.len(), 2 * KERNEL_TESTS.len() - FIRST_MODE_ONLY_TESTS.len(), "{runs:?}");
        for name in KERNEL_TESTS {
            assert!(runs.contains(&format!("auto/{name}")), "{name} in auto: {runs:?}");
            let in_kprobe = runs.contains(&format!("kprobe/{name}"));
            assert_eq!(in_kprobe, !FIRST_MODE_ONLY_TESTS.contains(name), "{name} in kprobe: {runs:?}");
        }
        assert_eq!(of("5.10"), runs, "the oldest kernel runs what the newest does");
        let runs = of("6.1");
        assert!(runs.iter().all(|r| r.starts_with("auto/")) && runs.len() == KERNEL_TESTS.len(), "{runs:?}");
        // A guest of the kprobe mode alone runs no first-mode-only test.
        let alone = runs_of(&["kprobe"], "auto", &tests);
        assert_eq!(alone.len(), KERNEL_TESTS.len() - FIRST_MODE_ONLY_TESTS.len());
        assert!(alone.iter().all(|r| r.mode == "kprobe" && !FIRST_MODE_ONLY_TESTS.contains(&r.name)));
    }

    #[test]
    fn the_first_mode_only_cases_are_skipped_in_the_other_modes_only() {
        let bin = PathBuf::from("/bin/true");
        let run = |mode, name| Run { mode, name, bin: &bin };
        assert_eq!(skipped_in(&run("auto", "time_wait"), "auto"), "");
        assert_eq!(
            skipped_in(&run("kprobe", "time_wait"), "auto"),
            " --skip entries_seen_before_a_namespaces_first_check_do_not_hide_later_misses \
             --skip time_wait_entries_the_programs_missed_are_counted_as_unseen \
             --skip entries_lost_while_another_tool_attaches_are_counted_as_unseen --exact"
        );
        assert_eq!(skipped_in(&run("kprobe", "port_exhaustion"), "auto"), "", "no case of its left out");
    }

    #[test]
    fn after_a_kernel_failure_the_runs_taken_and_not_ended_are_given_back() {
        let report = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        // Stopped in the middle of trace: time_wait passed, trace never said.
        let (unended_runs, failed) = unended(&report(&[
            "MATRIX guest 6.1-auto-1 kernel=6.1",
            "MATRIX took mode=auto time_wait",
            "MATRIX mode=auto kernel=6.1",
            "MATRIX test mode=auto time_wait rc=0 test result: ok. 4 passed;",
            "MATRIX took mode=auto trace",
        ]));
        assert!(!failed);
        assert_eq!(unended_runs, ["trace"]);
        // A test that failed before the hang fails the kernel; it does not
        // run again (its failure is the verdict, counted once).
        let (unended_runs, failed) = unended(&report(&[
            "MATRIX took mode=auto time_wait",
            "MATRIX test mode=auto time_wait rc=101 test result: FAILED. 3 passed; 1 failed;",
        ]));
        assert!(failed);
        assert!(unended_runs.is_empty());
        let (_, failed) = unended(&report(&["MATRIX attach-failed mode=auto"]));
        assert!(failed);
    }

    #[test]
    fn each_binarys_time_and_outcome_come_from_its_report_line() {
        let report: Vec<String> = [
            "MATRIX mode=auto kernel=6.12.1",
            "MATRIX test mode=auto time_wait rc=0 secs=42 test result: ok. 5 passed; 0 failed;",
            "MATRIX test mode=kprobe trace rc=0 secs=90 test result: ok. 9 passed; retried after kernel-skipped runs: X",
            "MATRIX test mode=kprobe scanner rc=101 secs=7 test result: FAILED. 0 passed; 1 failed;",
            "MATRIX test mode=kprobe connections rc=139 secs=3 ",
        ]
        .map(String::from)
        .to_vec();
        let got: Vec<(String, String, u64, &str)> = binary_times("6.12", &report)
            .into_iter()
            .map(|t| (t.place, t.binary, t.wall.as_secs(), t.outcome))
            .collect();
        let want = [
            ("6.12/auto", "time_wait", 42, "ok"),
            ("6.12/kprobe", "trace", 90, "retried"),
            ("6.12/kprobe", "scanner", 7, "FAILED"),
            ("6.12/kprobe", "connections", 3, "died"),
        ]
        .map(|(p, b, s, o)| (p.to_string(), b.to_string(), s, o));
        assert_eq!(got, want);
    }

    #[test]
    fn a_guest_that_stopped_early_says_why_with_its_console_and_last_test_log() {
        let dir = std::env::temp_dir().join(format!("xtask-ended-early-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("progress.log"), "MATRIX mode=auto\n").unwrap();
        fs::write(dir.join("connections-kprobe.log"), "running 7 tests\ntest a ... ok\n").unwrap();
        let console: String =
            (1..=100).map(|i| format!("line {i}\n")).collect::<String>() + "Kernel panic - not syncing\n";
        let said = ended_early(None, &console, &dir);
        fs::remove_dir_all(&dir).unwrap();
        assert!(said.contains("exit code None"), "{said}");
        assert!(said.contains("Kernel panic - not syncing") && said.contains("line 62") && !said.contains("line 61\n"));
        assert!(said.contains("connections-kprobe.log") && said.contains("test a ... ok"), "{said}");
        assert!(!said.contains("MATRIX mode=auto"), "progress.log is already in the report: {said}");
    }
}
