//! A listener that never accepts: its queue fills and the kernel drops new
//! connections. observer must charge the drops to the listener's owner and
//! port, and match the namespace's TcpExtListenOverflows exactly.
mod common;

use std::time::Duration;

use common::{collect_until, Netns, Observer};

#[test]
fn drops_equal_listen_overflows_and_are_charged_to_the_owner() {
    let mut obs = Observer::start();
    let ns = Netns::new();
    let server = ns.serve(&["--listen", "127.0.0.1:8081", "--backlog", "1", "--never-accept"]);
    let before = ns.nstat("TcpExtListenOverflows");

    // Each client socket is closed after 200 ms, so no SYN is retransmitted
    // after the clients are done and the counters settle.
    ns.client(&["--to", "127.0.0.1:8081", "--count", "8", "--nonblocking", "200ms"]);
    std::thread::sleep(Duration::from_millis(300));
    let overflows = ns.nstat("TcpExtListenOverflows") - before;
    assert!(overflows > 0, "the scenario must overflow the accept queue");

    collect_until(&mut obs, |o| o.listen_drops(server.pid(), 8081) >= overflows);
    assert_eq!(obs.listen_drops(server.pid(), 8081), overflows);
}

#[test]
fn a_listener_older_than_observer_is_charged_to_its_owner_too() {
    let ns = Netns::new();
    // The listener exists before observer starts: no listen() was seen.
    let server = ns.serve(&["--listen", "[::1]:8082", "--backlog", "1", "--never-accept"]);
    let mut obs = Observer::start();
    let before = ns.nstat("TcpExtListenOverflows");
    ns.client(&["--to", "[::1]:8082", "--count", "6", "--nonblocking", "200ms"]);
    std::thread::sleep(Duration::from_millis(300));
    let overflows = ns.nstat("TcpExtListenOverflows") - before;
    assert!(overflows > 0, "the scenario must overflow the accept queue");

    collect_until(&mut obs, |o| o.listen_drops(server.pid(), 8082) >= overflows);
    assert_eq!(obs.listen_drops(server.pid(), 8082), overflows);
}
