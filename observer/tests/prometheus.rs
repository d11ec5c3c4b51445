//! A real Prometheus server (Debian's, unpacked by `cargo xtask setup`)
//! scrapes the daemon while a port exhaustion is reproduced in a network
//! namespace. Prometheus's own HTTP API must then return, for the client's
//! pid, exactly the EADDRNOTAVAIL count the client saw; and `promtool check
//! metrics` must find nothing wrong with what observer serves.
mod common;

use std::{process::Command, time::Duration};

use common::{daemon::start_daemon, prometheus::Prometheus, run_with_input, tool};
use observer_testing::Netns;

#[test]
fn prometheus_finds_the_exact_eaddrnotavail_count_of_the_client() {
    let daemon = start_daemon(&[]);
    let prometheus = Prometheus::start(daemon.port);
    let (_ns, _server, client_pid, failures) = common::exhaust_ports();

    let promql = format!(
        "observer_tcp_connect_errors_total{{process_pid=\"{}\",error_type=\"EADDRNOTAVAIL\",\
         server_address=\"127.0.0.1\",server_port=\"8080\"}}",
        client_pid
    );
    // The series appears with its final value: the client is done before
    // observer's first collection after it.
    let result = prometheus.query_until_found(&promql, Duration::from_secs(30));
    assert_eq!(result.len(), 1, "{promql}: {result:?}; prometheus log:\n{}", prometheus.log());
    assert_eq!(result[0].1, failures as f64, "{result:?}");
    assert_eq!(result[0].0["process_executable_name"], "observer-churn", "{result:?}");
    assert_eq!(result[0].0["job"], "observer");
    // Prometheus sees the target healthy, and who it is.
    let up = prometheus.query("up{job=\"observer\"}");
    assert_eq!(up.iter().map(|r| r.1).collect::<Vec<_>>(), [1.0], "{up:?}");
    let info = prometheus.query("target_info{service_name=\"observer\"}");
    assert_eq!(info.len(), 1, "{info:?}");
}

#[test]
fn promtool_finds_no_problem_in_the_exposition() {
    let daemon = start_daemon(&[]);
    // Some traffic, so that per-process series exist too.
    let ns = Netns::new();
    let _server = ns.serve(&["--listen", "127.0.0.1:8080"]);
    let client = ns.client(&["--to", "127.0.0.1:8080", "--count", "3"]);
    assert_eq!(client.connected, 3);
    let body = common::daemon::scrape_until(&daemon, Duration::from_secs(10), |b| {
        b.contains(&format!("process_pid=\"{}\"", client.pid))
    });
    let exposition = body.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or(&body);
    assert!(exposition.contains("observer_tcp_connects_total{"), "{exposition}");
    let out = run_with_input(
        Command::new(tool("OBSERVER_PROMTOOL", "promtool")).args(["check", "metrics"]),
        exposition.as_bytes(),
    );
    let report = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && report.trim().is_empty(), "promtool check metrics:\n{report}");
}
