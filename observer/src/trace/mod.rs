//! `observer trace`: every connect() failure on the node as it happens
//! (and, with `--events`, TIME_WAIT entries, listener drops, connects,
//! accepts), one line each, like strace for every process at once and
//! without ptrace. Its own copy of the programs queues each event of the
//! kinds asked for in a ring buffer (`Probes::load_for_trace`); the
//! daemon's copy never does, so nobody pays for records while nobody
//! traces. Here: each record named (executable, pod), filtered,
//! rate-limited with the rest counted, and printed as text or JSON.
pub mod event;
pub mod evictions;
pub mod filter;
pub mod rate;

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use event::Named;
use observer_common::TraceEvent;
use tokio::io::unix::AsyncFd;

use crate::{
    attribution::Attributor,
    error::Error,
    probes::{AttachMode, Probes, TraceMaps, stats::SKIPS_COUNTED_SINCE, uncounted_skips},
};

/// The ring buffer's size: 4 MiB hold ~58,000 records, about a second of
/// the storms the tests make, between two reads.
pub const RING_BYTES: u32 = 4 << 20;

pub struct Options {
    /// What to trace (at least one kind).
    pub kinds: Vec<event::Kind>,
    pub filter: filter::Filter,
    pub json: bool,
    /// Lines a second at most.
    pub rate: u64,
    pub attach_mode: AttachMode,
    /// Socket owners remembered (the SOCK_OWNERS map).
    pub max_sockets: u32,
    pub proc_root: PathBuf,
    pub pod_logs: PathBuf,
}

/// What a trace printed and left out, for its last line.
#[derive(Debug, Default)]
pub struct Summary {
    pub shown: u64,
    pub left_out: u64,
    pub lost: u64,
    /// Runs of the trace's programs the kernel skipped (recursion
    /// protection): events never queued. Only where the kernel counts them.
    pub skipped: u64,
    /// Whether some of its programs' skipped runs go uncounted (an older
    /// kernel): `skipped` is then a floor.
    pub skips_uncounted: bool,
    /// Entries the LRU maps evicted (`evictions`).
    pub evicted: u64,
}

/// Trace until `shutdown` resolves.
pub async fn run(opts: Options, shutdown: impl std::future::Future<Output = ()>) -> Result<Summary, Error> {
    let (probes, maps, TraceMaps { events, dropped }) = Probes::load_for_trace(
        opts.attach_mode,
        RING_BYTES,
        event::bits(&opts.kinds),
        event::hooks_needed(&opts.kinds),
        opts.max_sockets,
    )?;
    let mut evictions = evictions::Evictions::new(maps.lru, maps.listeners);
    let mut kinds = Vec::new();
    for kind in &opts.kinds {
        match event::unavailable(*kind, &probes.attachments) {
            // Alone, it is an error; beside others, a note and the rest.
            Some(why) if opts.kinds.len() == 1 => {
                return Err(Error::NotTraceable { what: kind.described().into(), why });
            }
            Some(why) => eprintln!("observer trace: leaving out {}: {why}", kind.described()),
            None => kinds.push(*kind),
        }
    }
    let mut hooks: Vec<String> = Vec::new();
    for a in probes.attachments.iter().filter(|a| kinds.iter().any(|k| k.hooks().contains(&a.hook))) {
        hooks.push(format!("{} ({})", a.hook, a.mode));
    }
    // Records of a kind left out are not printed, should a program queue one.
    let shown_kinds = event::bits(&kinds);
    let described: Vec<&str> = kinds.iter().map(|k| k.described()).collect();
    eprintln!(
        "observer trace: {} of every process, at {}; at most {} lines a second; Ctrl-C ends it",
        described.join(", "),
        hooks.join(", "),
        opts.rate
    );
    let uncounted = uncounted_skips(&probes.attachments);
    if !uncounted.is_empty() {
        let (major, minor) = probes.kernel;
        eprintln!(
            "observer trace: this kernel ({major}.{minor}) does not count the runs it skips of the programs at {} \
             ({}): an event lost that way goes unreported",
            uncounted.join(", "),
            SKIPS_COUNTED_SINCE
        );
    }
    // SAFETY: the ring buffer owns its map's file descriptor, open and the
    // same for as long as it lives, which the AsyncFd owning it bounds.
    let mut ring = unsafe { AsyncFd::register_with_interest(events, tokio::io::Interest::READABLE) }
        .map_err(|e| Error::System { what: "poll the trace ring buffer", source: e.into() })?;
    let mut namer = Namer::new(&opts);
    let mut limit = rate::RateLimit::new(opts.rate, Instant::now());
    let mut summary = Summary { skips_uncounted: !uncounted.is_empty(), ..Summary::default() };
    let mut lost_before = 0u64;
    let mut skipped_before = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tokio::pin!(shutdown);
    // Each second: the events left out, those the ring had no room for,
    // the runs the kernel skipped, and the entries the LRU maps evicted
    // (every few seconds; `last`: now).
    let mut report = |limit: &mut rate::RateLimit,
                      summary: &mut Summary,
                      evictions: &mut evictions::Evictions,
                      lost_now: u64,
                      skipped_now: u64,
                      last: bool| {
        let json = opts.json;
        let left_out = limit.take_left_out();
        summary.left_out += left_out;
        let lost = lost_now.saturating_sub(lost_before);
        lost_before = lost_now;
        summary.lost += lost;
        let skipped = skipped_now.saturating_sub(skipped_before);
        skipped_before = skipped_now;
        summary.skipped += skipped;
        let mut lines = Vec::new();
        if left_out > 0 {
            lines.push(if json {
                format!("{{\"left_out\":{left_out}}}")
            } else {
                format!("# {left_out} events left out in the last second (--rate {})", opts.rate)
            });
        }
        if lost > 0 {
            lines.push(if json {
                format!("{{\"lost\":{lost}}}")
            } else {
                format!("# {lost} events lost: the kernel's ring buffer was full (observer trace fell behind)")
            });
        }
        if skipped > 0 {
            lines.push(if json {
                format!("{{\"skipped\":{skipped}}}")
            } else {
                format!(
                    "# {skipped} events skipped by the kernel: a BPF program was already running on that CPU \
                     (recursion protection)"
                )
            });
        }
        for grown in evictions.grown(Instant::now(), last) {
            lines.push(if json { grown.json_line() } else { grown.text_line() });
        }
        summary.evicted = evictions.total();
        lines.iter().all(|l| print_line(l))
    };
    loop {
        tokio::select! {
            readable = ring.readable_mut() => {
                let mut guard = readable.map_err(|source| Error::System { what: "poll the trace ring buffer", source })?;
                let ring = guard.get_inner_mut();
                while let Some(record) = ring.next() {
                    let Some(event) = event::parse(&record) else { continue };
                    if event.kind & shown_kinds == 0 {
                        continue;
                    }
                    let named = namer.name(&event);
                    if !opts.filter.matches(&event, named.pod.as_deref()) {
                        continue;
                    }
                    if limit.admit(Instant::now()) {
                        summary.shown += 1;
                        let line = if opts.json { event::json_line(&event, &named) } else { event::text_line(&event, &named) };
                        if !print_line(&line) {
                            return Ok(summary);
                        }
                    }
                }
                guard.clear_ready();
            }
            _ = tick.tick() => {
                namer.attributor.next_round();
                if !report(&mut limit, &mut summary, &mut evictions, lost(&dropped), skipped(&probes), false) {
                    return Ok(summary);
                }
            }
            _ = &mut shutdown => break,
        }
    }
    report(&mut limit, &mut summary, &mut evictions, lost(&dropped), skipped(&probes), true);
    drop(probes);
    Ok(summary)
}

/// One line on stdout; false once nobody reads it (`observer trace | head`
/// closed the pipe): the trace ends there, quietly, as other tools do.
fn print_line(line: &str) -> bool {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

fn lost(dropped: &aya::maps::PerCpuArray<aya::maps::MapData, u64>) -> u64 {
    dropped.get(&0, 0).map(|per_cpu| per_cpu.iter().sum()).unwrap_or(0)
}

/// The runs of the trace's programs the kernel has skipped so far (those
/// it counts; an unreadable count reads 0 until it reads again).
fn skipped(probes: &Probes) -> u64 {
    probes.programs.iter().filter(|p| p.skips_counted).filter_map(|p| p.stats().ok()).map(|s| s.missed).sum()
}

/// Names processes (their executable, cached per pid) and their pods (the
/// daemon's attribution), and turns the kernel's clock into wall time.
struct Namer {
    attributor: Attributor,
    proc_root: PathBuf,
    executables: HashMap<u32, String>,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, in nanoseconds, taken at start.
    wall_offset_ns: i128,
    /// When the cgroup tree was last walked again for a cgroup it did not
    /// have (a pod started since): at most every `REWALK_EVERY`.
    last_rewalk: Instant,
}

/// A cgroup unknown to the last walk is looked for again after this long:
/// a new pod's first events are named (and kept by `--pod`), and a storm
/// from new cgroups costs at most ten walks a second.
const REWALK_EVERY: Duration = Duration::from_millis(100);

impl Namer {
    fn new(opts: &Options) -> Self {
        let ns =
            |clock| nix::time::clock_gettime(clock).map(|t| t.tv_sec() as i128 * 1_000_000_000 + t.tv_nsec() as i128);
        let wall_offset_ns = match (ns(nix::time::ClockId::CLOCK_REALTIME), ns(nix::time::ClockId::CLOCK_MONOTONIC)) {
            (Ok(real), Ok(mono)) => real - mono,
            _ => 0,
        };
        Self {
            attributor: Attributor::new(&opts.proc_root, None, opts.pod_logs.clone()),
            proc_root: opts.proc_root.clone(),
            executables: HashMap::new(),
            wall_offset_ns,
            last_rewalk: Instant::now(),
        }
    }

    fn name(&mut self, e: &TraceEvent) -> Named {
        let time = self.time(e);
        let pid = e.actor.tgid;
        if self.executables.len() > 10_000 {
            self.executables.clear();
        }
        let executable = self
            .executables
            .entry(pid)
            .or_insert_with(|| {
                crate::series::executable_name(&e.actor, crate::node::executable::name(&self.proc_root, pid))
            })
            .clone();
        let mut labels = self.attributor.labels(e.actor.cgroup_id, pid);
        if labels.is_none()
            && self.attributor.unknown_cgroup(e.actor.cgroup_id)
            && self.last_rewalk.elapsed() >= REWALK_EVERY
        {
            self.last_rewalk = Instant::now();
            self.attributor.next_round();
            labels = self.attributor.labels(e.actor.cgroup_id, pid);
        }
        let pod = labels.and_then(|l| match (&l.namespace, &l.pod_name) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            _ => None,
        });
        Named { time, executable, pod }
    }

    fn time(&self, e: &TraceEvent) -> String {
        let ns = (i128::from(e.time_ns) + self.wall_offset_ns).max(0) as u128;
        let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(ns as u64);
        humantime::format_rfc3339_micros(at).to_string()
    }
}
