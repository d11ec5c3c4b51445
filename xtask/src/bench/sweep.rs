//! The cost of a ceilings sweep at 100k sockets: the daemon dumps every
//! namespace's TCP sockets through sock_diag each interval, and `observer
//! doctor` does the same plus a scan of the processes; both must stay cheap
//! when a node holds many connections. Goal: under 100 ms of CPU per
//! daemon round with a namespace of 100k sockets; doctor is reported too.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};

use observer_testing::Netns;

use super::{Tracer, cpu_seconds, median, start};

/// Sockets to build: TIME_WAIT from three churn runs toward three
/// listeners (one destination's ports alone stop at ~64k), plus held
/// ESTABLISHED/CLOSE_WAIT pairs.
const CYCLES_PER_DESTINATION: u64 = 33_000;
const HELD: u64 = 5_000;
const RUNS: usize = 5;

pub struct SweepCost {
    pub sockets: u64,
    /// CPU (user + system) of one daemon round (1 s interval, no traffic:
    /// the sweep of every namespace, the map reads, the open files).
    pub round_ms: f64,
    /// CPU (user + system) of one `observer doctor --netns` run, each run.
    pub doctor_ms: Vec<f64>,
}

impl SweepCost {
    pub fn doctor_median_ms(&self) -> f64 {
        median(self.doctor_ms.clone())
    }
}

/// Rounds the daemon's CPU is averaged over.
const ROUNDS: u64 = 10;

pub fn measure(observer: &Path, churn: &Path) -> Result<SweepCost> {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "1024 65535");
    // The namespace's default is half the established hash's size, which
    // here caps TIME_WAIT near 64k.
    ns.sysctl("net.ipv4.tcp_max_tw_buckets", "262144");
    // Loopback connections reuse TIME_WAIT ports by default (tw_reuse=2).
    ns.sysctl("net.ipv4.tcp_tw_reuse", "0");
    let churn = churn.to_str().context("path")?;
    let runs: Vec<_> = (0..3)
        .map(|i| {
            ns.command(churn)
                .args(["churn", "--threads", "2", "--listen", &format!("127.0.0.1:{}", 9300 + i)])
                .args(["--connections", &CYCLES_PER_DESTINATION.to_string()])
                .stdout(Stdio::null())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for mut run in runs {
        ensure!(run.wait()?.success(), "observer-churn churn failed");
    }
    // Below the port range: the TIME_WAIT sockets hold every port in it.
    let mut server =
        ns.command(churn).args(["serve", "--listen", "127.0.0.1:900", "--hold"]).stdout(Stdio::piped()).spawn()?;
    BufReader::new(server.stdout.as_mut().context("stdout")?).read_line(&mut String::new())?;
    let mut client = ns
        .command(churn)
        .args(["connect", "--to", "127.0.0.1:900", "--hold"])
        .args(["--count", &HELD.to_string()])
        .stdout(Stdio::null())
        .spawn()?;
    ensure!(client.wait()?.success(), "observer-churn connect failed");

    let sockets = count_sockets(&ns)?;
    // TIME_WAIT lasts 60 s: measure the daemon first, then doctor.
    let round_ms = daemon_round_ms(observer)?;
    let netns = ns.path();
    let mut cpu_ms = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let before = children_cpu_seconds();
        let out = Command::new(observer).args(["doctor", "--json", "--netns"]).arg(&netns).output()?;
        // Exit 0/1/2 is the verdict; 3 is an error.
        ensure!(out.status.code().is_some_and(|c| c < 3), "doctor: {}", String::from_utf8_lossy(&out.stderr));
        cpu_ms.push((children_cpu_seconds() - before) * 1000.0);
    }
    let _ = server.kill();
    let _ = server.wait();
    Ok(SweepCost { sockets, round_ms, doctor_ms: cpu_ms })
}

/// The daemon's CPU per round with a 1 s interval, after its start.
fn daemon_round_ms(observer: &Path) -> Result<f64> {
    let running = start(Tracer::Observer, observer, "1s")?.context("observer")?;
    let pid = running.child.id();
    std::thread::sleep(Duration::from_secs(3));
    let (before, since) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(ROUNDS));
    let rounds = since.elapsed().as_secs_f64(); // one per second
    Ok((cpu_seconds(pid) - before) / rounds * 1000.0)
}

/// TCP sockets of the namespace, as `ss` counts them.
fn count_sockets(ns: &Netns) -> Result<u64> {
    let out = ns.command("ss").args(["-Htan"]).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().count() as u64)
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
