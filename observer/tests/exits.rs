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
