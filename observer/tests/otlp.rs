//! OTLP push against a real receiver: a sink that decodes observer's
//! exports with the official OpenTelemetry protobuf definitions
//! (opentelemetry-proto), over gRPC (tonic) and HTTP/protobuf. During a
//! reproduced port exhaustion the pushed values must equal the kernel's
//! ground truth (the errno the client saw) and the Prometheus endpoint's;
//! a collector that is down, then up, must get every count; SIGTERM must
//! push the last counts.
mod common;
#[path = "common/otlp_sink.rs"]
mod otlp_sink;

use std::{sync::Arc, time::Duration};

use common::{
    daemon::{Daemon, scrape_until, start_daemon_with_env},
    flood::{SLOW_CLIENTS, flood, room_for_the_flood},
};
use observer_testing::{
    Netns, Server,
    http::{free_port, sample},
};
use opentelemetry_proto::tonic::metrics::v1::AggregationTemporality;
use otlp_sink::{Pki, Sink, Value, string_attr};

fn error_attrs(pid: u32) -> Vec<(&'static str, Value)> {
    vec![
        ("process.pid", Value::Int(pid as i64)),
        ("error.type", Value::Str("EADDRNOTAVAIL")),
        ("server.address", Value::Str("127.0.0.1")),
        ("server.port", Value::Int(8080)),
    ]
}

fn prometheus_errors(daemon: &Daemon, pid: u32) -> Option<u64> {
    let body = daemon.scrape();
    sample(
        &body,
        "observer_tcp_connect_errors_total",
        &[&format!("process_pid=\"{pid}\""), "error_type=\"EADDRNOTAVAIL\""],
    )
}

fn pushes_equal_the_kernel_and_prometheus(protocol: &str, sink: impl Fn(u16) -> Sink) {
    let port = free_port();
    let sink = sink(port);
    let endpoint = format!("http://127.0.0.1:{port}");
    let daemon = start_daemon_with_env(
        &["--otlp-endpoint", &endpoint, "--otlp-protocol", protocol, "--otlp-interval", "300ms"],
        &[("NODE_NAME", "node-otlp")],
    );
    let (_ns, _server, pid, failures) = common::exhaust_ports();
    let attrs = error_attrs(pid);
    let arrived = sink.wait_for(Duration::from_secs(20), |s| s.latest("observer.tcp.connect_errors", &attrs) >= 3);
    assert!(arrived, "{protocol}: no push with the count; {} requests", sink.requests());
    assert_eq!(sink.latest("observer.tcp.connect_errors", &attrs), failures as i64, "{protocol}: the kernel's count");
    assert_eq!(prometheus_errors(&daemon, pid), Some(failures), "{protocol}: the Prometheus endpoint's count");
    // The same instruments on both paths: connects of the client too.
    let connects = sink.latest("observer.tcp.connects", &[("process.pid", Value::Int(pid as i64))]);
    let body = daemon.scrape();
    assert_eq!(
        sample(&body, "observer_tcp_connects_total", &[&format!("process_pid=\"{pid}\"")]),
        Some(connects as u64),
        "{protocol}"
    );
    // Cumulative by default.
    let temporalities: Vec<i32> = sink.points("observer.tcp.connect_errors", &attrs).iter().map(|p| p.1).collect();
    assert!(temporalities.iter().all(|t| *t == AggregationTemporality::Cumulative as i32), "{temporalities:?}");
    // Who is reporting.
    let resource = sink.resource();
    assert_eq!(string_attr(&resource, "service.name").as_deref(), Some("observer"));
    assert_eq!(string_attr(&resource, "service.version").as_deref(), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(string_attr(&resource, "service.instance.id").as_deref(), Some("node-otlp"));
    assert_eq!(string_attr(&resource, "k8s.node.name").as_deref(), Some("node-otlp"));
    assert_eq!(string_attr(&resource, "os.type").as_deref(), Some("linux"));
    assert!(string_attr(&resource, "host.name").is_some_and(|h| !h.is_empty()), "{resource:?}");
}

#[test]
fn grpc_pushes_equal_the_kernel_and_prometheus() {
    pushes_equal_the_kernel_and_prometheus("grpc", Sink::grpc);
}

#[test]
fn http_protobuf_pushes_equal_the_kernel_and_prometheus() {
    pushes_equal_the_kernel_and_prometheus("http/protobuf", Sink::http);
}

/// The collector is down while the incident happens, then comes up: no
/// crash, one log line for the whole streak, one pending batch at most,
/// and then every count arrives.
fn collector_down_then_up(temporality: &str) {
    let port = free_port(); // nothing listens there yet
    let endpoint = format!("http://127.0.0.1:{port}");
    let daemon = start_daemon_with_env(
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "grpc",
            "--otlp-interval",
            "200ms",
            "--otlp-temporality",
            temporality,
        ],
        &[],
    );
    let (_ns, _server, pid, failures) = common::exhaust_ports();
    let failed =
        |body: &str| sample(body, "observer_export_failures_total", &["observer_exporter=\"otlp\""]).unwrap_or(0);
    let body = scrape_until(&daemon, Duration::from_secs(30), |b| {
        failed(b) >= 3 && sample(b, "observer_tcp_connect_errors_total", &[&format!("process_pid=\"{pid}\"")]).is_some()
    });
    assert!(failed(&body) >= 3, "pushes to a closed port must fail: {body}");
    let pending = sample(&body, "observer_export_pending_batches", &["observer_exporter=\"otlp\""]).unwrap();
    if temporality == "cumulative" {
        assert_eq!(pending, 1, "cumulative keeps only the newest batch");
    } else {
        assert!((1..=30).contains(&pending), "delta keeps unsent batches, at most 30: {pending}");
    }
    let log = daemon.log();
    assert_eq!(log.matches("OTLP export failed").count(), 1, "one line per failure streak:\n{log}");

    let sink = Sink::grpc(port);
    let attrs = error_attrs(pid);
    let total = |s: &Sink| -> i64 {
        let points = s.points("observer.tcp.connect_errors", &attrs);
        if temporality == "delta" { points.iter().map(|p| p.0).sum() } else { points.last().map_or(0, |p| p.0) }
    };
    // Backoff doubles per failure (in intervals, capped at 2 minutes).
    let arrived = sink.wait_for(Duration::from_secs(60), |s| total(s) >= failures as i64);
    assert!(arrived, "after the collector came up: {} of {failures}; log:\n{}", total(&sink), daemon.log());
    // Complete, not doubled: give a few more pushes the chance to add more.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(total(&sink), failures as i64);
    let log = daemon.log();
    assert_eq!(log.matches("OTLP export recovered").count(), 1, "{log}");
    let body = daemon.scrape();
    assert_eq!(sample(&body, "observer_export_pending_batches", &["observer_exporter=\"otlp\""]), Some(0), "{body}");
}

#[test]
fn a_collector_down_then_up_gets_every_cumulative_count() {
    collector_down_then_up("cumulative");
}

#[test]
fn a_collector_down_then_up_gets_every_delta_exactly_once() {
    collector_down_then_up("delta");
}

/// A daemon pushing once an hour, and an exhausted client it has counted
/// (not pushed yet): only the final push on SIGTERM can carry its count.
struct BeforeTheFinalPush {
    sink: Sink,
    daemon: Daemon,
    _namespace: (Netns, Server),
    pid: u32,
    failures: u64,
}

fn before_the_final_push() -> BeforeTheFinalPush {
    let port = free_port();
    let sink = Sink::http(port);
    let endpoint = format!("http://127.0.0.1:{port}");
    let daemon = start_daemon_with_env(
        &["--otlp-endpoint", &endpoint, "--otlp-protocol", "http/protobuf", "--otlp-interval", "1h"],
        &[],
    );
    let (ns, server, pid, failures) = common::exhaust_ports();
    scrape_until(&daemon, Duration::from_secs(10), |b| {
        sample(b, "observer_tcp_connect_errors_total", &[&format!("process_pid=\"{pid}\"")]).is_some()
    });
    assert_eq!(sink.requests(), 0, "nothing pushed before the interval");
    BeforeTheFinalPush { sink, daemon, _namespace: (ns, server), pid, failures }
}

/// SIGTERM pushes the counts since the last push, then exits.
#[test]
fn sigterm_pushes_the_last_counts_and_exits() {
    let BeforeTheFinalPush { sink, mut daemon, _namespace, pid, failures } = before_the_final_push();
    // A hang detector, not a speed check: the final push is bounded.
    let status = daemon.terminate(Duration::from_secs(30)).expect("observer still running 30 s after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert_eq!(sink.requests(), 1, "one final push");
    assert_eq!(sink.latest("observer.tcp.connect_errors", &error_attrs(pid)), failures as i64);
}

/// The final push goes out, and observer ends within 5 s of SIGTERM, while
/// hundreds of clients hold the metrics port with requests that never end
/// (any pod can reach it).
#[test]
fn sigterm_under_a_flood_of_unfinished_requests_still_pushes_the_last_counts() {
    use std::sync::atomic::{AtomicBool, Ordering};
    room_for_the_flood();
    let BeforeTheFinalPush { sink, mut daemon, _namespace, pid, failures } = before_the_final_push();
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = flood(daemon.port, stop.clone());
    std::thread::sleep(Duration::from_secs(2));
    let status = daemon.terminate(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let opened = flooding.join().unwrap();
    assert!(opened >= SLOW_CLIENTS as u64, "the flood opened only {opened} connections");
    let status = status.expect("observer still running 5 s after SIGTERM, with clients that never finish");
    assert!(status.success(), "{status:?}: {}", daemon.log());
    assert_eq!(sink.requests(), 1, "one final push");
    assert_eq!(sink.latest("observer.tcp.connect_errors", &error_attrs(pid)), failures as i64);
}

/// https: an unknown CA is refused over gRPC and HTTP (nothing arrives
/// unverified); the CA given with OTEL_EXPORTER_OTLP_CERTIFICATE
/// (`--otlp-certificate`) is trusted and the pushes arrive; a file with no
/// certificate in it is refused at start.
#[test]
fn https_pushes_verify_the_collector() {
    let pki = Pki::new();
    for (protocol, sink) in [("http/protobuf", Sink::http_tls as fn(u16, &Pki) -> Sink), ("grpc", Sink::grpc_tls)] {
        let port = free_port();
        let sink = sink(port, &pki);
        let endpoint = format!("https://127.0.0.1:{port}");
        let args = ["--otlp-endpoint", &endpoint, "--otlp-protocol", protocol, "--otlp-interval", "300ms"];

        let untrusting = start_daemon_with_env(&args, &[]);
        let body = scrape_until(&untrusting, Duration::from_secs(20), |b| {
            sample(b, "observer_export_failures_total", &["observer_exporter=\"otlp\""]).is_some_and(|n| n >= 2)
        });
        assert!(
            sample(&body, "observer_export_failures_total", &["observer_exporter=\"otlp\""]).is_some_and(|n| n >= 2),
            "{protocol}: an unknown CA must be refused: {body}"
        );
        if protocol == "grpc" {
            assert!(untrusting.log().contains("UnknownIssuer"), "{protocol}: {}", untrusting.log());
        }
        assert_eq!(sink.requests(), 0, "{protocol}: nothing may arrive unverified");
        drop(untrusting);

        let ca = pki.ca_file.to_str().unwrap();
        let out = std::process::Command::new(common::daemon::OBSERVER)
            .args(["run", "--prometheus-listen", "127.0.0.1:0", "--otlp-certificate", "/etc/hostname"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{protocol}: {err}");
        assert!(err.contains("/etc/hostname: no PEM certificate"), "{protocol}: {err}");
        let _trusting = start_daemon_with_env(&args, &[("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)]);
        assert!(
            sink.wait_for(Duration::from_secs(20), |s| s.requests() > 0),
            "{protocol}: nothing arrived with the CA"
        );
        assert_eq!(string_attr(&sink.resource(), "service.name").as_deref(), Some("observer"));
    }
}
