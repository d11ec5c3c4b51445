//! A private network namespace per scenario, deleted on drop, and the
//! kernel's own counters of it (nstat, ss): the ground truth the tests
//! compare observer with.
use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

use crate::churn::{ClientReport, Server, churn};

/// Run `cmd`; its standard output (a failure names the command).
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Whether this kernel counts a TIME_WAIT socket in TcpExtTW/TWKilled when
/// it enters TIME_WAIT (6.1 does, and every later kernel the tests run on)
/// or only when it ends (5.10, as the matrix found). Read from the version,
/// not found by making a TIME_WAIT socket: a daemon already watching would
/// count that socket's process (and take one of its process slots).
pub fn time_wait_counted_at_entry() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    assert!(
        version <= (5, 10) || version >= (6, 1),
        "kernel {release}: not known whether it counts TIME_WAIT on entry (5.10 does not, 6.1 does); \
         teach time_wait_counted_at_entry"
    );
    version >= (6, 1)
}

/// A uniquely named network namespace with loopback up, deleted on drop.
/// Names carry the pid and a counter, so tests can run in parallel.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Where `ip netns` keeps it: a path that opens it (`setns`).
    pub fn path(&self) -> PathBuf {
        Self::path_of(&self.name)
    }

    /// The path of the namespace named `name`, made or not yet.
    pub fn path_of(name: &str) -> PathBuf {
        PathBuf::from("/run/netns").join(name)
    }

    pub fn new() -> Self {
        Self::named(Self::unique_name())
    }

    /// A name no other namespace of these tests has: for a test that must
    /// name its namespace (its path) before making it.
    pub fn unique_name() -> String {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        format!("obs-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
    }

    /// `new`, named `name` (from `unique_name`).
    pub fn named(name: String) -> Self {
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self { name };
        run(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]));
        // Where the kernel counts a TIME_WAIT socket only when it ends
        // (5.10), one that ends early ends uncounted: reused by a new
        // connect() (tcp_tw_reuse, on for loopback by default, after a tick
        // of the seconds clock), or killed by a RST (TIME_WAIT
        // assassination: in a slow guest a retransmitted FIN makes the
        // socket ACK again after the server's side is gone, and the listener
        // answers with a RST; RFC 1337's fix, tcp_rfc1337, ignores it). Both
        // off there, so neither can hide an entry from `time_wait_entered`.
        if !time_wait_counted_at_entry() {
            ns.sysctl("net.ipv4.tcp_tw_reuse", "0");
            ns.sysctl("net.ipv4.tcp_rfc1337", "1");
        }
        ns
    }

    /// A command that runs inside the namespace: the child enters it
    /// before its exec, so the pid is the program's. Not `ip netns exec`:
    /// that is one exec more per command, ~0.2 s in a software-emulated
    /// guest of the kernel matrix, where these tests make hundreds; none of
    /// the programs run here reads /sys, which it would remount.
    pub fn command(&self, program: &str) -> Command {
        let netns = self.open();
        let mut cmd = Command::new(program);
        // SAFETY: between fork and exec only setns(2) runs, on a descriptor
        // opened before the fork; nothing allocates or takes a lock.
        unsafe {
            cmd.pre_exec(move || {
                nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
            });
        }
        cmd
    }

    fn open(&self) -> std::fs::File {
        std::fs::File::open(self.path()).unwrap_or_else(|e| panic!("{}: {e}", self.path().display()))
    }

    /// `f` run on a thread of this process inside the namespace: for what
    /// the kernel answers per namespace through /proc (its sysctls, its
    /// counters), without a process of its own.
    fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let netns = self.open();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // setns(2) moves only the calling thread: this one, which
                    // ends with `f`.
                    nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                        .unwrap_or_else(|e| panic!("setns into {}: {e}", self.name));
                    f()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Set a sysctl of this namespace (e.g. `net.ipv4.tcp_tw_reuse`), as
    /// `sysctl -w` does: the file under /proc/sys, which answers for the
    /// namespace of the thread that opens it.
    pub fn sysctl(&self, key: &str, value: &str) {
        let file = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        self.inside(|| std::fs::write(&file, value))
            .unwrap_or_else(|e| panic!("sysctl {key}={value} in {}: {e}", self.name));
    }

    /// A kernel SNMP/netstat counter of this namespace (e.g.
    /// TcpExtListenOverflows, TcpActiveOpens), absolute value.
    pub fn nstat(&self, counter: &str) -> u64 {
        self.nstat_all(&[counter])[0]
    }

    /// Every counter of this namespace that is not zero (`nstat -as`), for
    /// failure messages.
    pub fn nstat_report(&self) -> String {
        run(self.command("nstat").arg("-as"))
    }

    /// Several counters of this namespace, in order, named as nstat names
    /// them: read where nstat reads them (/proc/net/snmp and netstat of
    /// this namespace), at once.
    pub fn nstat_all(&self, counters: &[&str]) -> Vec<u64> {
        let files = self.inside(|| {
            ["snmp", "netstat"].map(|file| {
                // thread-self: /proc/net is the thread group leader's namespace.
                std::fs::read_to_string(format!("/proc/thread-self/net/{file}")).unwrap()
            })
        });
        let all: HashMap<String, i64> = files.iter().flat_map(|text| kernel_counters(text)).collect();
        counters
            .iter()
            .map(|counter| match all.get(*counter) {
                Some(value) => u64::try_from(*value).unwrap_or_else(|_| panic!("{counter} is {value}")),
                None => panic!("the kernel has no {counter} here: {}", self.nstat_report()),
            })
            .collect()
    }

    /// TIME_WAIT sockets the kernel created in this namespace. The kernel
    /// counts each when its timer is first set, that is on entry, under
    /// TcpExtTW (a full 60 s wait) or TcpExtTWKilled (a short one), and
    /// never again: the sum holds whatever happens to the socket later
    /// (expiry after 60 s, reuse by a new connection, or a RST that kills
    /// it silently, which `ss`, our first ground truth, missed in slow
    /// guests). Both read in one snapshot. Older kernels (5.10) count a
    /// socket there only when its TIME_WAIT ends: there the sockets still
    /// in TIME_WAIT (`ss`, read first) are added to those ended.
    pub fn time_wait_entered(&self) -> u64 {
        let alive = if time_wait_counted_at_entry() { 0 } else { self.in_time_wait() };
        alive + self.nstat_all(&["TcpExtTW", "TcpExtTWKilled"]).iter().sum::<u64>()
    }

    /// The sockets here matching `filter` (an `ss` filter expression)
    /// that closed into timewait sockets (`ss -o` shows their timer as
    /// `timewait`, in TIME-WAIT or, the peer not done, FIN-WAIT-2), and
    /// those left full FIN-WAIT-2 sockets. The second are orphans whose
    /// FIN-WAIT-2 outlasts TIME_WAIT's 60 s (`tcp_fin_timeout` above it),
    /// or whose peer's ACK came while their closer still owned the socket
    /// (`tcp_rcv_state_process`'s "bad case": reset 60 s later, never in
    /// TIME_WAIT). Also whether any is still in FIN-WAIT-1.
    pub fn closed_ends(&self, filter: &str) -> ClosedEnds {
        let out = run(self.command("ss").args(["-Htano", filter]));
        let timewait = |l: &&str| l.contains("timer:(timewait");
        ClosedEnds {
            timewait: out.lines().filter(timewait).count() as u64,
            full_fin_wait2: out.lines().filter(|l| l.starts_with("FIN-WAIT-2") && !timewait(l)).count() as u64,
            fin_wait1: out.lines().filter(|l| l.starts_with("FIN-WAIT-1")).count() as u64,
            ss: out,
        }
    }

    /// Sockets in TIME_WAIT now (`ss`).
    pub fn in_time_wait(&self) -> u64 {
        run(self.command("ss").args(["-Htan", "state", "time-wait"])).lines().count() as u64
    }

    /// Connections waiting in the accept queue of the listener on `port`
    /// (`ss -lnt` Recv-Q).
    pub fn accept_queue(&self, port: u16) -> u64 {
        self.listen_column(port, 1)
    }

    /// The accept queue's limit of the listener on `port`, its backlog
    /// (`ss -lnt` Send-Q).
    pub fn listen_backlog(&self, port: u16) -> u64 {
        self.listen_column(port, 2)
    }

    fn listen_column(&self, port: u16, column: usize) -> u64 {
        let out = run(self.command("ss").args(["-Hltn", &format!("sport = :{port}")]));
        out.split_whitespace()
            .nth(column)
            .and_then(|q| q.parse().ok())
            .unwrap_or_else(|| panic!("no listener on {port}: {out}"))
    }

    /// The drop counter (`sk_drops`) of the listener on `port`, as
    /// `ss -ltnm` shows it (`skmem:(...,d<drops>)`).
    pub fn listener_drops(&self, port: u16) -> u64 {
        let out = run(self.command("ss").args(["-Hltnm", &format!("sport = :{port}")]));
        let skmem = out.split("skmem:(").nth(1).unwrap_or_else(|| panic!("no listener on {port}: {out}"));
        skmem
            .split([',', ')'])
            .find_map(|field| field.strip_prefix('d').and_then(|n| n.parse().ok()))
            .unwrap_or_else(|| panic!("no drop count in `{out}`"))
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
        // Standard input for `Server::close_oldest`: the others never read it.
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn server");
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

impl Netns {
    /// Run `observer-churn connect --hold --until-eof ...` here: returns
    /// once every attempt is made, with the connections still open; they
    /// close when the returned client is dropped.
    pub fn client_holding(&self, args: &[&str]) -> HoldingClient {
        self.start_holding(self.command(&churn()), args)
    }

    /// `client_holding`, with at most `limit` open files (as
    /// `serve_with_open_files_limit`).
    pub fn client_holding_with_open_files_limit(&self, limit: u32, args: &[&str]) -> HoldingClient {
        let mut cmd = self.command("prlimit");
        cmd.args([format!("--nofile={limit}:{limit}"), churn()]);
        self.start_holding(cmd, args)
    }

    fn start_holding(&self, mut cmd: Command, args: &[&str]) -> HoldingClient {
        let mut child = cmd
            .args(["connect", "--hold", "--until-eof"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn client");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let report = ClientReport::parse(child.id(), &line);
        HoldingClient { child, report }
    }

    /// The ESTABLISHED connections `ss` lists here matching `filter` (an
    /// `ss` filter expression, e.g. "dport = :5432"), of process `pid`
    /// only if given (`ss -p`: the process holding each socket).
    pub fn established(&self, filter: &str, pid: Option<u32>) -> u64 {
        let out = run(self.command("ss").args(["-Htnp", "state", "established"]).arg(filter));
        let owner = pid.map(|p| format!("pid={p},"));
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .filter(|l| owner.as_ref().is_none_or(|o| l.contains(o.as_str())))
            .count() as u64
    }
}

/// The counters of /proc/net/snmp or /proc/net/netstat by nstat's names:
/// each group is a line of names after its prefix ("TcpExt: ... TW ...")
/// and a line of values after the same prefix; the name is the two joined
/// ("TcpExtTW").
fn kernel_counters(text: &str) -> Vec<(String, i64)> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter_map(|pair| {
            let (names, values) = (pair.first()?.split_once(": ")?, pair.get(1)?.split_once(": ")?);
            (names.0 == values.0).then_some((names.0, names.1, values.1))
        })
        .flat_map(|(prefix, names, values)| {
            names
                .split_whitespace()
                .zip(values.split_whitespace())
                .map(move |(name, value)| (format!("{prefix}{name}"), value.parse().unwrap()))
        })
        .collect()
}

/// What became of the ends closed first (`Netns::closed_ends`).
#[derive(Debug)]
pub struct ClosedEnds {
    pub timewait: u64,
    pub full_fin_wait2: u64,
    pub fin_wait1: u64,
    /// What `ss` listed, for failure messages.
    pub ss: String,
}

/// A client holding its connections open (`Netns::client_holding`).
pub struct HoldingClient {
    child: std::process::Child,
    pub report: ClientReport,
}

impl HoldingClient {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Close the connections and wait for the client to end.
    pub fn close(mut self) {
        self.end();
    }

    fn end(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for HoldingClient {
    fn drop(&mut self) {
        self.end();
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_as_nstat_names_them() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 2 64\nTcp: RtoAlgorithm MaxConn ActiveOpens\nTcp: 1 -1 343576\n\
                    TcpExt: SyncookiesSent TW\nTcpExt: 0 260004\n";
        let counters: HashMap<String, i64> = kernel_counters(text).into_iter().collect();
        assert_eq!(counters["TcpActiveOpens"], 343_576);
        assert_eq!(counters["TcpMaxConn"], -1);
        assert_eq!(counters["TcpExtTW"], 260_004);
        assert_eq!(counters["IpDefaultTTL"], 64);
        assert_eq!(counters.len(), 7);
    }
}
