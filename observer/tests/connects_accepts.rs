//! Connects, accepts and connect errors, per process, against what the
//! processes did and the kernel's own counters.
mod common;

use std::net::SocketAddr;

use common::{collect_until, Netns, Observer};
use observer::probes::AttachMode;

const ECONNREFUSED: u32 = 111;

#[test]
fn two_clients_get_separate_counts_and_accepts_go_to_the_server() {
    let mut obs = Observer::start(AttachMode::Auto);
    let ns = Netns::new();
    let server = ns.serve(&["--listen", "127.0.0.1:7100"]);
    let (active_before, passive_before) = (ns.nstat("TcpActiveOpens"), ns.nstat("TcpPassiveOpens"));

    let a = ns.client(&["--to", "127.0.0.1:7100", "--count", "5"]);
    let b = ns.client(&["--to", "127.0.0.1:7100", "--count", "7"]);
    assert_eq!((a.connected, b.connected), (5, 7));
    let active = ns.nstat("TcpActiveOpens") - active_before;
    let passive = ns.nstat("TcpPassiveOpens") - passive_before;
    assert_eq!((active, passive), (12, 12), "kernel counters");

    collect_until(&mut obs, |o| o.process(server.pid()).accepts >= passive);
    assert_eq!(obs.process(a.pid).connects, 5);
    assert_eq!(obs.process(b.pid).connects, 7);
    assert_eq!(obs.process(server.pid()).accepts, passive);
    assert_eq!(obs.process(server.pid()).connects, 0);
    assert_eq!(obs.process(a.pid).accepts, 0);
}

#[test]
fn refused_connects_are_counted_once_blocking_or_not() {
    let mut obs = Observer::start(AttachMode::Auto);
    let ns = Netns::new();
    // Nothing listens on port 9: the kernel answers each SYN with a reset.
    let blocking = ns.client(&["--to", "127.0.0.1:9", "--count", "3"]);
    let nonblocking = ns.client(&["--to", "[::1]:9", "--count", "4", "--nonblocking", "50ms"]);
    assert_eq!(blocking.errors("ECONNREFUSED"), 3, "{blocking:?}");
    assert_eq!(nonblocking.errors("ECONNREFUSED"), 4, "{nonblocking:?}");

    let v4: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let v6: SocketAddr = "[::1]:9".parse().unwrap();
    collect_until(&mut obs, |o| {
        o.connect_errors(blocking.pid, v4, ECONNREFUSED) >= 3 && o.connect_errors(nonblocking.pid, v6, ECONNREFUSED) >= 4
    });
    assert_eq!(obs.connect_errors(blocking.pid, v4, ECONNREFUSED), 3);
    assert_eq!(obs.connect_errors(nonblocking.pid, v6, ECONNREFUSED), 4);
    assert_eq!(obs.all_connect_errors(blocking.pid), 3);
    assert_eq!(obs.all_connect_errors(nonblocking.pid), 4);
    // The SYNs were sent: these are connects too (TcpActiveOpens counts them).
    assert_eq!(obs.process(blocking.pid).connects, 3);
    assert_eq!(obs.process(nonblocking.pid).connects, 4);
}
