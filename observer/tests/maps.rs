//! Self-telemetry of the kernel maps: an LRU map that overflows says so,
//! and so does the map of connections followed.
//! Alone in their test binary, so the host's TCP traffic during a test is
//! its own (test binaries run one after another; the tests here one at a
//! time).
mod common;

use std::{sync::Mutex, time::Duration};

use common::daemon::{scrape_until, start_daemon};
use observer_testing::{
    Netns,
    http::{sample, sample_sum},
};

fn lru_fill(body: &str, map: &str) -> (Option<u64>, Option<u64>, Option<u64>) {
    let label = format!("observer_map_name=\"{map}\"");
    (
        sample(body, "observer_map_usage", &[&label]),
        sample(body, "observer_map_limit", &[&label]),
        sample(body, "observer_map_evictions_total", &[&label]),
    )
}

/// The ESTABLISHED connections of the host's network namespace (`ss`).
fn host_established() -> u64 {
    let out = std::process::Command::new("ss").args(["-Htn", "state", "established"]).output().expect("ss runs");
    assert!(out.status.success(), "ss: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()).count() as u64
}

/// 2000 connections held open overflow OPEN_CONNECTIONS (sized 1024 by
/// --max-sockets): the rest are left out whole, counted and said. Then
/// 2000 more held half-closed (the client's first FIN sent): 2000 closing
/// sockets whose closer SOCK_OWNERS (the same size) must remember for
/// their TIME_WAIT, and the listener's owner: at least 2001 - 1024 were
/// evicted, and no more than were ever inserted; the maps that did not
/// overflow (every connect's in-flight entries come and go) report none.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn an_overflowing_socket_owner_map_reports_its_evictions() {
    const HELD: u64 = 2000;
    const CAPACITY: u64 = 1024;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let daemon = start_daemon(&["--max-sockets", &CAPACITY.to_string()]);
    // The host's connections open now (none on a quiet host), each holding
    // an entry of OPEN_CONNECTIONS the test's do not get: `ss`, neither a
    // scrape (a round that ran while a scrape's connection was open counts
    // it) nor the start-up pass's count (start_daemon's first scrape may
    // be open then): both once made this test wait for 2 entries that were
    // never left.
    let older = host_established();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "20000 60999");
    let server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold", "--backlog", "4096"]);
    let client = ns.client_holding(&["--to", "127.0.0.1:8080", "--count", &HELD.to_string()]);
    assert_eq!(client.report.connected, HELD, "{:?}", client.report);
    let client_pid = client.pid();
    // Every server-side end reached ESTABLISHED (its entry taken or
    // counted lost) before the client closes: a client end closed earlier
    // would free a slot for a late child, and the host's scrapes while the
    // map is full would be lost too. `ss` here, not a scrape.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ns.established("sport = :8080", None) < HELD {
        assert!(std::time::Instant::now() < deadline, "the server's {HELD} connections never all established");
        std::thread::sleep(Duration::from_millis(50));
    }
    client.close();

    // Of the 4000 connection ends
    // (2000 each side, the first 512 pairs filling it) 1024 (less the
    // older ones') are followed and the rest left out whole, counted as
    // lost, the log naming the setting to raise. The client has closed
    // since: every followed connection's end was counted, none is left
    // open (no scrape ran while the map was full, so every loss is the
    // test's).
    let connections = 2 * HELD;
    let lost_label = "observer_map_name=\"OPEN_CONNECTIONS\"";
    let pids = [client_pid, server.pid()].map(|p| format!("process_pid=\"{p}\""));
    let followed =
        |b: &str| pids.iter().map(|p| sample_sum(b, "observer_tcp_connections_established_total", &[p])).sum::<u64>();
    let lost = |b: &str| sample(b, "observer_kernel_lost_updates_total", &[lost_label]);
    // The counters of a process seen for the first time come out once its
    // pod is looked up, a round after the lost count; the map empties in
    // the round after the closes, which may come later still: wait for all
    // three (a round read before the client's FINs arrived once showed
    // entries left).
    let open = |b: &str| lru_fill(b, "OPEN_CONNECTIONS").0;
    let room = CAPACITY - older;
    let body = scrape_until(&daemon, Duration::from_secs(20), |b| {
        lost(b).is_some_and(|n| n >= connections - room) && followed(b) >= room && open(b) == Some(older)
    });
    let (lost, followed, fill) = (lost(&body), followed(&body), lru_fill(&body, "OPEN_CONNECTIONS"));
    let seen = format!("{older} older, lost {lost:?}, followed {followed}, fill {fill:?}");
    assert_eq!(lost, Some(connections - room), "{seen}: {body}");
    assert_eq!(followed, room, "{seen}: {body}");
    assert_eq!(fill, (Some(older), Some(CAPACITY), None), "{seen}: {body}");
    let log = daemon.log();
    assert!(log.contains("OPEN_CONNECTIONS") && log.contains("raise --max-sockets"), "{log}");

    // The closing sockets: each closer noted at its first FIN until its
    // CLOSE, which a half-closed connection holds off.
    let closing = ns.client_holding(&["--to", "127.0.0.1:8080", "--count", &HELD.to_string(), "--half-close"]);
    assert_eq!(closing.report.connected, HELD, "{:?}", closing.report);
    let owned = HELD + 1;
    let least = owned - CAPACITY;
    let body = scrape_until(&daemon, Duration::from_secs(20), |b| {
        lru_fill(b, "SOCK_OWNERS").2.is_some_and(|evicted| evicted >= least)
    });
    let (entries, capacity, evicted) = lru_fill(&body, "SOCK_OWNERS");
    assert_eq!(capacity, Some(CAPACITY), "{body}");
    assert!(entries.is_some_and(|n| n <= CAPACITY), "entries {entries:?}: {body}");
    let evicted = evicted.expect("evictions of SOCK_OWNERS exported");
    // Slack for the host's own sockets meanwhile (the scrapes themselves).
    assert!((least..=owned + 200).contains(&evicted), "evicted {evicted}, expected {least}..={owned}: {body}");

    use observer_common::capacity;
    for (map, size) in [
        ("LISTENERS", capacity::LISTENERS),
        ("INFLIGHT_CONNECTS", capacity::INFLIGHT_CONNECTS),
        ("THREAD_CONNECTS", capacity::THREAD_CONNECTS),
    ] {
        let (entries, capacity, evicted) = lru_fill(&body, map);
        assert!(capacity == Some(size.into()) && entries.is_some(), "{map}: {body}");
        assert_eq!(evicted, Some(0), "{map}: {body}");
    }
    for (map, size) in [("PROC_COUNTERS", capacity::PROC_COUNTERS), ("CONNECT_ERRORS", capacity::CONNECT_ERRORS)] {
        let (entries, capacity, evicted) = lru_fill(&body, map);
        assert!(capacity == Some(size.into()) && entries.is_some(), "{map}: {body}");
        assert_eq!(evicted, None, "{map} is not an LRU map: {body}");
    }
}

/// An out-of-range size is refused before anything loads, naming the flag.
#[test]
fn max_sockets_is_bounded() {
    let out = std::process::Command::new(common::daemon::OBSERVER)
        .args(["run", "--max-sockets", "10", "--dry-run"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--max-sockets") && err.contains("out of range"), "{err}");
}
