//! Shared pieces of the kernel tests: observer's probes and rounds, loaded
//! for real, and the tools `cargo xtask setup` installs. The network
//! namespace, the churn generator and the kernel's own counters come from
//! `observer-testing`, shared with the benchmark.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod daemon;
pub mod flood;
pub mod incidents;
pub mod loads;
pub mod manifests;
pub mod pods;
pub mod prometheus;
pub mod web;

/// The port-exhaustion incident in its own namespace: 6 ports, 9 held
/// connections; the client sees 3 EADDRNOTAVAIL. Returns (netns, server,
/// client pid, failures the client saw); keep the netns and the server
/// alive while the counts are read.
pub fn exhaust_ports() -> (observer_testing::Netns, observer_testing::Server, u32, u64) {
    let ns = observer_testing::Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41005");
    let server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let client = ns.client(&["--to", "127.0.0.1:8080", "--count", "9", "--hold"]);
    let failures = client.errors("EADDRNOTAVAIL");
    assert_eq!((client.connected, failures), (6, 3), "{client:?}");
    (ns, server, client.pid, failures)
}

/// Run `cmd` with `input` on its standard input; its output.
pub fn run_with_input(cmd: &mut Command, input: &[u8]) -> std::process::Output {
    use std::io::Write as _;
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// A tool `cargo xtask setup` installs, from its environment variable
/// (set by `cargo xtask test`), else the program on PATH. Missing is a
/// failure naming the fix, never a skip.
pub fn tool(var: &str, program: &str) -> std::path::PathBuf {
    let path = std::env::var_os(var).map(std::path::PathBuf::from).unwrap_or_else(|| program.into());
    let found = Command::new(&path).arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(
        found.is_ok_and(|s| s.success()),
        "{program} not found at {}: run the tests with `cargo xtask test`, which installs it",
        path.display()
    );
    path
}

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    sync::{Arc, Mutex, MutexGuard, Weak},
    time::{Duration, Instant},
};

use observer::{
    collect::{Deltas, DropReason, ListenerDrops},
    config::RunConfig,
    probes::{AttachMode, Attachment, Probes},
    round::Rounds,
};
use observer_common::{ConnectErrorKey, ConnectionCounts, ConnectionKey, ProcCounters, ProcKey, direction};

/// observer's probes, loaded and attached for real, and everything they
/// counted since this observer started, summed over rounds: the daemon's
/// own rounds (node sweep, kernel maps, series), with a grace of an hour.
///
/// `start` reads the test binary's one shared load (`Shared`); `start_own`
/// loads the programs for this observer alone, for a test about what a
/// start finds (sockets, listeners older than observer), one that changes
/// what every load would see (a failpoint, lost updates), or one whose
/// rounds must be its own (none between two of its steps). Either waits
/// its turn (`loads`): no other test's load attaches or detaches while
/// it counts.
pub struct Observer {
    source: Source,
    procs: HashMap<(u32, u16), ProcCounters>,
    errors: HashMap<ConnectErrorKey, u64>,
    drops: Vec<ListenerDrops>,
    connections: HashMap<ConnectionKey, ConnectionCounts>,
    /// The connections open as of the last round (not summed: a state).
    open_connections: Vec<(ConnectionKey, u64)>,
    /// Kernel updates lost to full maps, by `lost` slot (cumulative).
    lost: Vec<u64>,
    /// Connections whose start or end the programs missed, by the check
    /// of the ledger against quiet namespaces, and the checks it made per
    /// namespace (cumulative).
    pub unseen_connections: u64,
    pub connection_checks: HashMap<u32, u64>,
    /// Declared last, so that it is released after `source`'s programs
    /// are detached.
    _turn: Turn,
}

/// This observer's turn among the binary's loads (`loads`).
enum Turn {
    Reading(loads::SharedReader),
    Alone(loads::OwnLoad),
}

enum Source {
    /// Boxed: a load is large beside the shared variant's inbox.
    Own { probes: Box<Probes>, rounds: Box<Rounds> },
    /// The shared load: the rounds run since this observer started come
    /// through its inbox; `since`, the cumulative counts as of then.
    Shared { inbox: Arc<Mutex<Vec<Seen>>>, since: Cumulative },
}

/// A load's counts that are cumulative from its start, as of one round.
#[derive(Clone, Default)]
struct Cumulative {
    lost: Vec<u64>,
    unseen_connections: u64,
    connection_checks: HashMap<u32, u64>,
}

impl Cumulative {
    /// `now`'s counts since `self`'s round.
    fn since(&self, now: Cumulative) -> Cumulative {
        let before = |i: usize| self.lost.get(i).copied().unwrap_or(0);
        Cumulative {
            lost: now.lost.iter().enumerate().map(|(i, n)| n.saturating_sub(before(i))).collect(),
            unseen_connections: now.unseen_connections.saturating_sub(self.unseen_connections),
            connection_checks: now
                .connection_checks
                .into_iter()
                .map(|(netns, n)| (netns, n.saturating_sub(self.connection_checks.get(&netns).copied().unwrap_or(0))))
                .collect(),
        }
    }
}

/// What a round told: the parts of its deltas the tests read.
#[derive(Clone, Default)]
struct Seen {
    procs: Vec<(ProcKey, ProcCounters)>,
    connect_errors: Vec<(ConnectErrorKey, u64)>,
    listen_drops: Vec<ListenerDrops>,
    connections: Vec<(ConnectionKey, ConnectionCounts)>,
    open_connections: Vec<(ConnectionKey, u64)>,
    cumulative: Cumulative,
}

impl From<Deltas> for Seen {
    fn from(d: Deltas) -> Self {
        Self {
            procs: d.procs,
            connect_errors: d.connect_errors,
            listen_drops: d.listen_drops,
            connections: d.connections,
            open_connections: d.open_connections,
            cumulative: Cumulative {
                lost: d.lost.to_vec(),
                unseen_connections: d.unseen_connections,
                connection_checks: d.connection_checks,
            },
        }
    }
}

/// The test binary's probes, loaded once and read by every `Observer::start`
/// of its tests, as one daemon's serve every process on a node: each round
/// any of them runs goes to all. A load costs a test ~4 s under the kernel
/// matrix's software emulation (the kernel's BTF read and parsed, the
/// programs verified and attached, then detached), where most tests take
/// less than that themselves. Each test reads its own processes' counts,
/// so tests side by side (the host's test threads) do not see each other's.
struct Shared {
    probes: Probes,
    rounds: Rounds,
    inboxes: Vec<Weak<Mutex<Vec<Seen>>>>,
}

static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

/// The shared load, made by the first test that asks. A test that fails
/// while holding it poisons the lock; the next ones read on (what a failed
/// test left is its own processes' counts).
fn shared() -> MutexGuard<'static, Option<Shared>> {
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if shared.is_none() {
        let (probes, rounds) = load();
        *shared = Some(Shared { probes, rounds, inboxes: Vec::new() });
    }
    shared
}

impl Shared {
    /// Run a round and hand what it saw to every observer still reading.
    fn round(&mut self) -> Seen {
        let seen = Seen::from(self.rounds.run(Instant::now()).unwrap().deltas);
        self.inboxes.retain(|inbox| match inbox.upgrade() {
            Some(inbox) => {
                inbox.lock().unwrap_or_else(|e| e.into_inner()).push(seen.clone());
                true
            }
            None => false,
        });
        seen
    }
}

/// Load and attach the programs in the test's mode, and run the first round
/// (it sets the listener baseline, as the daemon's does).
fn load() -> (Probes, Rounds) {
    let (probes, maps) =
        Probes::load(test_mode()).unwrap_or_else(|e| panic!("loading probes: {}", observer::error::report(&e)));
    let config = RunConfig { grace: Duration::from_secs(3600), ..RunConfig::default() };
    let mut rounds = Rounds::new(maps, probes.attachments.clone(), probes.programs.clone(), &config);
    rounds.run(Instant::now()).unwrap();
    (probes, rounds)
}

/// The attach mode of the kernel tests: `auto`, or the one the kernel
/// matrix (`cargo xtask test --vm`) forces through OBSERVER_TEST_ATTACH_MODE,
/// so every counting test runs in every mode.
pub fn test_mode() -> AttachMode {
    use clap::ValueEnum as _;
    match std::env::var("OBSERVER_TEST_ATTACH_MODE") {
        Ok(mode) => AttachMode::from_str(&mode, true).unwrap_or_else(|e| panic!("OBSERVER_TEST_ATTACH_MODE: {e}")),
        Err(_) => AttachMode::Auto,
    }
}

impl Observer {
    /// An observer of the test binary's shared load, counting from now:
    /// a round is run first, so what came before is not this test's.
    pub fn start() -> Self {
        let turn = Turn::Reading(loads::read_shared());
        let mut shared = shared();
        let shared = shared.as_mut().unwrap();
        let since = shared.round().cumulative;
        let inbox = Arc::new(Mutex::new(Vec::new()));
        shared.inboxes.push(Arc::downgrade(&inbox));
        Self::new(Source::Shared { inbox, since }, turn)
    }

    /// An observer with a load of its own, made now.
    pub fn start_own() -> Self {
        let turn = Turn::Alone(loads::own_load());
        let (probes, rounds) = load();
        Self::new(Source::Own { probes: Box::new(probes), rounds: Box::new(rounds) }, turn)
    }

    fn new(source: Source, turn: Turn) -> Self {
        Self {
            source,
            procs: HashMap::new(),
            errors: HashMap::new(),
            drops: Vec::new(),
            connections: HashMap::new(),
            open_connections: Vec::new(),
            lost: Vec::new(),
            unseen_connections: 0,
            connection_checks: HashMap::new(),
            _turn: turn,
        }
    }

    /// Where each hook attached, and how.
    pub fn attachments(&self) -> Vec<Attachment> {
        match &self.source {
            Source::Own { probes, .. } => probes.attachments.clone(),
            Source::Shared { .. } => shared().as_ref().unwrap().probes.attachments.clone(),
        }
    }

    /// Run a round (of the shared load, for every observer reading it) and
    /// add what it and the rounds other tests ran since saw.
    pub fn collect(&mut self) {
        let rounds = match &mut self.source {
            Source::Own { rounds, .. } => vec![Seen::from(rounds.run(Instant::now()).unwrap().deltas)],
            Source::Shared { inbox, .. } => {
                shared().as_mut().unwrap().round();
                std::mem::take(&mut *inbox.lock().unwrap_or_else(|e| e.into_inner()))
            }
        };
        for seen in rounds {
            self.add(seen);
        }
    }

    fn add(&mut self, d: Seen) {
        for (key, delta) in d.procs {
            let e = self.procs.entry((key.actor.tgid, key.family)).or_default();
            e.connects += delta.connects;
            e.accepts += delta.accepts;
            e.time_wait_entries += delta.time_wait_entries;
        }
        for (key, n) in d.connect_errors {
            *self.errors.entry(key).or_default() += n;
        }
        self.drops.extend(d.listen_drops);
        for (key, counts) in d.connections {
            let total = self.connections.entry(key).or_default();
            total.established += counts.established;
            for (t, n) in total.closed.iter_mut().zip(counts.closed) {
                *t += n;
            }
            for (t, n) in total.handshakes.iter_mut().zip(counts.handshakes) {
                *t += n;
            }
            total.handshake_retransmits += counts.handshake_retransmits;
            total.closed_older += counts.closed_older;
            total.closed_by_peer += counts.closed_by_peer;
        }
        self.open_connections = d.open_connections;
        // The cumulative counts, from this observer's start.
        let Cumulative { lost, unseen_connections, connection_checks } = match &self.source {
            Source::Shared { since, .. } => since.since(d.cumulative),
            Source::Own { .. } => d.cumulative,
        };
        (self.lost, self.unseen_connections, self.connection_checks) = (lost, unseen_connections, connection_checks);
    }

    /// Kernel updates lost to full maps so far, by `lost` slot.
    pub fn lost(&self) -> Vec<u64> {
        self.lost.clone()
    }

    /// The connection keys of `pid` in direction `dir` toward port `port`
    /// (outbound: the server's; inbound: the listener's).
    fn is_connection(key: &ConnectionKey, pid: u32, dir: u32, port: u16) -> bool {
        key.actor.tgid == pid && key.direction == dir && key.port == port
    }

    /// Connections of `pid` open now (as of the last round).
    pub fn open_connections(&self, pid: u32, dir: u32, port: u16) -> u64 {
        self.open_connections.iter().filter(|(k, _)| Self::is_connection(k, pid, dir, port)).map(|(_, n)| n).sum()
    }

    /// Every connection key open now, whoever holds it.
    pub fn open_connection_keys(&self) -> Vec<(ConnectionKey, u64)> {
        self.open_connections.clone()
    }

    /// Connections of `pid` established and closed (by kernel lifetime
    /// bucket) since the start.
    pub fn connection_counts(&self, pid: u32, dir: u32, port: u16) -> ConnectionCounts {
        let mut total = ConnectionCounts::default();
        for (_, c) in self.connections.iter().filter(|(k, _)| Self::is_connection(k, pid, dir, port)) {
            total.established += c.established;
            for (t, n) in total.closed.iter_mut().zip(c.closed) {
                *t += n;
            }
            for (t, n) in total.handshakes.iter_mut().zip(c.handshakes) {
                *t += n;
            }
            total.handshake_retransmits += c.handshake_retransmits;
            total.closed_older += c.closed_older;
            total.closed_by_peer += c.closed_by_peer;
        }
        total
    }

    /// Counters of one process over all address families.
    pub fn process(&self, pid: u32) -> ProcCounters {
        self.procs.iter().filter(|((p, _), _)| *p == pid).fold(ProcCounters::default(), |a, (_, v)| ProcCounters {
            connects: a.connects + v.connects,
            accepts: a.accepts + v.accepts,
            time_wait_entries: a.time_wait_entries + v.time_wait_entries,
        })
    }

    /// Every process with TIME_WAIT entries charged to it, and how many
    /// (pid 0: sockets whose owner was not known): where an entry went
    /// when the expected process is short of one.
    pub fn time_wait_entries_by_process(&self) -> Vec<(u32, u64)> {
        let mut by_pid = std::collections::BTreeMap::<u32, u64>::new();
        for ((pid, _), counters) in &self.procs {
            if counters.time_wait_entries > 0 {
                *by_pid.entry(*pid).or_default() += counters.time_wait_entries;
            }
        }
        by_pid.into_iter().collect()
    }

    /// connect() failures of `pid` toward `dest` with `errno`.
    pub fn connect_errors(&self, pid: u32, dest: std::net::SocketAddr, errno: u32) -> u64 {
        self.errors
            .iter()
            .filter(|(k, _)| {
                k.actor.tgid == pid
                    && k.errno == errno
                    && k.dport == dest.port()
                    && observer::series::dest_addr(k) == dest.ip()
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// connect() failures of `pid` with `errno` whose key has the
    /// destination address bytes `daddr` (e.g. the kernel's folded one).
    pub fn connect_errors_to(&self, pid: u32, daddr: [u8; 16], errno: u32) -> u64 {
        self.errors
            .iter()
            .filter(|(k, _)| k.actor.tgid == pid && k.errno == errno && k.daddr == daddr)
            .map(|(_, n)| n)
            .sum()
    }

    /// All connect() failures of `pid`, whatever the destination or errno.
    pub fn all_connect_errors(&self, pid: u32) -> u64 {
        self.errors.iter().filter(|(k, _)| k.actor.tgid == pid).map(|(_, n)| n).sum()
    }

    /// Listen overflows charged to `pid` on `port`.
    pub fn listen_drops(&self, pid: u32, port: u16) -> u64 {
        self.listener_drops(pid, port, DropReason::Overflow)
    }

    /// Connections `pid`'s listener on `port` turned away for `reason`.
    pub fn listener_drops(&self, pid: u32, port: u16, reason: DropReason) -> u64 {
        let of = |d: &&ListenerDrops| d.owner.tgid == pid && d.port == port && d.reason == reason;
        self.drops.iter().filter(of).map(|d| d.drops).sum()
    }

    /// Every drop counted on `port`, whoever it was charged to, as text:
    /// for a failure that must say where a count went.
    pub fn drops_on_port(&self, port: u16) -> String {
        let on_port = self.drops.iter().filter(|d| d.port == port);
        let lines: Vec<String> =
            on_port.map(|d| format!("pid {} netns {} {:?}: {}", d.owner.tgid, d.netns, d.reason, d.drops)).collect();
        if lines.is_empty() { "none".to_string() } else { lines.join("; ") }
    }

    /// The executable name observer recorded for `pid`.
    pub fn comm_of(&self, pid: u32) -> Option<String> {
        self.errors.keys().map(|k| &k.actor).find(|a| a.tgid == pid).map(|a| a.comm_str().to_string())
    }
}

impl Drop for Observer {
    /// A failing test says whether the kernel skipped any of our programs'
    /// runs (recursion protection; see `probes::stats`): the kernel matrix
    /// reads this line to tell such a failure from a counting bug.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let shared;
            let programs = match &self.source {
                Source::Own { probes, .. } => &probes.programs,
                Source::Shared { .. } => {
                    shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
                    &shared.as_ref().unwrap().probes.programs
                }
            };
            // One read per program: the sum and its parts must agree.
            let missed: Vec<(&str, u64)> = programs
                .iter()
                .filter_map(|p| p.stats().ok().filter(|s| s.missed > 0).map(|s| (p.program, s.missed)))
                .collect();
            let detail: Vec<String> = missed.iter().map(|(program, n)| format!("{program}={n}")).collect();
            eprintln!("OBSERVER_KERNEL_MISSED={} {}", missed.iter().map(|(_, n)| n).sum::<u64>(), detail.join(" "));
            // An older kernel skips some programs' runs silently: a
            // failure there may be one, which it cannot say.
            let uncounted: Vec<&str> = programs.iter().filter(|p| !p.skips_counted).map(|p| p.program).collect();
            if !uncounted.is_empty() {
                eprintln!("OBSERVER_KERNEL_SKIPS_UNCOUNTED programs={}", uncounted.join(","));
            }
        }
    }
}

/// Outbound and inbound, as the connection keys say them.
pub const OUTBOUND: u32 = direction::OUTBOUND;
pub const INBOUND: u32 = direction::INBOUND;

/// Collect until `done` holds or 30 s pass (kernel events on loopback land
/// within milliseconds; the deadline only bounds a failing test, and is
/// generous for the software-emulated VMs of the kernel matrix).
pub fn collect_until(obs: &mut Observer, mut done: impl FnMut(&Observer) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        obs.collect();
        if done(obs) || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
