//! Shared pieces of the kernel tests: observer's probes and rounds, loaded
//! for real, and the tools `cargo xtask setup` installs. The network
//! namespace, the churn generator and the kernel's own counters come from
//! `observer-testing`, shared with the benchmark.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod daemon;
pub mod flood;
pub mod incidents;
pub mod manifests;
pub mod pods;
pub mod prometheus;

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
    time::{Duration, Instant},
};

use observer::{
    collect::{DropReason, ListenerDrops},
    config::RunConfig,
    probes::{AttachMode, Probes},
    round::Rounds,
};
use observer_common::{ConnectErrorKey, ConnectionCounts, ConnectionKey, ProcCounters, direction};

/// observer's probes, loaded and attached for real, and everything they
/// counted since, summed over rounds: the daemon's own rounds (node sweep,
/// kernel maps, series), with a grace of an hour.
pub struct Observer {
    pub probes: Probes,
    rounds: Rounds,
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
    pub fn start() -> Self {
        let (probes, maps) =
            Probes::load(test_mode()).unwrap_or_else(|e| panic!("loading probes: {}", observer::error::report(&e)));
        let config = RunConfig { grace: Duration::from_secs(3600), ..RunConfig::default() };
        let mut rounds = Rounds::new(maps, probes.attachments.clone(), probes.programs.clone(), &config);
        // The first round sets the listener baseline, as the daemon's does.
        rounds.run(Instant::now()).unwrap();
        Self {
            probes,
            rounds,
            procs: HashMap::new(),
            errors: HashMap::new(),
            drops: Vec::new(),
            connections: HashMap::new(),
            open_connections: Vec::new(),
            lost: Vec::new(),
            unseen_connections: 0,
            connection_checks: HashMap::new(),
        }
    }

    pub fn collect(&mut self) {
        let d = self.rounds.run(Instant::now()).unwrap().deltas;
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
        }
        self.open_connections = d.open_connections;
        self.lost = d.lost.to_vec();
        self.unseen_connections = d.unseen_connections;
        self.connection_checks = d.connection_checks;
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
            // One read per program: the sum and its parts must agree.
            let missed: Vec<(&str, u64)> = self
                .probes
                .programs
                .iter()
                .filter_map(|p| p.stats().ok().filter(|s| s.missed > 0).map(|s| (p.program, s.missed)))
                .collect();
            let detail: Vec<String> = missed.iter().map(|(program, n)| format!("{program}={n}")).collect();
            eprintln!("OBSERVER_KERNEL_MISSED={} {}", missed.iter().map(|(_, n)| n).sum::<u64>(), detail.join(" "));
            // An older kernel skips some programs' runs silently: a
            // failure there may be one, which it cannot say.
            let uncounted: Vec<&str> =
                self.probes.programs.iter().filter(|p| !p.skips_counted).map(|p| p.program).collect();
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
