//! `cargo xtask bench`: observer's overhead on the connection path and its
//! losslessness at full speed, measured side by side with the tools people
//! use today (libbpf-tools `tcpstates`, a bpftrace script). Writes
//! BENCHMARKS.md. Targets are checked here, never by timed tests.
use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{build, setup, workspace_root};

#[derive(Args)]
pub struct Options {
    /// A/B pairs per tracer.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Connection cycles per run.
    #[arg(long, default_value_t = 20_000)]
    pub connections: u64,
    /// Client (and acceptor) threads of the generator.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// bpftrace: the same tracepoints counted into maps, the usual ad-hoc way.
const BPFTRACE_SCRIPT: &str = r#"
tracepoint:sock:inet_sock_set_state { @states[args->oldstate, args->newstate] = count(); }
tracepoint:syscalls:sys_enter_connect { @connects[pid] = count(); }
tracepoint:syscalls:sys_exit_connect /args->ret < 0/ { @connect_errors[pid, -args->ret] = count(); }
tracepoint:syscalls:sys_exit_accept4 /args->ret >= 0/ { @accepts[pid] = count(); }
"#;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tracer {
    Baseline,
    Observer,
    Tcpstates,
    Bpftrace,
}

impl Tracer {
    fn name(self) -> &'static str {
        match self {
            Tracer::Baseline => "no tracer",
            Tracer::Observer => "observer",
            Tracer::Tcpstates => "libbpf-tools tcpstates",
            Tracer::Bpftrace => "bpftrace (4 tracepoints into maps)",
        }
    }
}

struct Running {
    child: Child,
    metrics_port: Option<u16>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A network namespace for one run, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Result<Self> {
        let name = format!("obs-bench-{}-{tag}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        crate::run_cmd(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns(name);
        crate::run_cmd(Command::new("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]))?;
        Ok(ns)
    }
    fn exec(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, program]);
        c
    }
    fn sysctl(&self, kv: &str) -> Result<()> {
        crate::run_cmd(self.exec("sysctl").args(["-qw", kv]))
    }
    fn nstat(&self, counter: &str) -> Result<u64> {
        let out = self.exec("nstat").args(["-asz", counter]).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix(counter).and_then(|v| v.split_whitespace().next()?.parse().ok()))
            .with_context(|| format!("nstat: no {counter}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(19464)
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.starts_with("HTTP/1.1 200").then_some(body)
}

/// Sum of the samples of `metric` whose labels contain all of `labels`.
fn sample_sum(body: &str, metric: &str, labels: &[&str]) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

fn start(tracer: Tracer, observer: &std::path::Path, interval: &str) -> Result<Option<Running>> {
    let running = match tracer {
        Tracer::Baseline => return Ok(None),
        Tracer::Observer => {
            let port = free_port();
            let child = Command::new(observer)
                .args(["run", "--interval", interval, "--prometheus-listen", &format!("127.0.0.1:{port}")])
                .stderr(Stdio::null())
                .spawn()?;
            let r = Running { child, metrics_port: Some(port) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while scrape(port).is_none() {
                anyhow::ensure!(Instant::now() < deadline, "observer did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
            r
        }
        Tracer::Tcpstates => {
            let child = Command::new("tcpstates").stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
            // tcpstates prints nothing when ready; give it its load time.
            std::thread::sleep(Duration::from_secs(2));
            Running { child, metrics_port: None }
        }
        Tracer::Bpftrace => {
            let mut child = Command::new("bpftrace")
                .args(["-e", BPFTRACE_SCRIPT])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            let mut line = String::new();
            BufReader::new(child.stdout.as_mut().context("stdout")?).read_line(&mut line)?;
            if !line.starts_with("Attaching") {
                let mut err = String::new();
                let _ = child.stderr.as_mut().map(|e| e.read_to_string(&mut err));
                bail!("bpftrace did not attach: {line}{err}");
            }
            Running { child, metrics_port: None }
        }
    };
    Ok(Some(running))
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: f64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<f64>().ok()).sum();
    ticks / 100.0
}

/// Total run time of all loaded BPF programs (kernel.bpf_stats_enabled=1).
fn bpf_run_seconds() -> f64 {
    let out = Command::new("bpftool").args(["prog", "show", "-j"]).output();
    let Ok(out) = out else { return 0.0 };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array().map(|a| a.iter().filter_map(|p| p["run_time_ns"].as_u64()).sum::<u64>()).unwrap_or(0) as f64 / 1e9
}

/// Program runs the kernel skipped because the same program was already
/// running on that CPU (an interrupt nested into it), over all programs.
fn bpf_recursion_misses() -> u64 {
    let out = Command::new("bpftool").args(["prog", "show", "-j"]).output();
    let Ok(out) = out else { return 0 };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array().map(|a| a.iter().filter_map(|p| p["recursion_misses"].as_u64()).sum()).unwrap_or(0)
}

fn bpf_map_bytes() -> u64 {
    let out = Command::new("bpftool").args(["map", "show", "-j"]).output();
    let Ok(out) = out else { return 0 };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array().map(|a| a.iter().filter_map(|m| m["bytes_memlock"].as_u64()).sum()).unwrap_or(0)
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")?.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

fn field(out: &str, key: &str) -> Option<String> {
    out.split_whitespace().find_map(|f| f.strip_prefix(&format!("{key}=")).map(str::to_string))
}

struct Run {
    rate: f64,
    cycles: u64,
    tracer_cpu: f64,
    bpf_cpu: f64,
    misses: u64,
    lossless: Option<String>,
    rss_kib: u64,
    map_bytes: u64,
}

fn churn_once(
    tracer: Tracer,
    observer: &std::path::Path,
    churn: &std::path::Path,
    opts: &Options,
    tag: &str,
) -> Result<Run> {
    let ns = Netns::new(tag)?;
    ns.sysctl("net.ipv4.ip_local_port_range=1024 65535")?;
    let running = start(tracer, observer, "1s")?;
    let (cpu0, bpf0) = (running.as_ref().map_or(0.0, |r| cpu_seconds(r.child.id())), bpf_run_seconds());
    let misses0 = bpf_recursion_misses();
    let child = ns
        .exec(churn.to_str().context("path")?)
        .args(["churn", "--threads", &opts.threads.to_string(), "--connections", &opts.connections.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let churn_pid = child.id();
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let rate: f64 = field(&text, "rate").and_then(|r| r.parse().ok()).with_context(|| format!("churn said: {text}"))?;
    let cycles: u64 = field(&text, "cycles").and_then(|r| r.parse().ok()).unwrap_or(0);
    let bpf_cpu = bpf_run_seconds() - bpf0;
    let misses = bpf_recursion_misses() - misses0;
    let mut run = Run { rate, cycles, tracer_cpu: 0.0, bpf_cpu, misses, lossless: None, rss_kib: 0, map_bytes: 0 };
    if let Some(r) = &running {
        if let Some(port) = r.metrics_port {
            run.map_bytes = bpf_map_bytes();
            // Two intervals: every count of the run has been collected.
            std::thread::sleep(Duration::from_millis(2500));
            let body = scrape(port).context("scrape")?;
            let pid = format!("process_pid=\"{churn_pid}\"");
            let got = [
                ("connects", sample_sum(&body, "observer_tcp_connects_total", &[&pid])),
                ("accepts", sample_sum(&body, "observer_tcp_accepts_total", &[&pid])),
                ("time_wait_entries", sample_sum(&body, "observer_tcp_time_wait_entries_total", &[&pid])),
            ];
            let wrong: Vec<String> =
                got.iter().filter(|(_, n)| *n != cycles).map(|(k, n)| format!("{k} {n} != {cycles}")).collect();
            run.lossless = Some(if wrong.is_empty() { "exact".into() } else { wrong.join(", ") });
            run.rss_kib = peak_rss_kib(r.child.id());
        }
        run.tracer_cpu = cpu_seconds(r.child.id()) - cpu0;
    }
    Ok(run)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

pub fn run(opts: &Options) -> Result<()> {
    anyhow::ensure!(setup::nix_is_root(), "the benchmark loads eBPF programs: run it as root");
    setup::apt_install_packages(&["libbpf-tools", "bpftrace", "bpftool"])?;
    let observer = build::run(&build::Options { release: true })?;
    let churn = workspace_root().join("target/release/observer-churn");
    let tracers = [Tracer::Observer, Tracer::Tcpstates, Tracer::Bpftrace];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); tracers.len()];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); tracers.len() + 1];
    let mut cpu_per_m: Vec<Vec<f64>> = vec![Vec::new(); tracers.len()];
    let _ = Command::new("sysctl").args(["-qw", "kernel.bpf_stats_enabled=0"]).status();
    let mut misses = vec![0u64; tracers.len()];
    let mut failures: Vec<String> = Vec::new();
    let mut lossless = Vec::new();
    let (mut rss, mut maps) = (0u64, 0u64);
    for round in 0..opts.rounds {
        for (i, tracer) in tracers.iter().enumerate() {
            // A/B: a baseline run right before each tracer run.
            let base = churn_once(Tracer::Baseline, &observer, &churn, opts, &format!("{round}-{i}-a"))?;
            rates[0].push(base.rate);
            match churn_once(*tracer, &observer, &churn, opts, &format!("{round}-{i}-b")) {
                Ok(run) => {
                    println!(
                        "bench: round {round}: {} {:.0}/s vs baseline {:.0}/s",
                        tracer.name(),
                        run.rate,
                        base.rate
                    );
                    ratios[i].push(run.rate / base.rate);
                    rates[i + 1].push(run.rate);
                    misses[i] += run.misses;
                    if let Some(l) = run.lossless {
                        lossless.push(l);
                    }
                    rss = rss.max(run.rss_kib);
                    maps = maps.max(run.map_bytes);
                }
                Err(e) => failures.push(format!("{}: {e:#}", tracer.name())),
            }
        }
    }
    // CPU cost: one more run per tracer with BPF run-time accounting on
    // (kernel.bpf_stats_enabled costs time itself, so it stays off for the
    // throughput pairs above).
    let _ = Command::new("sysctl").args(["-qw", "kernel.bpf_stats_enabled=1"]).status();
    for (i, tracer) in tracers.iter().enumerate() {
        if let Ok(run) = churn_once(*tracer, &observer, &churn, opts, &format!("cpu-{i}")) {
            cpu_per_m[i].push((run.tracer_cpu + run.bpf_cpu) / run.cycles.max(1) as f64 * 1e6);
        }
    }
    let _ = Command::new("sysctl").args(["-qw", "kernel.bpf_stats_enabled=0"]).status();
    let storms = storms(&observer, &churn)?;
    let idle = idle_cpu(&observer)?;

    // The report.
    let mut md = String::new();
    writeln!(md, "# Benchmarks\n")?;
    writeln!(
        md,
        "Made by `cargo xtask bench` (rounds {}, {} connections per run, {} threads).\n",
        opts.rounds, opts.connections, opts.threads
    )?;
    writeln!(md, "Machine: {} cores, {}; kernel {}.\n", num_cpus(), cpu_model(), uname())?;
    writeln!(
        md,
        "Load: `observer-churn churn` in its own network namespace (port range 1024-65535): connect, accept, client-first close, as fast as possible. Each tracer run is paired with a baseline run right before it (A/B); the ratio is tracer/baseline of each pair. CPU is the tracer's own process time plus the run time of all BPF programs, per million connection cycles (each cycle is ~10 state changes and 4 syscalls traced), from one extra run per tracer with kernel.bpf_stats_enabled=1 (off during the throughput pairs, as it costs time itself). Nested runs are program invocations the kernel skipped because the same program was already running on that CPU (bpftool's recursion_misses): an event a tracer did not see.\n"
    )?;
    writeln!(
        md,
        "| tracer | median cycles/s | median ratio to baseline | ratio spread (min-max) | CPU per 1M cycles | program runs skipped by the kernel (nested), all runs |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|")?;
    writeln!(md, "| {} | {:.0} | 1.000 | - | 0 | - |", Tracer::Baseline.name(), median(rates[0].clone()))?;
    let mut observer_ratio = f64::NAN;
    let mut peer_best = 0.0f64;
    for (i, tracer) in tracers.iter().enumerate() {
        if ratios[i].is_empty() {
            writeln!(md, "| {} | failed | - | - | - | - |", tracer.name())?;
            continue;
        }
        let r = median(ratios[i].clone());
        let (lo, hi) = ratios[i].iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        writeln!(
            md,
            "| {} | {:.0} | {r:.3} | {lo:.3}-{hi:.3} | {:.3} s | {} |",
            tracer.name(),
            median(rates[i + 1].clone()),
            median(cpu_per_m[i].clone()),
            misses[i]
        )?;
        if *tracer == Tracer::Observer {
            observer_ratio = r;
        } else {
            peer_best = peer_best.max(r);
        }
    }
    writeln!(
        md,
        "\nLossless check (observer's counts for the generator's pid vs the cycles it made, every observer run): {}.\n",
        lossless.join("; ")
    )?;
    writeln!(md, "Storms at full speed, observer vs ground truth:\n\n{storms}")?;
    writeln!(
        md,
        "Daemon: peak RSS {:.1} MiB; BPF map memory {:.1} MiB; idle CPU with a 5 s interval {:.2}% of a core.\n",
        rss as f64 / 1024.0,
        maps as f64 / 1048576.0,
        idle
    )?;
    for f in &failures {
        writeln!(md, "- failed: {f}")?;
    }
    let targets = [
        (observer_ratio >= 0.97, format!("throughput ratio {observer_ratio:.3} >= 0.97")),
        (observer_ratio > peer_best, format!("better than every peer (best peer {peer_best:.3})")),
        (
            lossless.iter().all(|l| l == "exact") && !lossless.is_empty() && !storms.contains("MISMATCH"),
            "zero lost or extra counts".to_string(),
        ),
        (rss < 50 * 1024, format!("peak RSS {:.1} MiB < 50 MiB", rss as f64 / 1024.0)),
        (idle < 1.0, format!("idle CPU {idle:.2}% < 1%")),
    ];
    writeln!(md, "\n## Targets\n")?;
    for (ok, what) in &targets {
        writeln!(md, "- {} {what}", if *ok { "met:" } else { "MISSED:" })?;
    }
    std::fs::write(workspace_root().join("BENCHMARKS.md"), &md)?;
    print!("{md}");
    if targets.iter().any(|(ok, _)| !ok) {
        bail!("benchmark targets missed (see BENCHMARKS.md)");
    }
    Ok(())
}

/// EADDRNOTAVAIL and listen-overflow storms at full speed, with observer
/// attached; its counts must equal the kernel's.
fn storms(observer: &std::path::Path, churn: &std::path::Path) -> Result<String> {
    let mut out = String::new();
    let running = start(Tracer::Observer, observer, "1s")?.context("observer")?;
    let port = running.metrics_port.context("port")?;

    let ns = Netns::new("storm-a")?;
    ns.sysctl("net.ipv4.ip_local_port_range=40000 40099")?;
    let mut server = ns
        .exec(churn.to_str().context("path")?)
        .args(["serve", "--listen", "127.0.0.1:9100", "--hold"])
        .stdout(Stdio::piped())
        .spawn()?;
    BufReader::new(server.stdout.as_mut().context("stdout")?).read_line(&mut String::new())?;
    let child = ns
        .exec(churn.to_str().context("path")?)
        .args(["storm", "--to", "127.0.0.1:9100", "--kind", "eaddrnotavail", "--attempts", "50000"])
        .stdout(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let text = String::from_utf8_lossy(&child.wait_with_output()?.stdout).into_owned();
    let seen: u64 =
        field(&text, "errors").and_then(|e| e.strip_prefix("EADDRNOTAVAIL:").and_then(|n| n.parse().ok())).unwrap_or(0);
    let _ = server.kill();
    let _ = server.wait();
    std::thread::sleep(Duration::from_millis(2500));
    let body = scrape(port).context("scrape")?;
    let counted = sample_sum(
        &body,
        "observer_tcp_connect_errors_total",
        &[&format!("process_pid=\"{pid}\""), "error_type=\"EADDRNOTAVAIL\""],
    );
    writeln!(
        out,
        "- EADDRNOTAVAIL storm ({}): client saw {seen}, observer counted {counted}: {}",
        field(&text, "seconds").unwrap_or_default() + " s",
        if seen == counted && seen > 0 { "exact" } else { "MISMATCH" }
    )?;

    let ns = Netns::new("storm-b")?;
    let mut server = ns
        .exec(churn.to_str().context("path")?)
        .args(["serve", "--listen", "127.0.0.1:9200", "--backlog", "8", "--never-accept"])
        .stdout(Stdio::piped())
        .spawn()?;
    let server_pid = server.id();
    BufReader::new(server.stdout.as_mut().context("stdout")?).read_line(&mut String::new())?;
    std::thread::sleep(Duration::from_millis(1500)); // observer sees the listener in one scan
    let before = ns.nstat("TcpExtListenOverflows")?;
    let child = ns
        .exec(churn.to_str().context("path")?)
        .args(["storm", "--to", "127.0.0.1:9200", "--kind", "overflow", "--attempts", "50000"])
        .stdout(Stdio::piped())
        .spawn()?;
    let text = String::from_utf8_lossy(&child.wait_with_output()?.stdout).into_owned();
    std::thread::sleep(Duration::from_millis(500));
    let overflows = ns.nstat("TcpExtListenOverflows")? - before;
    std::thread::sleep(Duration::from_millis(2500));
    let body = scrape(port).context("scrape")?;
    let counted = sample_sum(&body, "observer_tcp_listen_overflows_total", &[&format!("process_pid=\"{server_pid}\"")]);
    let _ = server.kill();
    let _ = server.wait();
    writeln!(
        out,
        "- listen-overflow storm ({} s): TcpExtListenOverflows {overflows}, observer counted {counted}: {}\n",
        field(&text, "seconds").unwrap_or_default(),
        if overflows == counted && overflows > 0 { "exact" } else { "MISMATCH" }
    )?;
    Ok(out)
}

/// CPU of an idle daemon with the default 5 s interval, % of one core.
fn idle_cpu(observer: &std::path::Path) -> Result<f64> {
    let running = start(Tracer::Observer, observer, "5s")?.context("observer")?;
    std::thread::sleep(Duration::from_secs(6));
    let pid = running.child.id();
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(30));
    Ok((cpu_seconds(pid) - c0) / t0.elapsed().as_secs_f64() * 100.0)
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn uname() -> String {
    Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
