//! The cost of reading the node's sockets and ceilings, on two axes: the
//! network namespaces (0, 25 and 110 besides the host and the busy one,
//! each like a pod: one listener) at ~100k sockets, and the sockets (10k, 100k, 300k) at
//! 110 namespaces. The sockets sit in one namespace (TIME_WAIT toward
//! several destinations, and 5000 held connections) where a trickle of
//! connections goes on, so its reading changes every round as a busy
//! pod's does. Reported: the daemon's CPU per round (interval 1 s, once its
//! first readings are done) and `observer doctor`'s CPU per run over every
//! namespace. Goal: <= 40 ms per round at 100k sockets whatever the
//! namespaces, doctor alike, growing linearly with the sockets.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};

use observer_testing::{
    Netns,
    http::{sample, scrape},
};

use super::{Tracer, cpu_seconds, median, start};

/// Churn cycles per destination (ports 600, 601, ...: below the port range,
/// which the clients' ports fill): one destination's ports stop at ~64k.
const CYCLES_PER_DESTINATION: u64 = 33_000;
/// Held connections (both ends in the namespace: twice the sockets).
pub const HELD: u64 = 2_500;
/// doctor's runs per point, a second apart: this VM's speed changes
/// for seconds at a time (whole runs ~30% slower, every part of them
/// alike), and nine runs give the median more of each.
pub const DOCTOR_RUNS: usize = 9;
/// Rounds the daemon's CPU is averaged over.
const ROUNDS: u64 = 10;

/// (namespaces besides the host and the one with the sockets, sockets).
const POINTS: [(usize, u64); 5] = [(0, 100_000), (25, 100_000), (110, 100_000), (110, 10_000), (110, 300_000)];

pub struct SweepPoint {
    pub pods: usize,
    /// TCP sockets of the node during the measure (`ss`).
    pub sockets: u64,
    /// CPU (user + system) of one daemon round.
    pub round_ms: f64,
    /// CPU (user + system) of one `observer doctor` run, each run.
    pub doctor_ms: Vec<f64>,
    /// Wall time of a daemon's start-up pass over the connections older
    /// than it (observer-ebpf's older.rs), among these sockets.
    pub startup_ms: f64,
}

impl SweepPoint {
    pub fn doctor_median_ms(&self) -> f64 {
        median(self.doctor_ms.clone())
    }
}

/// A namespace with one listener, like a pod.
struct Pod {
    _ns: Netns,
    server: Child,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

pub fn measure(observer: &Path, churn: &Path) -> Result<Vec<SweepPoint>> {
    let churn = churn.to_str().context("path")?;
    let mut pods: Vec<Pod> = Vec::new();
    let mut points = Vec::new();
    for (want, sockets) in POINTS {
        while pods.len() < want {
            let ns = Netns::new();
            let server = serve(&ns, churn, "127.0.0.1:8080")?;
            pods.push(Pod { _ns: ns, server });
        }
        let p = point(observer, churn, pods.len(), sockets)?;
        let runs: Vec<String> = p.doctor_ms.iter().map(|ms| format!("{ms:.1}")).collect();
        println!(
            "bench: sweep: {want} namespaces, {} sockets: {:.1} ms per round, doctor {:.1} ms (runs: {})",
            p.sockets,
            p.round_ms,
            p.doctor_median_ms(),
            runs.join(", ")
        );
        points.push(p);
    }
    Ok(points)
}

fn point(observer: &Path, churn: &str, pods: usize, sockets: u64) -> Result<SweepPoint> {
    // The daemon first, so its first dump of every namespace is done
    // before the sockets exist: the measure is of rounds after that.
    let running = start(Tracer::Observer, observer, "1s")?.context("observer")?;
    let port = running.metrics_port.context("port")?;
    wait_for_first_readings(port, pods)?;

    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "1024 65535");
    // The namespace's default is half the established hash's size.
    ns.sysctl("net.ipv4.tcp_max_tw_buckets", "1000000");
    // Loopback connections reuse TIME_WAIT ports by default (tw_reuse=2).
    ns.sysctl("net.ipv4.tcp_tw_reuse", "0");
    let time_wait = sockets.saturating_sub(2 * HELD);
    let destinations = time_wait.div_ceil(CYCLES_PER_DESTINATION);
    let runs: Vec<_> = (0..destinations)
        .map(|i| {
            let cycles = (time_wait / destinations).to_string();
            ns.command(churn)
                .args(["churn", "--threads", "2", "--listen", &format!("127.0.0.1:{}", 600 + i)])
                .args(["--connections", &cycles])
                .stdout(Stdio::null())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for mut run in runs {
        ensure!(run.wait()?.success(), "observer-churn churn failed");
    }
    // Below the port range, so the held connections find ports.
    let mut server = serve(&ns, churn, "127.0.0.1:900")?;
    let mut held = ns
        .command(churn)
        .args(["connect", "--to", "127.0.0.1:900", "--hold", "--count", &HELD.to_string()])
        .stdout(Stdio::null())
        .spawn()?;
    ensure!(held.wait()?.success(), "observer-churn connect failed");
    // A busy pod: its sockets change every round.
    let mut trickle = ns
        .command(churn)
        .args(["connect", "--to", "127.0.0.1:900", "--count", "300", "--spread", "60s"])
        .stdout(Stdio::null())
        .spawn()?;

    let counted = count_sockets()?;
    let pid = running.child.id();
    std::thread::sleep(Duration::from_secs(2));
    let (before, since) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(ROUNDS));
    let round_ms = (cpu_seconds(pid) - before) / since.elapsed().as_secs_f64() * 1000.0;

    // doctor alone: the daemon's dumps would contend with its own.
    let _ = trickle.kill();
    let _ = trickle.wait();
    drop(running);
    let mut doctor_ms = Vec::with_capacity(DOCTOR_RUNS);
    for _ in 0..DOCTOR_RUNS {
        // A second apart: a passing disturbance of the machine (a run of
        // the kernel's own work) then spoils one run, which the median
        // leaves out, rather than all of them.
        std::thread::sleep(Duration::from_secs(1));
        let before = children_cpu_seconds();
        let out = Command::new(observer).args(["doctor", "--json"]).output()?;
        // Exit 0/1/2 is the verdict; 3 is an error.
        ensure!(out.status.code().is_some_and(|c| c < 3), "doctor: {}", String::from_utf8_lossy(&out.stderr));
        doctor_ms.push((children_cpu_seconds() - before) * 1000.0);
    }
    let startup_ms = startup_pass_ms(observer)?;
    let _ = server.kill();
    let _ = server.wait();
    Ok(SweepPoint { pods, sockets: counted, round_ms, doctor_ms, startup_ms })
}

/// A daemon started among these sockets: how long its start-up pass over
/// the connections older than it took (both passes of the TCP socket
/// iterator over every namespace, as its log says).
fn startup_pass_ms(observer: &Path) -> Result<f64> {
    let running = start(Tracer::Observer, observer, "1s")?.context("observer")?;
    drop(running);
    let log = std::fs::read_to_string(super::bench_dir()?.join("observer.log"))?;
    log.lines()
        .filter(|l| l.contains("established before observer started"))
        .find_map(|l| super::field(l, "took_ms")?.parse().ok())
        .with_context(|| format!("the daemon's log has no start-up pass:\n{log}"))
}

/// `observer-churn serve` in `ns`, once it listens.
fn serve(ns: &Netns, churn: &str, listen: &str) -> Result<Child> {
    let mut server = ns.command(churn).args(["serve", "--listen", listen, "--hold"]).stdout(Stdio::piped()).spawn()?;
    BufReader::new(server.stdout.as_mut().context("stdout")?).read_line(&mut String::new())?;
    Ok(server)
}

/// Until the daemon has read every namespace (`pods` and the host) once.
fn wait_for_first_readings(port: u16, pods: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let body = scrape(port).unwrap_or_default();
        let current = sample(&body, "observer_network_namespace_usage", &["observer_reading=\"current\""]).unwrap_or(0);
        let deferred =
            sample(&body, "observer_network_namespace_usage", &["observer_reading=\"deferred\""]).unwrap_or(1);
        if current > pods as u64 && deferred == 0 {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "observer read {current} namespaces of {} in 120 s", pods + 1);
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// TCP sockets of the node, as `ss` counts them in every namespace.
fn count_sockets() -> Result<u64> {
    let mut total = 0;
    let names = Command::new("ip").args(["netns", "list"]).output()?;
    for line in String::from_utf8_lossy(&names.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let out = Command::new("ip").args(["netns", "exec", name, "ss", "-Htan"]).output()?;
        total += String::from_utf8_lossy(&out.stdout).lines().count() as u64;
    }
    let host = Command::new("ss").args(["-Htan"]).output()?;
    Ok(total + String::from_utf8_lossy(&host.stdout).lines().count() as u64)
}

/// User + system time of this process's waited-for children so far.
fn children_cpu_seconds() -> f64 {
    #[repr(C)]
    struct Rusage {
        utime: [i64; 2],
        stime: [i64; 2],
        rest: [i64; 14],
    }
    unsafe extern "C" {
        fn getrusage(who: i32, usage: *mut Rusage) -> i32;
    }
    const RUSAGE_CHILDREN: i32 = -1;
    let mut usage = Rusage { utime: [0; 2], stime: [0; 2], rest: [0; 14] };
    // SAFETY: `usage` is a valid struct rusage (x86_64/aarch64 layout) for
    // the call.
    if unsafe { getrusage(RUSAGE_CHILDREN, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: [i64; 2]| t[0] as f64 + t[1] as f64 / 1e6;
    secs(usage.utime) + secs(usage.stime)
}
