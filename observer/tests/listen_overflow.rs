//! A listener that never accepts: its queue fills and the kernel drops new
//! connections. observer must charge the drops to the listener's owner and
//! port, and match the namespace's TcpExtListenOverflows exactly.
mod common;

use std::time::Duration;

use common::{Observer, collect_until};
use observer_testing::Netns;

/// Overflow a never-accepting listener on `addr` (port `port`) with 8
/// connection attempts; observer starts before the listener exists, or
/// after (then no listen() was seen and the owner is found another way).
fn overflow(addr: &str, port: u16, listener_first: bool) {
    let ns = Netns::new();
    let mut obs = (!listener_first).then(Observer::start);
    let server = ns.serve(&["--listen", addr, "--backlog", "1", "--never-accept"]);
    let mut obs = obs.take().unwrap_or_else(Observer::start);
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
