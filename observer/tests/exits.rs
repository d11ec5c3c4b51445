//! A process's series end a grace period after the process ends, and not
//! before: the kernel's exit notice comes from the thread-group leader,
//! which can end while the process runs on.
mod common;

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use common::daemon::{scrape_until, start_daemon};
use observer_testing::{ClientReport, Netns, churn, http::sample};

#[test]
fn a_process_whose_leader_thread_exits_keeps_counting_in_one_series() {
    // Grace 3 s, the client runs 6 s: retiring it at its leader's exit
    // would restart its series halfway (a counter reset, counts lost).
    let daemon = start_daemon(&["--grace", "3s"]);
    let ns = Netns::new();
    let client = ns
        .command(&churn())
        .args(["connect", "--to", "127.0.0.1:20600", "--count", "40", "--spread", "6s", "--leader-exits"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = client.id();
    let out = client.wait_with_output().unwrap();
    let report = ClientReport::parse(pid, &String::from_utf8(out.stdout).unwrap());
    assert_eq!(report.errors("ECONNREFUSED"), 40);
    let ended = Instant::now();

    let labels = [format!("process_pid=\"{pid}\""), "error_type=\"ECONNREFUSED\"".to_string()];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let body = scrape_until(&daemon, Duration::from_secs(2), |b| {
        sample(b, "observer_tcp_connect_errors_total", &labels).is_some_and(|n| n >= 40)
    });
    assert!(ended.elapsed() < Duration::from_secs(3), "scraped within the grace period after the end");
    assert_eq!(sample(&body, "observer_tcp_connect_errors_total", &labels), Some(40), "one series, every refusal");

    // Once the whole process has ended, its series go after the grace.
    let body = scrape_until(&daemon, Duration::from_secs(15), |b| {
        sample(b, "observer_tcp_connect_errors_total", &labels).is_none()
    });
    assert_eq!(sample(&body, "observer_tcp_connect_errors_total", &labels), None, "retired after the grace");
}

/// An exit storm: 150 processes refused twice each, all exiting at once,
/// twice over. Each process's count is exact in its own series; each batch
/// is retired a grace period after it ended, so the second batch finds the
/// process slots free (200 by default: without the retirement, 300
/// processes would overflow into `other`).
#[test]
fn an_exit_storm_is_counted_exactly_and_retired_whole() {
    const BATCH: usize = 150;
    let daemon = start_daemon(&["--grace", "1s"]);
    let ns = Netns::new();
    for batch in 0..2 {
        let port = 20700 + batch;
        let clients: Vec<_> = (0..BATCH)
            .map(|_| {
                ns.command(&churn())
                    .args(["connect", "--to", &format!("127.0.0.1:{port}"), "--count", "2"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let pids: Vec<u32> = clients.iter().map(std::process::Child::id).collect();
        for client in clients {
            let pid = client.id();
            let out = client.wait_with_output().unwrap();
            let report = ClientReport::parse(pid, &String::from_utf8(out.stdout).unwrap());
            assert_eq!(report.errors("ECONNREFUSED"), 2, "ground truth: each client refused twice");
        }
        let count = |body: &str, pid: u32| {
            sample(body, "observer_tcp_connect_errors_total", &[&format!("process_pid=\"{pid}\"")])
        };
        let body = scrape_until(&daemon, Duration::from_secs(10), |b| pids.iter().all(|p| count(b, *p) == Some(2)));
        let wrong: Vec<String> = pids
            .iter()
            .filter(|p| count(&body, **p) != Some(2))
            .map(|p| format!("{p}: {:?}", count(&body, *p)))
            .collect();
        assert!(wrong.is_empty(), "batch {batch}: not 2 refusals each: {wrong:?}");
        let other = sample(&body, "observer_tcp_connect_errors_total", &["process_pid=\"other\""]);
        assert_eq!(other, None, "batch {batch}: nothing folded into other");
        // Then the whole batch goes.
        let body = scrape_until(&daemon, Duration::from_secs(15), |b| pids.iter().all(|p| count(b, *p).is_none()));
        let left = pids.iter().filter(|p| count(&body, **p).is_some()).count();
        assert_eq!(left, 0, "batch {batch}: {left} processes not retired 15 s after they all ended");
    }
}
