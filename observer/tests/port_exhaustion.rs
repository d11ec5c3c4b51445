//! The payment-service incident: ephemeral ports run out and connect()
//! fails with EADDRNOTAVAIL. observer must count, for the client's pid and
//! destination, exactly the failures the client saw.
mod common;

use std::net::SocketAddr;

use common::{Observer, collect_until};
use observer_testing::Netns;

const EADDRNOTAVAIL: u32 = 99;

/// A range of 10 ports, held connections, 16 attempts: 10 connect, 6 fail.
fn exhaust(server: &str) {
    let mut obs = Observer::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "40000 40009");
    let _server = ns.serve(&["--listen", server, "--hold"]);
    let active_opens_before = ns.nstat("TcpActiveOpens");

    let client = ns.client(&["--to", server, "--count", "16", "--hold"]);
    assert_eq!(client.connected, 10, "the port range allows 10 connections: {client:?}");
    let failures = client.errors("EADDRNOTAVAIL");
    assert_eq!(failures, 6, "{client:?}");

    let dest: SocketAddr = server.parse().unwrap();
    collect_until(&mut obs, |o| o.connect_errors(client.pid, dest, EADDRNOTAVAIL) >= failures);
    assert_eq!(obs.connect_errors(client.pid, dest, EADDRNOTAVAIL), failures);
    assert_eq!(obs.all_connect_errors(client.pid), failures, "no other errno, no other destination");
    assert_eq!(obs.comm_of(client.pid).as_deref(), Some("observer-churn"));

    // A failed connect sent no SYN: connects equal the kernel's active opens.
    let active_opens = ns.nstat("TcpActiveOpens") - active_opens_before;
    assert_eq!(active_opens, client.connected);
    assert_eq!(obs.process(client.pid).connects, active_opens);
}

#[test]
fn ipv4_eaddrnotavail_equals_what_the_client_saw() {
    exhaust("127.0.0.1:8080");
}

#[test]
fn ipv6_eaddrnotavail_equals_what_the_client_saw() {
    exhaust("[::1]:8080");
}
