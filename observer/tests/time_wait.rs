//! TIME_WAIT piles up on the side that closes first. observer must charge
//! each entry to the process owning the socket, though the transition
//! happens in softirq, and match the kernel's own count of TIME_WAIT
//! entries in the namespace exactly.
mod common;

use common::{Observer, collect_until};
use observer::node::sweep::KERNEL_CHECK_EVERY;
use observer_testing::Netns;

const CONNECTIONS: u64 = 25;

/// The run of `close_first`: the observer, the namespace, the client's and
/// the server's pids, and the TIME_WAIT entries the kernel saw.
fn scenario(close_first: &str) -> (Observer, Netns, u32, u32, u64) {
    let mut obs = Observer::start();
    let ns = Netns::new();
    let server = ns.serve(&["--listen", "127.0.0.1:7000", "--close-first", close_first]);
    let count = CONNECTIONS.to_string();
    let client_started = std::time::Instant::now();
    let client = ns.client(&["--to", "127.0.0.1:7000", "--count", &count, "--close-first", close_first]);
    let client_took = client_started.elapsed();
    assert_eq!(client.connected, CONNECTIONS, "{client:?}");
    let entered = kernel_count(&ns, client_took);
    let server_pid = server.pid();
    let started = std::time::Instant::now();
    let charged = |o: &Observer| o.process(client.pid).time_wait_entries + o.process(server_pid).time_wait_entries;
    collect_until(&mut obs, |o| charged(o) >= entered);
    // Short: where the rest went (another process, pid 0 for an unknown
    // owner, or nowhere within the wait), for whoever reads the failure.
    assert_eq!(
        charged(&obs),
        entered,
        "TIME_WAIT entries of the client ({}) and the server ({server_pid}) after {:?} of rounds; every process's: \
         {:?}; updates lost by slot: {:?}",
        client.pid,
        started.elapsed(),
        obs.time_wait_entries_by_process(),
        obs.lost()
    );
    (obs, ns, client.pid, server_pid, entered)
}

/// Ground truth: the kernel's count of TIME_WAIT entries in `ns` (see
/// `time_wait_entered`), read until all 25 are there (bounded by time:
/// under software emulation one read can take most of a second). Short of
/// 25, it fails with every distinct reading, with the namespace's sockets
/// as they were then, and the namespace's counters (an entry the kernel
/// did not count shows there: RSTs, aborts, TIME_WAIT overflow).
fn kernel_count(ns: &Netns, client_took: std::time::Duration) -> u64 {
    let started = std::time::Instant::now();
    let mut entered = 0;
    let mut readings: Vec<String> = Vec::new();
    while started.elapsed() < std::time::Duration::from_secs(20) {
        entered = ns.time_wait_entered();
        if entered == CONNECTIONS {
            return entered;
        }
        let reading = format!("{entered} at {:?}", started.elapsed() + client_took);
        if readings.last().is_none_or(|last| !last.starts_with(&format!("{entered} at"))) {
            readings.push(format!("{reading}, sockets:\n{}", ns.ss_all()));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!(
        "TIME_WAIT entries: {entered} of {CONNECTIONS} (client took {client_took:?}); every distinct reading, with the \
         time since the client started:\n{}\nthe namespace's counters:\n{}",
        readings.join("\n"),
        ns.nstat_report()
    );
}

#[test]
fn client_first_close_is_charged_to_the_client() {
    let (obs, _ns, client, server, in_time_wait) = scenario("client");
    assert_eq!(obs.process(client).time_wait_entries, in_time_wait);
    assert_eq!(obs.process(server).time_wait_entries, 0);
}

#[test]
fn server_first_close_is_charged_to_the_server() {
    let (obs, _ns, client, server, in_time_wait) = scenario("server");
    assert_eq!(obs.process(server).time_wait_entries, in_time_wait);
    assert_eq!(obs.process(client).time_wait_entries, 0);
}

/// observer_kernel_unseen_events_total{observer_event="time_wait_entry"}.
fn unseen(body: &str) -> Option<u64> {
    observer_testing::http::sample(body, "observer_kernel_unseen_events_total", &["observer_event=\"time_wait_entry\""])
}

/// Where the kernel counts TIME_WAIT sockets only when they end (5.10),
/// there is nothing to check observer's count against: the daemon exports
/// no unseen count (never a zero that claims a check) and says why. True
/// when that is the case (and checked).
fn no_check_on_this_kernel() -> bool {
    if observer_testing::netns::time_wait_counted_at_entry() {
        return false;
    }
    let daemon = common::daemon::start_daemon(&[]);
    let body = common::daemon::scrape_until(&daemon, std::time::Duration::from_secs(3), |_| false);
    assert_eq!(unseen(&body), None, "no check, no series");
    assert!(daemon.log().contains("counts TIME_WAIT sockets in TcpExtTW/TcpExtTWKilled only when they end"));
    true
}

/// The daemon, once its first check of TIME_WAIT entries (at its first
/// round) has taken each namespace's counts as the start. It runs alone
/// (`common::loads`), which the unseen checks need besides exactness: they
/// are node-wide, and another test's churn would add its unseen entries.
fn daemon_after_first_check(env: &[(&str, &str)]) -> common::daemon::Daemon {
    let daemon = common::daemon::start_daemon_with_env(&[], env);
    common::daemon::scrape_until(&daemon, std::time::Duration::from_secs(10), |b| unseen(b).is_some());
    daemon
}

/// Entries the programs never ran for cannot be made on purpose, so the
/// fault is injected where the check reads the programs' count: 5 of the
/// namespace's 25 entries hidden. The kernel's own count must show them.
#[test]
fn time_wait_entries_the_programs_missed_are_counted_as_unseen() {
    use std::os::unix::fs::MetadataExt as _;
    if no_check_on_this_kernel() {
        return;
    }
    let ns = Netns::new();
    let _server = ns.serve(&["--listen", "127.0.0.1:7000"]);
    let inode = std::fs::metadata(ns.path()).unwrap().ino().to_string();
    let daemon = daemon_after_first_check(&[("FAILPOINTS", &format!("time-wait-unseen=return({inode})"))]);
    let before = ns.time_wait_entered();
    let client = ns.client(&["--to", "127.0.0.1:7000", "--count", &CONNECTIONS.to_string()]);
    assert_eq!(client.connected, CONNECTIONS, "{client:?}");
    let body = common::daemon::scrape_until(&daemon, std::time::Duration::from_secs(60), |b| unseen(b) == Some(5));
    assert_eq!(ns.time_wait_entered() - before, CONNECTIONS, "the kernel's own count");
    assert_eq!(unseen(&body), Some(5), "{}", daemon.log());
}

/// The hostile case of the check: a namespace born with a burst of
/// entries, all seen, before its first check, then 5 missed after it. The
/// burst must not make up for the 5 (a check that took the programs'
/// count from 0 while the kernel's started at its first reading did).
#[test]
fn entries_seen_before_a_namespaces_first_check_do_not_hide_later_misses() {
    if no_check_on_this_kernel() {
        return;
    }
    let name = Netns::unique_name();
    let failpoint = format!("time-wait-unseen=return({})", Netns::path_of(&name).display());
    let hold = common::daemon::ChecksHold::new();
    let daemon = common::daemon::start_daemon_for_checks(&hold, &failpoint);
    let (ns, _server, before) = common::daemon::between_checks(&daemon, &hold, || {
        let ns = Netns::named(name);
        let server = ns.serve(&["--listen", "127.0.0.1:7000"]);
        let before = ns.time_wait_entered();
        let burst = ns.client(&["--to", "127.0.0.1:7000", "--count", &CONNECTIONS.to_string()]);
        assert_eq!(burst.connected, CONNECTIONS, "{burst:?}");
        (ns, server, before)
    });
    // Its first check done (the next check round), then more entries.
    let burst_done = observer_testing::http::rounds_completed(&daemon.scrape());
    let limit = std::time::Duration::from_secs(30);
    common::daemon::scrape_until(&daemon, limit, |b| {
        observer_testing::http::rounds_completed(b) > burst_done + KERNEL_CHECK_EVERY
    });
    let client = ns.client(&["--to", "127.0.0.1:7000", "--count", &CONNECTIONS.to_string()]);
    assert_eq!(client.connected, CONNECTIONS, "{client:?}");
    let body = common::daemon::scrape_until(&daemon, std::time::Duration::from_secs(60), |b| unseen(b) == Some(5));
    assert_eq!(ns.time_wait_entered() - before, 2 * CONNECTIONS, "the kernel's own count");
    assert_eq!(unseen(&body), Some(5), "{}", daemon.log());
}

/// A full-speed churn: every TIME_WAIT entry the kernel made is charged to
/// the churn, though the kernel skips runs of `sock_state` at this speed
/// (a softirq's state change while a process-context one runs on that
/// CPU: hundreds per 100,000 connections on Linux 6.18), since
/// `time_wait_missed` counts those at the socket's destroy; and the
/// unseen check reports nothing (no false alarm: the two counts move
/// microseconds apart, and a check round falls between them often at this
/// speed). No other load comes or goes meanwhile (`common::loads`).
#[test]
fn no_time_wait_entry_is_lost_under_full_speed_churn() {
    if no_check_on_this_kernel() {
        return;
    }
    let ns = Netns::new();
    let daemon = daemon_after_first_check(&[]);
    let (pid, entered) = full_speed_churn(&ns, 10_000);
    let (counted, unseen, telling) = after_three_checks(&daemon, pid);
    assert_eq!(
        counted,
        entered,
        "TIME_WAIT entries of the churn counted, of the kernel's:\n{telling}\n{}",
        daemon.log()
    );
    assert_eq!(unseen, Some(0), "{telling}\n{}", daemon.log());
}

/// Another tool attaching and detaching programs on the same tracepoints
/// (here a second observer, started and stopped over and over, as in a
/// rolling update of the DaemonSet) makes the kernel run a block of this
/// daemon's programs not at all, unseen by its skipped-run counts (in 1
/// to 3 of 8 such churns here). What cannot be counted must be a number:
/// every entry the kernel made is charged to the churn or counted as
/// unseen, never both, never neither.
#[test]
fn entries_lost_while_another_tool_attaches_are_counted_as_unseen() {
    if no_check_on_this_kernel() {
        return;
    }
    let ns = Netns::new();
    let daemon = daemon_after_first_check(&[]);
    let churning = std::sync::atomic::AtomicBool::new(true);
    let ((pid, entered), others) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let mut started = 0;
            while churning.load(std::sync::atomic::Ordering::Relaxed) {
                // Attached once it serves, detached as it is dropped.
                let _other = common::daemon::start_daemon_beside(&[]);
                started += 1;
            }
            started
        });
        let churned = full_speed_churn(&ns, 10_000);
        churning.store(false, std::sync::atomic::Ordering::Relaxed);
        (churned, other.join().unwrap())
    });
    assert!(others >= 1, "no other daemon came and went during the churn");
    let (counted, unseen, telling) = after_three_checks(&daemon, pid);
    println!("{others} other daemons came and went");
    assert!(counted <= entered, "more counted than the kernel made:\n{telling}");
    assert_eq!(unseen, Some(entered - counted), "{telling}\n{}", daemon.log());
}

/// Run the churn at full speed in `ns` (2 threads, the client closing
/// first): `connections` TIME_WAIT entries, all the churn's, as the
/// kernel's own count must show. Its pid and that count.
fn full_speed_churn(ns: &Netns, connections: u64) -> (u32, u64) {
    let before = ns.time_wait_entered();
    let churn = ns
        .command(&observer_testing::churn::churn())
        .args(["churn", "--threads", "2", "--listen", "127.0.0.1:7000", "--connections", &connections.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // `ip netns exec` execs the churn: the pid is the churn's.
    let pid = churn.id();
    let out = churn.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let entered = ns.time_wait_entered() - before;
    assert_eq!(entered, connections, "the kernel's own count");
    (pid, entered)
}

/// After three checks (every 10 rounds of 200 ms): the TIME_WAIT entries
/// charged to `pid`, the unseen count, and what a shortfall would be told
/// by (the runs the kernel skipped, entries charged elsewhere, e.g. to no
/// process, the unseen count, any map that filled), printed.
fn after_three_checks(daemon: &common::daemon::Daemon, pid: u32) -> (u64, Option<u64>, String) {
    std::thread::sleep(std::time::Duration::from_secs(7));
    let body = daemon.scrape();
    let counted = observer_testing::http::sample_sum(
        &body,
        "observer_tcp_time_wait_entries_total",
        &[&format!("process_pid=\"{pid}\"")],
    );
    let always =
        ["observer_kernel_missed_events_total", "observer_tcp_time_wait_entries_total", "observer_kernel_unseen"];
    let if_not_zero = ["observer_kernel_lost_updates_total", "observer_map_evictions_total"];
    let telling: Vec<&str> = body
        .lines()
        .filter(|l| {
            always.iter().any(|m| l.starts_with(m))
                || (if_not_zero.iter().any(|m| l.starts_with(m)) && !l.ends_with(" 0"))
        })
        .collect();
    let telling = telling.join("\n");
    println!("TIME_WAIT entries of the churn: {counted}\n{telling}");
    (counted, unseen(&body), telling)
}
