//! One process must not blind the node: a process refused by 20,000
//! distinct ports (a scanner, or a proxy meeting ever-new pod IPs) once
//! filled the connect-error map, and every other process's errors, the
//! EADDRNOTAVAIL this product exists for among them, went uncounted. Now a
//! process gets a bounded share of each map per interval, beyond which its
//! errors count under its folded destination, exactly.
mod common;

use std::{net::SocketAddr, process::Stdio};

use common::{Observer, collect_until};
use observer_common::buffers::{FOLDED_DADDR, KEYS_PER_PROCESS};
use observer_testing::{ClientReport, Netns, churn};

const ECONNREFUSED: u32 = 111;
const EADDRNOTAVAIL: u32 = 99;
const SCANNED: u64 = 20_000;

#[test]
fn a_scanner_does_not_blind_observer_to_the_other_processes() {
    let mut obs = Observer::start();
    let ns = Netns::new();

    // All within one interval: no round runs until every client is done.
    // Ports below the ephemeral range, so no connect() meets itself.
    let scan = ns
        .command(&churn())
        .args(["scan", "--to", "127.0.0.1", "--ports", &format!("2000-{}", 2000 + SCANNED - 1)])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let scanner_pid = scan.id();
    let out = scan.wait_with_output().unwrap();
    let scanner = ClientReport::parse(scanner_pid, &String::from_utf8(out.stdout).unwrap());
    assert_eq!(scanner.errors("ECONNREFUSED"), SCANNED, "{scanner:?}");

    // Then the others: one refused 5 times, one out of ports.
    let refused_dest: SocketAddr = "127.0.0.1:45000".parse().unwrap();
    let refused = ns.client(&["--to", "127.0.0.1:45000", "--count", "5"]);
    assert_eq!(refused.errors("ECONNREFUSED"), 5);
    ns.sysctl("net.ipv4.ip_local_port_range", "40000 40009");
    let _server = ns.serve(&["--listen", "127.0.0.1:8090", "--hold"]);
    let exhausted = ns.client(&["--to", "127.0.0.1:8090", "--count", "16", "--hold"]);
    assert_eq!(exhausted.errors("EADDRNOTAVAIL"), 6, "{exhausted:?}");
    let exhausted_dest: SocketAddr = "127.0.0.1:8090".parse().unwrap();

    collect_until(&mut obs, |o| {
        o.all_connect_errors(scanner_pid) >= SCANNED
            && o.connect_errors(refused.pid, refused_dest, ECONNREFUSED) >= 5
            && o.connect_errors(exhausted.pid, exhausted_dest, EADDRNOTAVAIL) >= 6
    });
    // The others: exact, with their destinations.
    assert_eq!(obs.connect_errors(refused.pid, refused_dest, ECONNREFUSED), 5);
    assert_eq!(obs.all_connect_errors(refused.pid), 5);
    assert_eq!(obs.connect_errors(exhausted.pid, exhausted_dest, EADDRNOTAVAIL), 6);
    assert_eq!(obs.all_connect_errors(exhausted.pid), 6);
    // The scanner: every refusal counted; its first destinations apart,
    // the rest under its folded destination.
    assert_eq!(obs.all_connect_errors(scanner_pid), SCANNED);
    let folded = obs.connect_errors_to(scanner_pid, FOLDED_DADDR, ECONNREFUSED);
    assert_eq!(folded, SCANNED - KEYS_PER_PROCESS, "destinations kept apart: {KEYS_PER_PROCESS}");
}
