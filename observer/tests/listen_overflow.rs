//! A listener that never accepts: its queue fills and the kernel drops new
//! connections. observer must charge the drops to the listener's owner and
//! port, and match the namespace's TcpExtListenOverflows exactly, also when
//! the listener is gone before observer's next round, and on both of the
//! kernel's paths (a SYN, and the handshake's last ACK).
mod common;

use std::{
    process::Child,
    time::{Duration, Instant},
};

use common::{Observer, collect_until};
use observer::{collect::DropReason, node::sweep::KERNEL_CHECK_EVERY};
use observer_testing::{Netns, churn};

/// Overflow a never-accepting listener on `addr` (port `port`) with 8
/// connection attempts; observer starts before the listener exists, or
/// after (then no listen() was seen and the owner is found another way).
fn overflow(addr: &str, port: u16, listener_first: bool) {
    let ns = Netns::new();
    let mut obs = (!listener_first).then(Observer::start);
    let server = ns.serve(&["--listen", addr, "--backlog", "1", "--never-accept"]);
    // A listener older than observer: a start of its own, after it.
    let mut obs = obs.take().unwrap_or_else(Observer::start_own);
    let before = ns.nstat("TcpExtListenOverflows");

    // Each client socket is closed after 200 ms, so no SYN is retransmitted
    // after the clients are done and the counters settle.
    ns.client(&["--to", addr, "--count", "8", "--nonblocking", "200ms"]);
    std::thread::sleep(Duration::from_millis(300));
    let overflows = ns.nstat("TcpExtListenOverflows") - before;
    assert!(overflows > 0, "the scenario must overflow the accept queue");

    collect_until(&mut obs, |o| o.listen_drops(server.pid(), port) >= overflows);
    assert_eq!(obs.listen_drops(server.pid(), port), overflows);
}

#[test]
fn drops_equal_listen_overflows_and_are_charged_to_the_owner() {
    overflow("127.0.0.1:8081", 8081, false);
}

#[test]
fn a_listener_older_than_observer_is_charged_to_its_owner_too() {
    overflow("[::1]:8082", 8082, true);
}

/// A listening socket on 127.0.0.1:`port` in the namespace at `netns`,
/// made by a thread of this process that enters it: so no process lives
/// in that namespace, and its `ip netns` handle is the only way to it.
fn listen_in(netns: &std::path::Path, port: u16) -> std::os::fd::OwnedFd {
    use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, socket};
    let netns = netns.to_owned();
    std::thread::spawn(move || {
        let handle = std::fs::File::open(&netns).unwrap();
        nix::sched::setns(std::os::fd::AsFd::as_fd(&handle), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::empty(), None).unwrap();
        bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::new(127, 0, 0, 1, port)).unwrap();
        listen(&fd, Backlog::new(1).unwrap()).unwrap();
        fd
    })
    .join()
    .unwrap()
}

/// A namespace missing from some sweeps (here: its `ip netns` handle
/// unmounted, then mounted again) must not have its listeners' drops
/// counted twice when it is back.
#[test]
fn a_namespace_missing_from_some_sweeps_does_not_count_its_drops_twice() {
    let ns = Netns::new();
    let port = 8083;
    let mut obs = Observer::start();
    let _listener = listen_in(&ns.path(), port);
    let owner = std::process::id();
    let before = ns.nstat("TcpExtListenOverflows");
    let overflow = || {
        ns.client(&["--to", "127.0.0.1:8083", "--count", "8", "--nonblocking", "200ms"]);
        std::thread::sleep(Duration::from_millis(300));
        ns.nstat("TcpExtListenOverflows") - before
    };
    let first = overflow();
    assert!(first > 0, "the scenario must overflow the accept queue");
    collect_until(&mut obs, |o| o.listen_drops(owner, port) >= first);
    assert_eq!(obs.listen_drops(owner, port), first);

    // Unmount the handle (kept open to mount it back): rounds go by
    // without the namespace.
    let handle = std::fs::File::open(ns.path()).unwrap();
    nix::mount::umount2(&ns.path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
    for _ in 0..3 {
        obs.collect();
    }
    let back = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle));
    nix::mount::mount(Some(back.as_str()), &ns.path(), None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
        .unwrap();

    let total = overflow();
    assert!(total > first, "the second batch overflows too");
    collect_until(&mut obs, |o| o.listen_drops(owner, port) >= total);
    // Settle: a double count would show in the rounds after.
    for _ in 0..3 {
        obs.collect();
    }
    assert_eq!(obs.listen_drops(owner, port), total, "TcpExtListenOverflows says {total}");
}

/// Read rounds until the count settles at what the kernel says, then a few
/// more: a double count would show in them.
fn settle(obs: &mut Observer, owners: &[u32], port: u16, expected: u64) -> u64 {
    let total = |o: &Observer| owners.iter().map(|pid| o.listen_drops(*pid, port)).sum::<u64>();
    collect_until(obs, |o| total(o) >= expected);
    for _ in 0..3 {
        obs.collect();
    }
    total(obs)
}

/// The avalanche's own pattern: a server falls behind, its accept queue
/// overflows, and it is killed before observer's next round (rounds are
/// this test's to make: none runs between the overflow and the kill).
#[test]
fn a_listener_killed_right_after_overflowing_is_counted() {
    let ns = Netns::new();
    // Its own rounds: a shared load's would run whenever a test beside it
    // asks, between the overflow and the kill too.
    let mut obs = Observer::start_own();
    let before = ns.nstat("TcpExtListenOverflows");
    let server = ns.serve(&["--listen", "127.0.0.1:7900", "--backlog", "1", "--never-accept"]);
    let pid = server.pid();
    ns.client(&["--to", "127.0.0.1:7900", "--count", "8", "--nonblocking", "200ms"]);
    drop(server);
    std::thread::sleep(Duration::from_millis(300));
    let overflows = ns.nstat("TcpExtListenOverflows") - before;
    assert!(overflows > 0, "the scenario must overflow the accept queue");
    assert_eq!(settle(&mut obs, &[pid], 7900, overflows), overflows, "TcpExtListenOverflows says {overflows}");
}

/// A server restarted by its liveness probe, overflowing in each life:
/// three listeners on one port, each gone before a round; the sum over
/// their owners is the kernel's count.
#[test]
fn a_listener_restarted_three_times_counts_every_life() {
    let ns = Netns::new();
    // Its own rounds, so that no round runs within a life (see above).
    let mut obs = Observer::start_own();
    let before = ns.nstat("TcpExtListenOverflows");
    let mut owners = Vec::new();
    for _ in 0..3 {
        let server = ns.serve(&["--listen", "127.0.0.1:7901", "--backlog", "1", "--never-accept"]);
        owners.push(server.pid());
        ns.client(&["--to", "127.0.0.1:7901", "--count", "6", "--nonblocking", "200ms"]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let overflows = ns.nstat("TcpExtListenOverflows") - before;
    assert!(overflows >= 3, "each life must overflow: {overflows}");
    assert_eq!(settle(&mut obs, &owners, 7901, overflows), overflows, "TcpExtListenOverflows says {overflows}");
}

/// Drop the handshake's last ACK from client port `port` to `to_port`
/// (the client then holds an established connection the server still
/// has as a request, SYN-RECV); `iptables -D` with the same rule lifts it.
fn last_ack_rule(ns: &Netns, action: &str, client_ports: &str, to_port: u16) {
    let to_port = to_port.to_string();
    observer_testing::netns::run(ns.command("iptables").args([
        action,
        "INPUT",
        "-p",
        "tcp",
        "--sport",
        client_ports,
        "--dport",
        &to_port,
        "--tcp-flags",
        "ALL",
        "ACK",
        "-j",
        "DROP",
    ]));
}

/// A client connecting to `to` from the local port range set before, kept
/// open (non-blocking) for `open`; killed on drop.
struct HeldClient(Child);

impl HeldClient {
    fn start(ns: &Netns, to: &str, count: u32, open: &str) -> Self {
        let count = count.to_string();
        let child = ns
            .command(&churn())
            .args(["connect", "--to", to, "--count", &count, "--nonblocking", open])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Self(child)
    }
}

impl Drop for HeldClient {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Requests of `port` waiting for the handshake's last ACK (SYN-RECV).
fn waiting_requests(ns: &Netns, port: u16) -> u64 {
    let filter = format!("sport = :{port}");
    observer_testing::netns::run(ns.command("ss").args(["-Htan", "state", "syn-recv", &filter])).lines().count() as u64
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The final-ACK path (tcp_v4_syn_recv_sock finding the queue full): a
/// request answered while the queue had room, whose last ACK comes after
/// other connections filled it. The kernel retransmits its SYN-ACK, the
/// client acknowledges it again, and each of those ACKs overflows; no
/// SYN does, since no client sends one any more. The listener's drop
/// counter, which the sweep's mode reads, counts each such ACK twice
/// (tcp_listendrop, then the dropped packet): not the count.
#[test]
fn overflows_on_the_handshakes_last_ack_are_counted() {
    let ns = Netns::new();
    let mut obs = Observer::start();
    let port = 7902;
    let server = ns.serve(&["--listen", "127.0.0.1:7902", "--backlog", "1", "--never-accept"]);
    let pid = server.pid();
    let before = ns.nstat_all(&["TcpExtListenOverflows", "TcpExtTCPReqQFullDrop"]);
    ns.sysctl("net.ipv4.ip_local_port_range", "40000 40000");
    last_ack_rule(&ns, "-A", "40000", port);
    let _waiting = HeldClient::start(&ns, "127.0.0.1:7902", 1, "60s");
    wait_for("the request in SYN-RECV", || waiting_requests(&ns, port) == 1);
    // Two connections fill the queue (backlog 1 holds two).
    ns.sysctl("net.ipv4.ip_local_port_range", "40010 40030");
    ns.client(&["--to", "127.0.0.1:7902", "--count", "2", "--nonblocking", "200ms"]);
    assert_eq!(ns.nstat("TcpExtListenOverflows"), before[0], "filling the queue overflows nothing");
    last_ack_rule(&ns, "-D", "40000", port);
    wait_for("an overflow on the last ACK", || ns.nstat("TcpExtListenOverflows") > before[0]);
    // Killed at once: the next SYN-ACK retransmission is seconds away.
    let drops = ns.listener_drops(port);
    drop(server);
    std::thread::sleep(Duration::from_millis(300));
    let after = ns.nstat_all(&["TcpExtListenOverflows", "TcpExtTCPReqQFullDrop"]);
    let overflows = after[0] - before[0];
    assert_eq!(after[1], before[1], "no SYN was dropped for a full SYN queue");
    assert!(drops > overflows, "the drop counter counts more: {drops}");
    assert_eq!(
        settle(&mut obs, &[pid], port, overflows),
        overflows,
        "TcpExtListenOverflows says {overflows}, the listener's drop counter {drops}; every drop on port {port} \
         observer counted: {}; updates lost by slot: {:?}",
        obs.drops_on_port(port),
        obs.lost()
    );
}

/// The SYN path (tcp_conn_request): with syncookies off, a SYN meeting a
/// full SYN queue is dropped before the accept queue is looked at, and is
/// no overflow (TcpExtTCPReqQFullDrop), however full that queue is; with
/// syncookies on, the same SYN is answered with a cookie
/// (TcpExtTCPReqQFullDoCookies) and goes on to overflow the accept queue.
/// The listener's drop counter, which the sweep's mode reads, counts both
/// drops. observer counts each kind apart, per listener: the overflows,
/// and the SYNs that met the full SYN queue by what became of them
/// (`syn_queue_full_is_counted_or_said_absent`).
#[test]
fn syns_a_full_syn_queue_drops_are_no_overflows() {
    let ns = Netns::new();
    // Its own rounds: the listener is killed before any (see above). With
    // the shared load's, run whenever a test beside it asked, observer
    // once counted 0 of the 2 overflows here (host, tracepoint mode, under
    // load): to be found, in the sweep's mode.
    let mut obs = Observer::start_own();
    let port = 7903;
    let server = ns.serve(&["--listen", "127.0.0.1:7903", "--backlog", "1", "--never-accept"]);
    let pid = server.pid();
    let counters = ["TcpExtListenOverflows", "TcpExtTCPReqQFullDrop", "TcpExtTCPReqQFullDoCookies"];
    let before = ns.nstat_all(&counters);
    // Two requests whose last ACK never comes fill the SYN queue (it
    // holds backlog + 1).
    ns.sysctl("net.ipv4.ip_local_port_range", "40000 40001");
    last_ack_rule(&ns, "-A", "40000:40001", port);
    let _waiting =
        [HeldClient::start(&ns, "127.0.0.1:7903", 1, "60s"), HeldClient::start(&ns, "127.0.0.1:7903", 1, "60s")];
    wait_for("two requests in SYN-RECV", || waiting_requests(&ns, port) == 2);
    // Two connections through SYN cookies fill the accept queue.
    ns.sysctl("net.ipv4.ip_local_port_range", "40010 40030");
    ns.client(&["--to", "127.0.0.1:7903", "--count", "2", "--nonblocking", "200ms"]);
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    ns.client(&["--to", "127.0.0.1:7903", "--count", "3", "--nonblocking", "200ms"]);
    ns.sysctl("net.ipv4.tcp_syncookies", "1");
    ns.client(&["--to", "127.0.0.1:7903", "--count", "2", "--nonblocking", "200ms"]);
    let drops = ns.listener_drops(port);
    drop(server);
    std::thread::sleep(Duration::from_millis(300));
    let after = ns.nstat_all(&counters);
    let [overflows, syn_dropped, syn_cookies] = [0, 1, 2].map(|i| after[i] - before[i]);
    assert!(syn_dropped >= 3, "SYNs must meet the full SYN queue: {syn_dropped}");
    assert!(syn_cookies >= 4, "SYNs must be answered with cookies: {syn_cookies}");
    assert!(overflows >= 2, "SYNs with cookies must overflow the accept queue: {overflows}");
    assert_eq!(drops, overflows + syn_dropped, "the drop counter counts both");
    assert_eq!(
        settle(&mut obs, &[pid], port, overflows),
        overflows,
        "ListenOverflows {overflows}, ReqQFullDrop {syn_dropped}, the listener's drop counter {drops}"
    );
    let full =
        |o: &Observer| [DropReason::SynDrop, DropReason::SynCookie].map(|reason| o.listener_drops(pid, port, reason));
    if syn_queue_full_is_counted_or_said_absent(&obs) {
        collect_until(&mut obs, |o| full(o) == [syn_dropped, syn_cookies]);
        assert_eq!(
            full(&obs),
            [syn_dropped, syn_cookies],
            "TcpExtTCPReqQFullDrop, TcpExtTCPReqQFullDoCookies (charged to the listener's owner and port)"
        );
    } else {
        assert_eq!(full(&obs), [0, 0], "absent, never a partial count");
    }
}

/// Whether the SYN-queue hook counts here. Where kprobes exist (every
/// kernel of the matrix, in each of its modes) it must (the matrix's 6.12
/// at tcp_syn_flood_action, its 5.10 and 6.1 at tcp_conn_request: Debian's
/// builds of those inlined the function); where they do not
/// and trampolines are refused (this CI host), or in the tracepoint mode,
/// it is absent, and says so.
fn syn_queue_full_is_counted_or_said_absent(obs: &Observer) -> bool {
    use observer::probes::{Mode, hooks::SYN_QUEUE_FULL};
    let a = obs.attachments().into_iter().find(|a| a.hook == SYN_QUEUE_FULL).expect("the hook is always reported");
    let has_kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    if has_kprobes && common::test_mode() != observer::probes::AttachMode::Tracepoint {
        // At the kernel's own count, or (a kernel that inlined it, as
        // Debian's 5.10 and 6.1) by its test repeated at tcp_conn_request.
        assert!(matches!(a.mode, Mode::Fentry | Mode::Kprobe), "{a:?}");
        assert!(a.target == "tcp_syn_flood_action" || a.target.starts_with("tcp_conn_request"), "{a:?}");
        eprintln!("syn_queue_full counted at {}", a.target);
        return true;
    }
    assert_eq!(a.mode, Mode::Absent, "{a:?}");
    assert!(a.target.contains("tcp_syn_flood_action") && a.programs.is_empty(), "{a:?}");
    eprintln!("syn_queue_full: absent on this kernel (no kprobes, no trampolines), as observer_probe_info says");
    false
}

/// Where the overflow program repeats the kernel's SYN-queue test (a
/// kernel that inlined tcp_syn_flood_action), observer asks the kernel
/// whether its SYN queue is full at the backlog (`>=`, before the 2024
/// fix) or above it (`>`): the answer must be what the queue itself shows.
/// Requests whose last ACK never comes, against backlog 1, stay in
/// SYN-RECV as the queue holds them: 1 (`>=`) or 2 (`>`), `ss` says.
#[test]
fn the_syn_queue_test_observer_asks_for_is_the_kernels() {
    let ns = Netns::new();
    let port = 7905;
    let _server = ns.serve(&["--listen", "127.0.0.1:7905", "--backlog", "1", "--never-accept"]);
    // Four ports: connect() uses an even count of the range (three would
    // give two).
    ns.sysctl("net.ipv4.ip_local_port_range", "40000 40003");
    last_ack_rule(&ns, "-A", "40000:40003", port);
    let cookies = || ns.nstat("TcpExtTCPReqQFullDoCookies");
    // One SYN at a time, each answered (queued, or with a cookie once the
    // queue is full) before the next: a listener takes SYNs without its
    // lock, so SYNs arriving together on two CPUs can both pass the
    // queue's test before either is queued (3 held on the 6.12 VM once).
    let _waiting: Vec<HeldClient> = (1..=3)
        .map(|answered| {
            let client = HeldClient::start(&ns, "127.0.0.1:7905", 1, "60s");
            wait_for("the SYN answered", || waiting_requests(&ns, port) + cookies() >= answered);
            client
        })
        .collect();
    let held = waiting_requests(&ns, port);
    let at_backlog = observer::probes::syn_queue_test::full_at_backlog().expect("the kernel answers");
    assert!(held == 1 || held == 2, "{held} requests in SYN-RECV, {} cookies", cookies());
    assert_eq!(at_backlog, held == 1, "backlog 1 holds {held} requests");
}

/// observer_kernel_unseen_events_total{observer_event="listen_overflow"}.
fn unseen_overflows(body: &str) -> Option<u64> {
    observer_testing::http::sample(body, "observer_kernel_unseen_events_total", &["observer_event=\"listen_overflow\""])
}

/// Where programs count overflows, each namespace's own count checks
/// them: overflows none of them ran for become a number. Such a miss
/// cannot be made on purpose, so it is injected where the check reads the
/// programs' count (2 hidden); the kernel's count must show them, and the
/// overflows themselves stay whole. In the sweep's mode there is nothing
/// to check: no series (never a zero that claims a check).
#[test]
fn overflows_the_programs_missed_are_counted_as_unseen() {
    use std::os::unix::fs::MetadataExt as _;
    let ns = Netns::new();
    let server = ns.serve(&["--listen", "127.0.0.1:7904", "--backlog", "1", "--never-accept"]);
    let inode = std::fs::metadata(ns.path()).unwrap().ino().to_string();
    let failpoint = format!("listen-overflow-unseen=return({inode})");
    let daemon = common::daemon::start_daemon_with_env(&[], &[("FAILPOINTS", failpoint.as_str())]);
    let attached = |mode: &str| {
        let body =
            common::daemon::scrape_until(&daemon, Duration::from_secs(10), |b| b.contains("observer_probe_info"));
        observer_testing::http::sample(&body, "observer_probe_info", &["observer_hook=\"listen_overflow\"", mode])
            .is_some()
    };
    if attached("observer_probe_mode=\"sock_diag\"") {
        let body = common::daemon::scrape_until(&daemon, Duration::from_secs(5), |_| false);
        assert_eq!(unseen_overflows(&body), None, "no check, no series:\n{body}");
        return;
    }
    // The first check (the first round) takes each namespace's start.
    common::daemon::scrape_until(&daemon, Duration::from_secs(10), |b| unseen_overflows(b).is_some());
    let before = ns.nstat("TcpExtListenOverflows");
    ns.client(&["--to", "127.0.0.1:7904", "--count", "8", "--nonblocking", "200ms"]);
    std::thread::sleep(Duration::from_millis(300));
    let overflows = ns.nstat("TcpExtListenOverflows") - before;
    assert!(overflows >= 2, "the scenario must overflow the accept queue: {overflows}");
    let counted = |b: &str| {
        observer_testing::http::sample_sum(b, "observer_tcp_listen_overflows_total", &["server_port=\"7904\""])
    };
    let body = common::daemon::scrape_until(&daemon, Duration::from_secs(60), |b| {
        unseen_overflows(b) == Some(2) && counted(b) == overflows
    });
    assert_eq!(unseen_overflows(&body), Some(2), "{}", daemon.log());
    assert_eq!(counted(&body), overflows, "TcpExtListenOverflows says {overflows}");
    drop(server);
}

/// The hostile case of that check: a namespace born with a burst of
/// overflows, all counted, before its first check; then 2 hidden after
/// it. The burst must not make up for them (a check that took the
/// programs' count from 0 while the kernel's started at its first reading
/// did).
#[test]
fn overflows_before_a_namespaces_first_check_do_not_hide_later_misses() {
    let name = Netns::unique_name();
    let failpoint = format!("listen-overflow-unseen=return({})", Netns::path_of(&name).display());
    let hold = common::daemon::ChecksHold::new();
    let daemon = common::daemon::start_daemon_for_checks(&hold, &failpoint);
    let limit = Duration::from_secs(30);
    let body = common::daemon::scrape_until(&daemon, limit, |b| b.contains("observer_probe_info"));
    let mode = |m: &str| {
        observer_testing::http::sample(&body, "observer_probe_info", &["observer_hook=\"listen_overflow\"", m])
    };
    if mode("observer_probe_mode=\"sock_diag\"").is_some() {
        let body = common::daemon::scrape_until(&daemon, Duration::from_secs(5), |_| false);
        assert_eq!(unseen_overflows(&body), None, "no check, no series:\n{body}");
        return;
    }
    common::daemon::scrape_until(&daemon, limit, |b| unseen_overflows(b).is_some());
    let overflow = |ns: &Netns| {
        ns.client(&["--to", "127.0.0.1:7906", "--count", "8", "--nonblocking", "200ms"]);
        std::thread::sleep(Duration::from_millis(300));
        ns.nstat("TcpExtListenOverflows")
    };
    let (ns, server, burst) = common::daemon::between_checks(&daemon, &hold, || {
        let ns = Netns::named(name);
        let server = ns.serve(&["--listen", "127.0.0.1:7906", "--backlog", "1", "--never-accept"]);
        let burst = overflow(&ns);
        (ns, server, burst)
    });
    assert!(burst >= 2, "the scenario must overflow the accept queue: {burst}");
    // Its first check done (the next check round), then more overflows.
    let burst_done = observer_testing::http::rounds_completed(&daemon.scrape());
    common::daemon::scrape_until(&daemon, limit, |b| {
        observer_testing::http::rounds_completed(b) > burst_done + KERNEL_CHECK_EVERY
    });
    let overflows = overflow(&ns);
    assert!(overflows >= burst + 2, "the full queue must overflow again: {burst}, then {overflows}");
    let counted = |b: &str| {
        observer_testing::http::sample_sum(b, "observer_tcp_listen_overflows_total", &["server_port=\"7906\""])
    };
    let body = common::daemon::scrape_until(&daemon, Duration::from_secs(60), |b| {
        unseen_overflows(b) == Some(2) && counted(b) == overflows
    });
    assert_eq!(unseen_overflows(&body), Some(2), "{}", daemon.log());
    assert_eq!(counted(&body), overflows, "TcpExtListenOverflows says {overflows}");
    drop(server);
}
