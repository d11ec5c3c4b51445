//! Any pod can reach the metrics port (the DaemonSet serves it on the pod
//! network): clients that never finish their request, flooding it, must
//! not take the endpoint from the scraper, the daemon's memory past the
//! DaemonSet's limit, or its shutdown.
mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::{
    daemon::start_daemon,
    flood::{SLOW_CLIENTS, flood, room_for_the_flood},
};
use observer_testing::http::{sample, try_get_within};

/// The DaemonSet's memory limit, in bytes, from the manifest.
fn manifest_memory_limit() -> u64 {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/daemonset.yaml"))
        .expect("daemonset.yaml");
    let after_limits = manifest.split("limits:").nth(1).expect("resources.limits in the DaemonSet");
    let memory = after_limits.lines().find_map(|l| l.trim().strip_prefix("memory:")).expect("limits.memory");
    let mib: u64 = memory.trim().strip_suffix("Mi").expect("a limit in Mi").parse().unwrap();
    mib * 1024 * 1024
}

/// Peak resident memory of `pid` (VmHWM), bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap().trim().trim_end_matches(" kB").parse().unwrap();
    kib * 1024
}

#[test]
fn a_flood_of_unfinished_requests_leaves_scrapes_memory_and_shutdown_alone() {
    room_for_the_flood();
    let mut daemon = start_daemon(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = flood(daemon.port, stop.clone());

    // Scrapes during the flood, each given a second to connect and a
    // second to answer, as the user expects.
    std::thread::sleep(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut scrapes = 0;
    while Instant::now() < deadline {
        let body = try_get_within(daemon.port, "/metrics", Duration::from_secs(1));
        assert!(
            body.as_deref().is_ok_and(|b| b.contains("observer_probe_info")),
            "scrape {scrapes} during the flood: {:?}",
            body.map(|_| "no observer_probe_info")
        );
        let health = try_get_within(daemon.port, "/healthz", Duration::from_secs(1));
        assert!(health.is_ok(), "/healthz during the flood: {health:?}");
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(300));
    }

    // The cap was reached: the closed connections are counted and logged.
    let body = try_get_within(daemon.port, "/metrics", Duration::from_secs(1)).unwrap();
    let evicted = sample(&body, "observer_http_connections_closed_total", &["observer_close_reason=\"evicted\""]);
    assert!(evicted.is_some_and(|n| n > 0), "evictions counted: {evicted:?}");
    assert!(daemon.log().contains("at its cap of"), "{}", daemon.log());

    let pid = daemon.child.id();
    let (peak, limit) = (peak_rss(pid), manifest_memory_limit());
    assert!(peak < limit, "peak RSS {peak} B is over the DaemonSet's limit {limit} B");

    // SIGTERM while the flood goes on: out within 5 s, cleanly.
    let status = daemon.terminate(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let opened = flooding.join().unwrap();
    assert!(opened >= SLOW_CLIENTS as u64, "the flood opened only {opened} connections");
    let status = status.expect("observer still running 5 s after SIGTERM, with clients that never finish");
    assert!(status.success(), "exit status {status}: {}", daemon.log());
}
