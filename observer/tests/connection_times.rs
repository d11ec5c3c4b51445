//! How long connections take to open and how long they live, per process
//! and far end: handshakes timed from the SYN, against delays the test
//! puts on the path (a firewall dropping SYNs, netem) and the kernel's
//! count of SYNs resent; lifetimes against the times the client held each
//! connection. Apart from `connections` (the ledger of open ones), and on
//! the binary's shared load: these read their own processes' counts only.
mod common;

use common::{INBOUND, OUTBOUND, Observer, collect_until};
use observer::series::durations;
use observer_testing::Netns;

const PORT: u16 = 5432;

/// Connections held for known times (the client closes each after it):
/// each lands in the lifetime bucket of its time, on both sides.
#[test]
fn lifetimes_land_in_the_bucket_of_the_time_held() {
    let mut obs = Observer::start();
    let ns = Netns::new();
    let to = format!("127.0.0.1:{PORT}");
    let server = ns.serve(&["--listen", &to]);
    // Bounds (exported): ... 0.064, 0.256, 1.024, 4.096 s: 100 ms falls in
    // (0.064, 0.256], 500 ms in (0.256, 1.024], 2 s in (1.024, 4.096],
    // with room for a slow machine on each side.
    let client = ns.client(&["--to", &to, "--count", "6", "--life", "100ms,100ms,100ms,500ms,500ms,2s"]);
    assert_eq!(client.connected, 6, "{client:?}");
    let closed = |o: &Observer, pid, dir| -> durations::Lifetimes {
        durations::cumulative(&durations::from_kernel(&o.connection_counts(pid, dir, PORT).closed))
    };
    collect_until(&mut obs, |o| closed(o, client.pid, OUTBOUND)[11] >= 6 && closed(o, server.pid(), INBOUND)[11] >= 6);
    // le:                 0.001 0.004 0.016 0.064 0.256 1.024 4.096 ... +Inf
    let expected: durations::Lifetimes = [0, 0, 0, 0, 3, 5, 6, 6, 6, 6, 6, 6];
    assert_eq!(closed(&obs, client.pid, OUTBOUND), expected, "the client's connections, cumulative by le");
    assert_eq!(closed(&obs, server.pid(), INBOUND), expected, "the listener's, by the same times");
    assert_eq!(obs.connection_counts(client.pid, OUTBOUND, PORT).established, 6);
    assert_eq!(obs.open_connections(client.pid, OUTBOUND, PORT), 0);
    // The client closed each first: the listener's ends were the peer's.
    assert_eq!(obs.connection_counts(client.pid, OUTBOUND, PORT).closed_by_peer, 0);
    assert_eq!(obs.connection_counts(server.pid(), INBOUND, PORT).closed_by_peer, 6);
}

/// A server past its connection limit, as the first incident's database:
/// it holds 5 and closes every further connection at once. The client
/// holds all 8 of its sockets: the 3 the server closed sit in CLOSE-WAIT
/// (`ss`), and those are its connections closed by the peer; the server's
/// own ends are not (it closed first).
#[test]
fn connections_a_server_turns_away_are_closed_by_the_peer() {
    let mut obs = Observer::start();
    let ns = Netns::new();
    let port = 7302u16;
    let to = format!("127.0.0.1:{port}");
    let server = ns.serve(&["--listen", &to, "--hold", "--max-open", "5"]);
    let client = ns.client_holding(&["--to", &to, "--count", "8"]);
    assert_eq!(client.report.connected, 8, "{:?}", client.report);
    let in_state = |state: &str| {
        let out = observer_testing::netns::run(ns.command("ss").args([
            "-Htanp",
            "state",
            state,
            "dport",
            &format!(":{port}"),
        ]));
        out.lines().filter(|l| l.contains(&format!("pid={},", client.pid()))).count() as u64
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while in_state("close-wait") < 3 {
        assert!(std::time::Instant::now() < deadline, "the server must close 3: {}", ns.ss_all());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!((in_state("close-wait"), in_state("established")), (3, 5), "ss");
    let counts = |o: &Observer, pid, dir| o.connection_counts(pid, dir, port);
    collect_until(&mut obs, |o| {
        counts(o, client.pid(), OUTBOUND).closed_by_peer >= 3 && counts(o, server.pid(), INBOUND).established >= 8
    });
    let mine = counts(&obs, client.pid(), OUTBOUND);
    assert_eq!((mine.established, mine.closed.iter().sum::<u64>(), mine.closed_by_peer), (8, 3, 3), "{mine:?}");
    let theirs = counts(&obs, server.pid(), INBOUND);
    assert_eq!((theirs.established, theirs.closed.iter().sum::<u64>(), theirs.closed_by_peer), (8, 3, 0), "{theirs:?}");
    assert_eq!(obs.open_connections(client.pid(), OUTBOUND, port), 5);
}

/// Handshakes timed from the SYN: toward one port the namespace's firewall
/// drops the first two SYNs of every connection (1 s, then 2 s more before
/// the SYN that passes), toward another none. Each handshake lands in the
/// bucket of its delay, and the SYNs resent are the kernel's
/// TcpExtTCPSynRetrans.
#[test]
fn handshakes_land_in_the_bucket_of_their_delay() {
    let mut obs = Observer::start();
    let ns = Netns::new();
    let (slow, fast) = (7300u16, 7301u16);
    let _slow_server = ns.serve(&["--listen", &format!("127.0.0.1:{slow}")]);
    let _fast_server = ns.serve(&["--listen", &format!("127.0.0.1:{fast}")]);
    let dport = slow.to_string();
    // Two rules, each with its own count of the SYNs reaching it: the
    // first drops SYNs 0, 3, 6, ..., the second every other one of the
    // rest (1, 4, ...): two of every three, the third passes.
    for every in [["3", "0"], ["2", "0"]] {
        observer_testing::netns::run(ns.command("iptables").args([
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "--syn",
            "--dport",
            &dport,
            "-m",
            "statistic",
            "--mode",
            "nth",
            "--every",
            every[0],
            "--packet",
            every[1],
            "-j",
            "DROP",
        ]));
    }
    let resent_before = ns.nstat("TcpExtTCPSynRetrans");
    let delayed = ns.client(&["--to", &format!("127.0.0.1:{slow}"), "--count", "2"]);
    let quick = ns.client(&["--to", &format!("127.0.0.1:{fast}"), "--count", "5"]);
    assert_eq!((delayed.connected, quick.connected), (2, 5), "{delayed:?} {quick:?}");
    let resent = ns.nstat("TcpExtTCPSynRetrans") - resent_before;
    assert_eq!(resent, 4, "the kernel resent two SYNs per delayed connection");

    let times = |o: &Observer, pid, port| -> durations::Handshakes {
        durations::cumulative(&durations::from_kernel(&o.connection_counts(pid, OUTBOUND, port).handshakes))
    };
    collect_until(&mut obs, |o| times(o, delayed.pid, slow)[8] >= 2 && times(o, quick.pid, fast)[8] >= 5);
    // le:               0.001 0.004 0.016 0.064 0.256 1.024 4.096 16.384 +Inf
    assert_eq!(times(&obs, delayed.pid, slow), [0, 0, 0, 0, 0, 0, 2, 2, 2], "3 s each: in (1.024, 4.096]");
    let quick_times = times(&obs, quick.pid, fast);
    assert_eq!((quick_times[4], quick_times[8]), (5, 5), "a round trip on loopback: under 0.256 s, {quick_times:?}");
    let retransmits = |pid, port| obs.connection_counts(pid, OUTBOUND, port).handshake_retransmits;
    assert_eq!((retransmits(delayed.pid, slow), retransmits(quick.pid, fast)), (resent, 0), "SYNs sent again");
}

/// A 40 ms delay on the path (netem on the namespace's loopback, so the
/// SYN and the SYN-ACK take 40 ms each: an 80 ms handshake), as after the
/// second incident's move to a remote site: each handshake in
/// (0.064, 0.256] s, never below (netem never delays less), with room
/// above for the matrix's software emulation (a 40 ms handshake's bucket
/// left 24 ms, which one run of the 6.1 VM exceeded). This host's kernel
/// has no netem qdisc; the kernel matrix's VMs have it and run this test
/// with OBSERVER_TEST_NETEM=1, which makes its absence a failure there.
#[test]
fn a_40_ms_delay_puts_handshakes_in_its_bucket() {
    let ns = Netns::new();
    let netem =
        ns.command("tc").args(["qdisc", "add", "dev", "lo", "root", "netem", "delay", "40ms"]).output().unwrap();
    if !netem.status.success() {
        let why = String::from_utf8_lossy(&netem.stderr);
        assert!(std::env::var_os("OBSERVER_TEST_NETEM").is_none(), "netem required here: {why}");
        // Past the harness's capture, so CI's output says so.
        let note = format!("NOT RUN ON THIS KERNEL (no netem qdisc: {}): the kernel matrix runs it\n", why.trim());
        let _ = std::io::Write::write_all(&mut std::io::stderr(), note.as_bytes());
        return;
    }
    let mut obs = Observer::start();
    let port = 7320u16;
    let _server = ns.serve(&["--listen", &format!("127.0.0.1:{port}")]);
    let client = ns.client(&["--to", &format!("127.0.0.1:{port}"), "--count", "3"]);
    assert_eq!(client.connected, 3, "{client:?}");
    let times = |o: &Observer| -> durations::Handshakes {
        durations::cumulative(&durations::from_kernel(&o.connection_counts(client.pid, OUTBOUND, port).handshakes))
    };
    collect_until(&mut obs, |o| times(o)[8] >= 3);
    // le:                      0.001 0.004 0.016 0.064 0.256 ... +Inf
    assert_eq!(times(&obs), [0, 0, 0, 0, 3, 3, 3, 3, 3], "80 ms each: in (0.064, 0.256]");
}

/// The handshake packets sent again, on both sides, are the kernel's
/// TcpExtTCPSynRetrans: a listener whose clients' last ACKs are lost (the
/// firewall drops every other pure ACK toward it) resends SYN-ACKs, which
/// count under the listener, as many as `ss -ti` shows its connections
/// resent; a connect whose SYNs are all dropped times out (ETIMEDOUT,
/// tcp_syn_retries 1) and the SYNs it resent (the rest of the kernel's
/// count) go under its process and server when it fails.
#[test]
fn handshake_retransmits_are_the_kernels_on_both_sides() {
    const ETIMEDOUT: u32 = 110;
    let mut obs = Observer::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syn_retries", "1");
    let (lossy, dropped) = (7310u16, 7311u16);
    let server = ns.serve(&["--listen", &format!("127.0.0.1:{lossy}"), "--hold"]);
    let iptables = |rule: &[&str]| observer_testing::netns::run(ns.command("iptables").args(rule));
    let lossy_port = lossy.to_string();
    iptables(&[
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        &lossy_port,
        "--tcp-flags",
        "ALL",
        "ACK",
        "-m",
        "statistic",
        "--mode",
        "nth",
        "--every",
        "2",
        "--packet",
        "0",
        "-j",
        "DROP",
    ]);
    iptables(&["-A", "INPUT", "-p", "tcp", "--syn", "--dport", &dropped.to_string(), "-j", "DROP"]);
    let resent_before = ns.nstat("TcpExtTCPSynRetrans");

    let clients = ns.client_holding(&["--to", &format!("127.0.0.1:{lossy}"), "--count", "4"]);
    assert_eq!(clients.report.connected, 4, "{:?}", clients.report);
    let timed_out = ns.client(&["--to", &format!("127.0.0.1:{dropped}"), "--count", "2"]);
    assert_eq!(timed_out.errors.get("ETIMEDOUT"), Some(&2), "{timed_out:?}");
    // The server has a connection once a last ACK got through.
    let sport = format!("sport = :{lossy}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ns.established(&sport, Some(server.pid())) < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(ns.established(&sport, Some(server.pid())), 4, "ss: the server holds the four");
    let resent = ns.nstat("TcpExtTCPSynRetrans") - resent_before;
    // ss -ti: each of the server's connections with what it resent
    // ("retrans:now/total"), the SYN-ACKs of its handshake.
    let ss = observer_testing::netns::run(ns.command("ss").args(["-Htin", "state", "established", &sport]));
    let resent_by_server: u64 = ss
        .split_whitespace()
        .filter_map(|f| f.strip_prefix("retrans:"))
        .map(|r| r.split('/').nth(1).unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(resent_by_server > 0, "the first last ACK was dropped: SYN-ACKs were resent; ss: {ss}");
    // The rest are the SYNs the timed-out connects resent (how many the
    // kernel sends before giving up varies with timer rounding).
    let resent_by_timed_out = resent - resent_by_server;
    assert!(resent_by_timed_out >= 2, "at least one SYN each: kernel {resent}, server {resent_by_server}");

    let to_dropped: std::net::SocketAddr = format!("127.0.0.1:{dropped}").parse().unwrap();
    let inbound = |o: &Observer| o.connection_counts(server.pid(), INBOUND, lossy).handshake_retransmits;
    let outbound = |o: &Observer| o.connection_counts(timed_out.pid, OUTBOUND, dropped).handshake_retransmits;
    collect_until(&mut obs, |o| {
        inbound(o) >= resent_by_server
            && outbound(o) >= resent_by_timed_out
            && o.connect_errors(timed_out.pid, to_dropped, ETIMEDOUT) >= 2
    });
    assert_eq!(inbound(&obs), resent_by_server, "SYN-ACKs resent, under the listener");
    assert_eq!(outbound(&obs), resent_by_timed_out, "SYNs resent by the connects that timed out, under their server");
    assert_eq!(obs.connection_counts(clients.pid(), OUTBOUND, lossy).handshake_retransmits, 0, "no SYN was lost");
    assert_eq!(obs.connection_counts(timed_out.pid, OUTBOUND, dropped).established, 0);
    assert_eq!(obs.connect_errors(timed_out.pid, to_dropped, ETIMEDOUT), 2, "the timeouts, as the client saw them");
}
