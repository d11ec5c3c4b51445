//! Connects, accepts and connect errors, per process, against what the
//! processes did and the kernel's own counters.
mod common;

use std::net::SocketAddr;

use common::{Observer, collect_until};
use observer_testing::Netns;

const ECONNREFUSED: u32 = 111;

#[test]
fn two_clients_get_separate_counts_and_accepts_go_to_the_server() {
    let mut obs = Observer::start();
    let ns = Netns::new();
    let server = ns.serve(&["--listen", "127.0.0.1:7100"]);
    let (active_before, passive_before) = (ns.nstat("TcpActiveOpens"), ns.nstat("TcpPassiveOpens"));

    let a = ns.client(&["--to", "127.0.0.1:7100", "--count", "5"]);
    let b = ns.client(&["--to", "127.0.0.1:7100", "--count", "7"]);
    assert_eq!((a.connected, b.connected), (5, 7));
    let active = ns.nstat("TcpActiveOpens") - active_before;
    let passive = ns.nstat("TcpPassiveOpens") - passive_before;
    assert_eq!((active, passive), (12, 12), "kernel counters");
    // The handshakes are done; wait until the server has accept()ed them
    // all (its accept queue is empty), which may lag on a slow machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ns.accept_queue(7100) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(ns.accept_queue(7100), 0, "the server accepted every connection");

    collect_until(&mut obs, |o| o.process(server.pid()).accepts >= passive);
    assert_eq!(obs.process(a.pid).connects, 5);
    assert_eq!(obs.process(b.pid).connects, 7);
    assert_eq!(obs.process(server.pid()).accepts, passive);
    assert_eq!(obs.process(server.pid()).connects, 0);
    assert_eq!(obs.process(a.pid).accepts, 0);
}

#[test]
fn refused_connects_are_counted_once_blocking_or_not() {
    let mut obs = Observer::start();
    let ns = Netns::new();
    // Nothing listens on port 9: the kernel answers each SYN with a reset.
    let blocking = ns.client(&["--to", "127.0.0.1:9", "--count", "3"]);
    let nonblocking = ns.client(&["--to", "[::1]:9", "--count", "4", "--nonblocking", "50ms"]);
    assert_eq!(blocking.errors("ECONNREFUSED"), 3, "{blocking:?}");
    assert_eq!(nonblocking.errors("ECONNREFUSED"), 4, "{nonblocking:?}");

    let v4: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let v6: SocketAddr = "[::1]:9".parse().unwrap();
    collect_until(&mut obs, |o| {
        o.connect_errors(blocking.pid, v4, ECONNREFUSED) >= 3
            && o.connect_errors(nonblocking.pid, v6, ECONNREFUSED) >= 4
    });
    assert_eq!(obs.connect_errors(blocking.pid, v4, ECONNREFUSED), 3);
    assert_eq!(obs.connect_errors(nonblocking.pid, v6, ECONNREFUSED), 4);
    assert_eq!(obs.all_connect_errors(blocking.pid), 3);
    assert_eq!(obs.all_connect_errors(nonblocking.pid), 4);
    // The SYNs were sent: these are connects too (TcpActiveOpens counts them).
    assert_eq!(obs.process(blocking.pid).connects, 3);
    assert_eq!(obs.process(nonblocking.pid).connects, 4);
}

#[test]
fn a_refusal_reported_again_by_a_second_connect_is_counted_once() {
    let mut obs = Observer::start();
    let ns = Netns::new();
    // The second connect() on each socket returns the refusal the first
    // one's SYN got (sk_err), without a new attempt: one failure each.
    let client = ns.client(&["--to", "127.0.0.1:9", "--count", "3", "--nonblocking", "50ms", "--ask-again"]);
    assert_eq!(client.errors("ECONNREFUSED"), 3, "{client:?}");
    let dest: SocketAddr = "127.0.0.1:9".parse().unwrap();
    collect_until(&mut obs, |o| o.connect_errors(client.pid, dest, ECONNREFUSED) >= 3);
    // One more round: a second count would have arrived with the first.
    obs.collect();
    assert_eq!(obs.connect_errors(client.pid, dest, ECONNREFUSED), 3);
    assert_eq!(obs.all_connect_errors(client.pid), 3);
    assert_eq!(obs.process(client.pid).connects, 3);
}

/// TCP Fast Open opens a connection inside sendmsg(), with no connect()
/// call. Where observer hooks TCP's connect (fentry or kprobe on
/// `__inet_stream_connect`, which sendmsg() calls too) each is a connect
/// like any other, and a refusal an error; the syscall tracepoints of the
/// tracepoint mode see no connect() and count neither (README says so).
#[test]
fn fast_open_connects_are_counted_where_tcps_connect_is_hooked() {
    let mut obs = Observer::start();
    let ns = Netns::new();
    let _server = ns.serve(&["--listen", "127.0.0.1:7101"]);
    let before = ns.nstat_all(&["TcpActiveOpens", "TcpExtTCPFastOpenCookieReqd"]);
    let opened = ns.client(&["--to", "127.0.0.1:7101", "--count", "4", "--fast-open"]);
    let refused = ns.client(&["--to", "127.0.0.1:9", "--count", "2", "--fast-open"]);
    assert_eq!(opened.connected, 4, "{opened:?}");
    assert_eq!(refused.errors("ECONNREFUSED"), 2, "{refused:?}");
    let after = ns.nstat_all(&["TcpActiveOpens", "TcpExtTCPFastOpenCookieReqd"]);
    assert_eq!(after[0] - before[0], 6, "SYNs sent: {}", ns.nstat_report());
    // Counted at the SYN-ACK, so for the opened ones only.
    assert_eq!(after[1] - before[1], 4, "each a Fast Open SYN: {}", ns.nstat_report());

    let refused_at: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let hook = obs.attachments().into_iter().find(|a| a.hook == "inet_stream_connect").expect("always attached");
    if hook.mode == observer::probes::Mode::Tracepoint {
        // A round after the kernel's counts: anything counted is in.
        obs.collect();
        assert_eq!(obs.process(opened.pid).connects, 0);
        assert_eq!(obs.all_connect_errors(refused.pid), 0);
        return;
    }
    collect_until(&mut obs, |o| {
        o.process(opened.pid).connects >= 4 && o.connect_errors(refused.pid, refused_at, ECONNREFUSED) >= 2
    });
    assert_eq!(obs.process(opened.pid).connects, 4, "{hook:?}");
    assert_eq!(obs.process(refused.pid).connects, 2, "{hook:?}");
    assert_eq!(obs.connect_errors(refused.pid, refused_at, ECONNREFUSED), 2);
    assert_eq!(obs.all_connect_errors(refused.pid), 2);
}

#[test]
fn unroutable_destination_is_enetunreach_before_any_packet() {
    let mut obs = Observer::start();
    // The namespace has only loopback, so the route lookup fails inside
    // connect() and no packet is ever built. 192.0.2.1 is TEST-NET-1
    // (RFC 5737), reserved for documentation.
    let ns = Netns::new();
    let client = ns.client(&["--to", "192.0.2.1:80", "--count", "2"]);
    assert_eq!(client.errors("ENETUNREACH"), 2, "{client:?}");
    let dest: SocketAddr = "192.0.2.1:80".parse().unwrap();
    collect_until(&mut obs, |o| o.connect_errors(client.pid, dest, 101) >= 2);
    assert_eq!(obs.connect_errors(client.pid, dest, 101), 2);
    assert_eq!(obs.process(client.pid).connects, 0, "no SYN was sent");
}

#[test]
fn timed_out_connects_are_counted_once_blocking_or_not() {
    const ETIMEDOUT: u32 = 110;
    let mut obs = Observer::start();
    let ns = Netns::new();
    // One SYN retry: a connect whose SYNs are dropped times out in ~3 s.
    ns.sysctl("net.ipv4.tcp_syn_retries", "1");
    let _server = ns.serve(&["--listen", "127.0.0.1:7200", "--backlog", "0", "--never-accept"]);
    // Fill the accept queue (backlog 0 holds one connection); from then on
    // the listener drops every SYN.
    let filler = ns.client(&["--to", "127.0.0.1:7200", "--count", "1", "--hold", "--nonblocking", "100ms"]);
    assert_eq!(filler.connected, 1);

    let blocking = ns.client(&["--to", "127.0.0.1:7200", "--count", "1"]);
    let nonblocking = ns.client(&["--to", "127.0.0.1:7200", "--count", "1", "--nonblocking", "5s"]);
    assert_eq!(blocking.errors("ETIMEDOUT"), 1, "{blocking:?}");
    assert_eq!(nonblocking.errors("ETIMEDOUT"), 1, "{nonblocking:?}");

    let dest: SocketAddr = "127.0.0.1:7200".parse().unwrap();
    collect_until(&mut obs, |o| {
        o.connect_errors(blocking.pid, dest, ETIMEDOUT) >= 1 && o.connect_errors(nonblocking.pid, dest, ETIMEDOUT) >= 1
    });
    assert_eq!(obs.connect_errors(blocking.pid, dest, ETIMEDOUT), 1);
    assert_eq!(obs.connect_errors(nonblocking.pid, dest, ETIMEDOUT), 1);
    assert_eq!(obs.all_connect_errors(blocking.pid) + obs.all_connect_errors(nonblocking.pid), 2);
}
