//! Shared pieces of the kernel tests: a private network namespace per test,
//! the churn generator run inside it, the kernel's own counters (nstat, ss),
//! and the observer's probes and collector, loaded for real.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod daemon;
pub mod prometheus;

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
    collections::{BTreeMap, HashMap},
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use observer::{
    collect::ListenerDrops,
    daemon::RunConfig,
    probes::{AttachMode, Probes},
    round::Rounds,
};
use observer_common::{ConnectErrorKey, ProcCounters};

/// The churn generator: the one cargo built next to this test, unless the
/// kernel matrix runs a snapshot of both from elsewhere (OBSERVER_CHURN).
pub fn churn() -> String {
    std::env::var("OBSERVER_CHURN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_observer-churn").to_string())
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A uniquely named network namespace with loopback up, deleted on drop.
/// Names carry the pid and a counter, so tests can run in parallel.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!("obs-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self { name };
        run(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]));
        ns
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    pub fn sysctl(&self, key: &str, value: &str) {
        run(self.command("sysctl").args(["-qw", &format!("{key}={value}")]));
    }

    /// A kernel SNMP/netstat counter of this namespace (e.g.
    /// TcpExtListenOverflows, TcpActiveOpens), absolute value.
    pub fn nstat(&self, counter: &str) -> u64 {
        self.nstat_all(&[counter])[0]
    }

    /// Several counters of this namespace from one snapshot, in order.
    pub fn nstat_all(&self, counters: &[&str]) -> Vec<u64> {
        let out = run(self.command("nstat").arg("-asz").args(counters));
        counters
            .iter()
            .map(|counter| {
                out.lines()
                    .find_map(|l| {
                        let mut f = l.split_whitespace();
                        (f.next() == Some(*counter)).then(|| f.next().unwrap().parse().unwrap())
                    })
                    .unwrap_or_else(|| panic!("nstat has no {counter}: {out}"))
            })
            .collect()
    }

    /// TIME_WAIT sockets the kernel created in this namespace. The kernel
    /// counts each when its timer is first set, that is on entry, under
    /// TcpExtTW (a full 60 s wait) or TcpExtTWKilled (a short one), and
    /// never again: the sum holds whatever happens to the socket later
    /// (expiry after 60 s, reuse by a new connection, or a RST that kills
    /// it silently, which `ss`, our first ground truth, missed in slow
    /// guests). Both read in one snapshot.
    pub fn time_wait_entered(&self) -> u64 {
        self.nstat_all(&["TcpExtTW", "TcpExtTWKilled"]).iter().sum()
    }

    /// Connections waiting in the accept queue of the listener on `port`
    /// (`ss -lnt` Recv-Q).
    pub fn accept_queue(&self, port: u16) -> u64 {
        let out = run(self.command("ss").args(["-Hltn", &format!("sport = :{port}")]));
        out.split_whitespace()
            .nth(1)
            .and_then(|q| q.parse().ok())
            .unwrap_or_else(|| panic!("no listener on {port}: {out}"))
    }

    /// Every TCP socket of the namespace, for failure messages.
    pub fn ss_all(&self) -> String {
        run(self.command("ss").args(["-Htan"]))
    }

    /// Start `observer-churn serve ...` here; returns once it listens.
    pub fn serve(&self, args: &[&str]) -> Server {
        self.start_server(self.command(&churn()).arg("serve").args(args))
    }

    /// `serve`, with at most `limit` open files (RLIMIT_NOFILE, set by
    /// prlimit, which then execs the server: the pid stays the server's).
    pub fn serve_with_open_files_limit(&self, limit: u32, args: &[&str]) -> Server {
        let nofile = format!("--nofile={limit}:{limit}");
        self.start_server(self.command("prlimit").args([nofile.as_str(), &churn(), "serve"]).args(args))
    }

    fn start_server(&self, cmd: &mut Command) -> Server {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn server");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "server did not start");
        Server { child }
    }

    /// Run `observer-churn connect ...` here to completion.
    pub fn client(&self, args: &[&str]) -> ClientReport {
        let child =
            self.command(&churn()).arg("connect").args(args).stdout(Stdio::piped()).spawn().expect("spawn client");
        // `ip netns exec` execs the program: the child's pid is the client's.
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "client failed");
        ClientReport::parse(pid, &String::from_utf8(out.stdout).unwrap())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

pub struct Server {
    child: Child,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the client saw: connections made and errno of each failure.
#[derive(Debug)]
pub struct ClientReport {
    pub pid: u32,
    pub connected: u64,
    pub errors: BTreeMap<String, u64>,
}

impl ClientReport {
    fn parse(pid: u32, out: &str) -> Self {
        let mut report = ClientReport { pid, connected: 0, errors: BTreeMap::new() };
        for field in out.split_whitespace() {
            match field.split_once('=') {
                Some(("connected", n)) => report.connected = n.parse().unwrap(),
                Some(("errors", list)) => {
                    for item in list.split(',').filter(|s| !s.is_empty()) {
                        let (name, n) = item.split_once(':').unwrap();
                        report.errors.insert(name.to_string(), n.parse().unwrap());
                    }
                }
                _ => {}
            }
        }
        report
    }

    pub fn errors(&self, name: &str) -> u64 {
        self.errors.get(name).copied().unwrap_or(0)
    }
}

/// observer's probes, loaded and attached for real, and everything they
/// counted since, summed over rounds: the daemon's own rounds (node sweep,
/// kernel maps, series), with a grace of an hour.
pub struct Observer {
    pub probes: Probes,
    rounds: Rounds,
    procs: HashMap<(u32, u16), ProcCounters>,
    errors: HashMap<ConnectErrorKey, u64>,
    drops: Vec<ListenerDrops>,
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
        let (probes, maps) = Probes::load(test_mode()).unwrap_or_else(|e| panic!("loading probes: {e}"));
        let settings = RunConfig { grace: Duration::from_secs(3600), ..RunConfig::default() }.round_settings();
        let mut rounds = Rounds::new(maps, probes.attachments.clone(), probes.programs.clone(), settings);
        // The first round sets the listener baseline, as the daemon's does.
        rounds.run(Instant::now()).unwrap();
        Self { probes, rounds, procs: HashMap::new(), errors: HashMap::new(), drops: Vec::new() }
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

    /// All connect() failures of `pid`, whatever the destination or errno.
    pub fn all_connect_errors(&self, pid: u32) -> u64 {
        self.errors.iter().filter(|(k, _)| k.actor.tgid == pid).map(|(_, n)| n).sum()
    }

    /// Listen drops charged to `pid` on `port`.
    pub fn listen_drops(&self, pid: u32, port: u16) -> u64 {
        self.drops.iter().filter(|d| d.owner.tgid == pid && d.port == port).map(|d| d.drops).sum()
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
        }
    }
}

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
