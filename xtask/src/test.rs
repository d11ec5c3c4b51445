//! `cargo xtask test`: every test, the kernel ones included, on this
//! machine's kernel and then in the kernel matrix (stock kernels in VMs,
//! preferred attach modes). They load real eBPF programs and create network
//! namespaces, so they need root; they never skip.
use std::{path::Path, process::Command};

use anyhow::{Result, bail};
use clap::Args;

use crate::{
    build, image, setup,
    timing::{self, Timings},
    vm, workspace_root,
};

#[derive(Args)]
pub struct Options {
    /// The inner loop: the host suite and the kernel matrix's newest kernel
    /// in `auto` mode only (`--vm-kernels 6.12 --vm-modes auto`): one
    /// guest of the five; CI runs everything.
    #[arg(long, conflicts_with_all = ["host_only", "vm_kernels", "vm_modes"])]
    pub quick: bool,
    /// Skip the kernel matrix (the kernel tests inside VMs of stock Debian
    /// kernels 5.10, 6.1 and 6.12, in auto mode and, on 5.10 and 6.12, in
    /// kprobe mode): a run on this kernel only.
    #[arg(long, conflicts_with = "vm_only")]
    pub host_only: bool,
    /// Run only the kernel matrix.
    #[arg(long)]
    pub vm_only: bool,
    /// Matrix: only these kernel test binaries (e.g. `--vm-tests time_wait`).
    #[arg(long, value_delimiter = ',')]
    pub vm_tests: Vec<String>,
    /// Matrix: only these kernel series (e.g. `--vm-kernels 6.12`).
    #[arg(long, value_delimiter = ',')]
    pub vm_kernels: Vec<String>,
    /// Matrix: only these attach modes of each kernel's (e.g. `--vm-modes
    /// kprobe`); the tests run in one mode only (attach_modes, connections,
    /// connection_times, connection_ends) and single tests of the others
    /// (`FIRST_MODE_ONLY_CASES` in vm.rs) run where a kernel's first mode
    /// (auto) is among them.
    #[arg(long, value_delimiter = ',')]
    pub vm_modes: Vec<String>,
    /// Matrix: how many guests run at once. Two: a guest under software
    /// emulation uses about one of this machine's two cores on average (its
    /// tests mostly wait), and two at once took 28% less time than one
    /// after the other (each ~1.45 times as long).
    #[arg(long, default_value_t = 2)]
    pub vm_guests_at_once: usize,
    /// Extra arguments for `cargo test` (after `--`), e.g. `-- time_wait`.
    #[arg(last = true)]
    pub args: Vec<String>,
}

pub fn run(opts: &Options) -> Result<()> {
    if !setup::nix_is_root() {
        bail!("the kernel tests load eBPF programs and create network namespaces: run `cargo xtask test` as root");
    }
    let mut timings = Timings::default();
    let result = run_timed(opts, &mut timings);
    // Printed whatever failed: the time is spent either way.
    print!("{}", timings.table());
    result
}

fn run_timed(opts: &Options, timings: &mut Timings) -> Result<()> {
    if opts.host_only {
        let (nightly, churn) = set_up_and_build_churn(timings)?;
        return host(&nightly.name, &churn, opts, timings);
    }
    // The matrix's set-up (qemu, virtme-ng, the kernels: mostly waiting on
    // the network and dpkg) runs beside the host's set-up and the builds
    // (mostly CPU), which the guests wait for anyway.
    let (kernels, nightly, churn, bins) = std::thread::scope(|scope| {
        let kernels = scope.spawn(|| {
            let mut beside = Timings::default();
            let kernels =
                beside.phase("matrix: set up qemu, virtme-ng and the kernels", |_| vm::setup(&matrix_kernels(opts)));
            (kernels, beside)
        });
        let built = (|| {
            let (nightly, churn) = set_up_and_build_churn(timings)?;
            // The kernel test binaries, which the host suite runs too (the
            // same command, the same features: built once).
            let bins = timings.phase("build: the kernel test binaries (the guests' copy taken)", |_| {
                vm::guest_binaries(&nightly.name, &opts.vm_tests)
            })?;
            anyhow::Ok((nightly, churn, bins))
        })();
        let (kernels, beside) = kernels.join().expect("the matrix's set-up panicked");
        timings.add_beside(beside);
        built.map(|(nightly, churn, bins)| (kernels, nightly, churn, bins))
    })?;
    if opts.vm_only {
        let matrix = matrix(opts, kernels, &bins, timings);
        print!("{}", matrix.report);
        return matrix.result;
    }
    // The guests start now, and the host's builds and suite run beside
    // them: a guest under software emulation uses about one of two cores
    // on average and the host suite less (both mostly wait, on rounds and
    // on the kernel), so the two together take little more than the
    // matrix alone. The host suite's kernel tests cannot see the guests'
    // traffic (their own kernels), nor the guests theirs.
    std::thread::scope(|scope| {
        let guests = scope.spawn(|| {
            let mut beside = Timings::default();
            let matrix = matrix(opts, kernels, &bins, &mut beside);
            (matrix, beside)
        });
        let host = host(&nightly.name, &churn, opts, timings);
        let (matrix, beside) = guests.join().expect("the kernel matrix's thread panicked");
        print!("{}", matrix.report);
        timings.add_beside(beside);
        host.and(matrix.result)
    })
}

/// The host's set-up, then the churn generator: the kernel tests run it,
/// a binary of another crate, built first and named to them.
fn set_up_and_build_churn(timings: &mut Timings) -> Result<(crate::toolchain::Nightly, std::path::PathBuf)> {
    let nightly = timings.phase("setup", |_| setup::run())?;
    let churn = timings.phase("build: the churn generator", |_| build::churn(false))?;
    Ok((nightly, churn))
}

/// The release image (tests/image.rs runs it as the DaemonSet does: built
/// here as a user builds it) and the test suite on this machine's kernel.
fn host(nightly: &str, churn: &Path, opts: &Options, timings: &mut Timings) -> Result<()> {
    // Beside the guests, which take longest, the builds yield the CPU to
    // them (and to the host suite's tests, which keep to time).
    timings.phase("build: the host's other test binaries", |_| {
        crate::run_cmd(cargo_test_as(nightly, true).arg("--no-run"))
    })?;
    let build_image = |timings: &mut Timings| {
        timings.phase("build: the release image", |_| image::run(&image::Options { rootfs: None, in_background: true }))
    };
    if !opts.args.is_empty() {
        // Tests the user picked: the image first, for whichever they are.
        let image = build_image(timings)?;
        return timings
            .phase("host: the test suite", |timings| run_suite(nightly, &opts.args, churn, Some(&image), timings));
    }
    // The suite but the image's tests, while the guests run, and the
    // release image, which only those need, built beside it in the CPU the
    // guests and the suite leave: the suite's tests mostly wait (on rounds,
    // on the kernel), and cargo holds no lock while tests run. Built after
    // the suite, the image was the run's longest path (888 s at nice 19,
    // ending ~6 minutes after the guests).
    let (rest, image) = std::thread::scope(|scope| {
        let image = scope.spawn(|| {
            let mut beside = Timings::default();
            let image = build_image(&mut beside);
            (image, beside)
        });
        let rest = timings.phase("host: the test suite but the image's tests", |timings| {
            run_suite(nightly, &["--", "--skip", IMAGE_TESTS], churn, None, timings)
        });
        let (image, beside) = image.join().expect("the release image's thread panicked");
        timings
            .phases
            .extend(beside.phases.into_iter().map(|(name, wall)| (format!("{name} (beside the suite)"), wall)));
        (rest, image)
    });
    let image = image?;
    let image_tests = timings.phase("host: the image's tests", |timings| {
        run_suite(nightly, &["--test", "image", "--", IMAGE_TESTS], churn, Some(&image), timings)
    });
    rest.and(image_tests)
}

/// The tests of tests/image.rs that need the image built: its module
/// `with_the_image` (a libtest filter).
const IMAGE_TESTS: &str = "with_the_image::";

/// Run the host's `cargo test` with `args` (cargo's, then libtest's
/// after `--`) and what its tests need (`image`: the release image's
/// archive, for tests/image.rs's `with_the_image`; None where those do not
/// run), each binary's time into `timings`; an error if any failed.
fn run_suite<S: AsRef<std::ffi::OsStr>>(
    nightly: &str,
    args: &[S],
    churn: &Path,
    image: Option<&Path>,
    timings: &mut Timings,
) -> Result<()> {
    let mut cmd = cargo_test(nightly);
    if let Some(image) = image {
        cmd.env("OBSERVER_IMAGE", image);
    }
    let (ok, times) = timing::cargo_test(
        cmd
            // Before `args`: theirs may end with libtest's, after `--`.
            .arg("--no-fail-fast")
            .args(args)
            .env("OBSERVER_CHURN", churn)
            // The tests that scrape observer with a real Prometheus server.
            .env("OBSERVER_PROMETHEUS", setup::prometheus_bin("prometheus"))
            .env("OBSERVER_PROMTOOL", setup::prometheus_bin("promtool"))
            .env("OBSERVER_NGINX", setup::nginx_bin())
            .env("OBSERVER_REDIS", setup::redis_bin())
            // The deploy/ tests: kubernetes-validate and its Python (PyYAML).
            .env("OBSERVER_KUBERNETES_VALIDATE", setup::k8s_venv_bin("kubernetes-validate"))
            .env("OBSERVER_K8S_PYTHON", setup::k8s_venv_bin("python")),
    )?;
    timings.add_binaries(times);
    if !ok {
        bail!("the host suite failed (each failed binary is marked F or D in the table below)");
    }
    Ok(())
}

/// `cargo test` as every part of the suite builds it. The matrix snapshots
/// the binaries of the host run: a different package selection would unify
/// the dependencies' features differently and build every test binary a
/// second time (minutes, and gigabytes of disk).
pub fn cargo_test(nightly: &str) -> Command {
    cargo_test_as(nightly, false)
}

/// `cargo_test`, at the lowest CPU priority if `in_background`.
fn cargo_test_as(nightly: &str, in_background: bool) -> Command {
    let mut cmd = crate::cargo(in_background);
    cmd.current_dir(workspace_root())
        // The eBPF crate only builds for the bpf target (via observer/build.rs).
        .args(["test", "--workspace", "--exclude", "observer-ebpf"])
        // Fault injection (tests/health.rs kills the collector thread).
        .args(["--features", "observer/failpoints"])
        .env("OBSERVER_NIGHTLY", nightly);
    cmd
}

/// The kernel series `--quick` runs, in its first mode: the newest.
const QUICK_KERNEL: &str = "6.12";

/// What the matrix did: its report (kept in target/vm/report.txt) and
/// whether every guest passed.
struct Matrix {
    report: String,
    result: Result<()>,
}

/// Run the kernel tests on every kernel of the matrix (those `opts` names).
fn matrix(opts: &Options, kernels: Result<Vec<vm::Kernel>>, bins: &vm::GuestBinaries, timings: &mut Timings) -> Matrix {
    let mut report = String::new();
    let result = kernels.and_then(|kernels| guests(opts, kernels, bins, timings, &mut report));
    let (passed, failed) = count_results(&report);
    report.push_str(&format!("matrix: {passed} passed, {failed} failed\n"));
    if let Err(e) = std::fs::write(vm::vm_dir().join("report.txt"), &report) {
        eprintln!("cannot keep the matrix's report in target/vm/report.txt: {e}");
    }
    Matrix { report, result }
}

/// The kernel series the matrix runs (all where empty).
fn matrix_kernels(opts: &Options) -> Vec<String> {
    if opts.quick { vec![QUICK_KERNEL.to_string()] } else { opts.vm_kernels.clone() }
}

/// The attach modes the matrix runs (each kernel's where empty).
fn matrix_modes(opts: &Options) -> Vec<String> {
    if opts.quick { vec!["auto".to_string()] } else { opts.vm_modes.clone() }
}

fn guests(
    opts: &Options,
    mut kernels: Vec<vm::Kernel>,
    bins: &vm::GuestBinaries,
    timings: &mut Timings,
    report: &mut String,
) -> Result<()> {
    let only_modes = matrix_modes(opts);
    for kernel in &mut kernels {
        kernel.modes.retain(|mode| only_modes.is_empty() || only_modes.iter().any(|m| m == mode));
    }
    kernels.retain(|kernel| !kernel.modes.is_empty());
    anyhow::ensure!(!kernels.is_empty(), "no kernel of the matrix has the modes {}", only_modes.join(", "));
    // A unit per kernel and mode, the first modes' (the longer: they also
    // run the first-mode-only tests) first; their runs in one queue the
    // guests take from (`vm::Queue`: the lanes end together).
    let mut units: Vec<vm::Kernel> = kernels
        .iter()
        .flat_map(|kernel| kernel.modes.iter().map(move |mode| vm::Kernel { modes: vec![*mode], ..kernel.clone() }))
        .collect();
    units.sort_by_key(|unit| unit.modes[0] != unit.first_mode);
    let queued: Vec<(String, Vec<String>)> =
        units.iter().map(|unit| (unit.unit(), vm::runs_of_unit(unit, bins))).collect();
    let queue = vm::Queue::create(vm::vm_dir().join("queue"), &queued)?;
    // Guests `--vm-guests-at-once` at a time, each lane on a thread of its
    // own; their reports in the matrix's order.
    let runs: Vec<(usize, u32, String, std::time::Duration, Result<vm::KernelRun>)> = std::thread::scope(|scope| {
        let lanes: Vec<_> = (0..opts.vm_guests_at_once.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    while let Some((unit, instance)) = queue.next() {
                        let i = units.iter().position(|k| k.unit() == unit).expect("a queued unit");
                        let kernel = &units[i];
                        let started = std::time::Instant::now();
                        let run = vm::run_guest(kernel, bins, &queue, instance);
                        // A guest that ended badly is its unit's last
                        // (`Queue::abandon`). One whose kernel failed and
                        // gave its runs back ended well (`ok`): another
                        // guest takes them, within the queue's bound on
                        // kernel failures.
                        if !run.as_ref().is_ok_and(|run| run.ok) {
                            queue.abandon(&unit);
                        }
                        let name =
                            format!("matrix: the {} guest ({}) #{instance}", kernel.series, kernel.modes.join(", "));
                        done.push((i, instance, name, started.elapsed(), run));
                    }
                    done
                })
            })
            .collect();
        let mut runs: Vec<_> = lanes.into_iter().flat_map(|w| w.join().expect("a guest's thread panicked")).collect();
        runs.sort_by_key(|(i, instance, ..)| (*i, *instance));
        runs
    });
    let mut all_ok = true;
    for (_, _, name, wall, run) in runs {
        let name = match &run {
            Ok(run) if run.kernel_failed => format!("{name}, its kernel failed: its unended runs given back"),
            _ => name,
        };
        timings.phases.push((name, wall));
        let run = run?;
        report.push_str(&run.summary);
        timings.binaries.extend(run.times);
        all_ok &= run.ok;
    }
    for unit in &units {
        let left = queue.left(&unit.unit());
        if !left.is_empty() {
            report.push_str(&format!("MATRIX never-run {}: {}\n", unit.unit(), left.join(", ")));
            all_ok = false;
        }
    }
    if !all_ok {
        bail!("the kernel matrix failed (consoles in target/vm/console-*.log)");
    }
    Ok(())
}

/// Sum the `test result: ... N passed; M failed` of every guest run.
fn count_results(report: &str) -> (u64, u64) {
    let number_before = |line: &str, word: &str| -> u64 {
        line.split(word).next().and_then(|s| s.split_whitespace().last()).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    report.lines().filter(|l| l.starts_with("MATRIX test")).fold((0, 0), |(p, f), l| {
        if l.contains("test result") {
            (p + number_before(l, " passed;"), f + number_before(l, " failed;"))
        } else {
            (p, f + 1) // the binary died before reporting
        }
    })
}

#[cfg(test)]
mod tests {
    use super::count_results;

    #[test]
    fn sums_guest_results() {
        let report = "MATRIX test mode=fentry a rc=0 test result: ok. 2 passed; 0 failed; 0 ignored\n\
                      MATRIX test mode=kprobe b rc=101 test result: FAILED. 3 passed; 1 failed; 0 ignored\n\
                      MATRIX test mode=kprobe c rc=139 \n\
                      MATRIX attached hook=\"x\" mode=fentry";
        assert_eq!(count_results(report), (5, 2));
    }
}
