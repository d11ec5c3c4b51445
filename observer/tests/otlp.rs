//! OTLP push against a real receiver: a sink that decodes observer's
//! exports with the official OpenTelemetry protobuf definitions
//! (opentelemetry-proto), over gRPC (tonic) and HTTP/protobuf. During a
//! reproduced port exhaustion the pushed values must equal the kernel's
//! ground truth (the errno the client saw) and the Prometheus endpoint's;
//! a collector that is down, then up, must get every count; SIGTERM must
//! push the last counts.
mod common;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{
    daemon::{Daemon, scrape_until, start_daemon_with_env},
    flood::{SLOW_CLIENTS, flood, room_for_the_flood},
};
use observer_testing::{
    Netns, Server,
    http::{free_port, sample},
};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        metrics_service_server::{MetricsService, MetricsServiceServer},
    },
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{AggregationTemporality, metric::Data, number_data_point},
};
use prost::Message as _;

/// Every request a sink received, in order.
type Received = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

/// A test OTLP receiver on 127.0.0.1:`port`, alive as long as this value.
struct Sink {
    received: Received,
    _runtime: tokio::runtime::Runtime,
}

#[derive(Clone)]
struct GrpcReceiver(Received);

#[tonic::async_trait]
impl MetricsService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

/// A throwaway CA and a certificate for 127.0.0.1 it signed (PEM), the
/// CA also as a file for `--otlp-certificate`.
struct Pki {
    ca_file: std::path::PathBuf,
    cert: String,
    key: String,
}

impl Pki {
    fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "observer test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.subject_alt_names.push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = params.signed_by(&key, &issuer).unwrap();
        let ca_file = std::env::temp_dir().join(format!("observer-test-ca-{}.pem", std::process::id()));
        std::fs::write(&ca_file, ca.pem()).unwrap();
        Self { ca_file, cert: cert.pem(), key: key.serialize_pem() }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

/// axum's listener over TLS: a TCP accept, then the handshake.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else { continue };
            // A client that refuses our certificate fails here: wait for the next.
            if let Ok(tls) = self.tls.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

impl Sink {
    /// gRPC over TLS with the PKI's certificate.
    fn grpc_tls(port: u16, pki: &Pki) -> Self {
        let received = Received::default();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let service = MetricsServiceServer::new(GrpcReceiver(received.clone()));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let listener = runtime.block_on(tokio::net::TcpListener::bind(addr)).expect("bind the gRPC sink");
        let identity = tonic::transport::Identity::from_pem(&pki.cert, &pki.key);
        let server = tonic::transport::Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .expect("server TLS")
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        runtime.spawn(server);
        Self { received, _runtime: runtime }
    }

    /// OTLP/HTTP over TLS with the PKI's certificate.
    fn http_tls(port: u16, pki: &Pki) -> Self {
        use rustls::pki_types::pem::PemObject as _;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pki.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(pki.key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key).unwrap();
        Self::http_on(port, Some(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))))
    }

    fn grpc(port: u16) -> Self {
        let received = Received::default();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let service = MetricsServiceServer::new(GrpcReceiver(received.clone()));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let listener = runtime.block_on(tokio::net::TcpListener::bind(addr)).expect("bind the gRPC sink");
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Self { received, _runtime: runtime }
    }

    /// OTLP/HTTP: POST /v1/metrics, body an ExportMetricsServiceRequest.
    fn http(port: u16) -> Self {
        Self::http_on(port, None)
    }

    fn http_on(port: u16, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        use axum::{body::Bytes, http::StatusCode, routing::post};
        let received = Received::default();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let store = received.clone();
        let app = axum::Router::new().route(
            "/v1/metrics",
            post(move |headers: axum::http::HeaderMap, body: Bytes| {
                let store = store.clone();
                async move {
                    assert_eq!(headers["content-type"], "application/x-protobuf");
                    match ExportMetricsServiceRequest::decode(body) {
                        Ok(request) => {
                            store.lock().unwrap().push(request);
                            let reply = ExportMetricsServiceResponse { partial_success: None }.encode_to_vec();
                            (StatusCode::OK, [("content-type", "application/x-protobuf")], reply)
                        }
                        Err(_) => (StatusCode::BAD_REQUEST, [("content-type", "text/plain")], b"bad".to_vec()),
                    }
                }
            }),
        );
        let listener =
            runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", port))).expect("bind the HTTP sink");
        match tls {
            Some(tls) => runtime.spawn(async move { axum::serve(TlsListener { tcp: listener, tls }, app).await }),
            None => runtime.spawn(async move { axum::serve(listener, app).await }),
        };
        Self { received, _runtime: runtime }
    }

    fn requests(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// The data points of `metric` whose attributes include `attrs`, over
    /// every request received: (value, temporality).
    fn points(&self, metric: &str, attrs: &[(&str, Value)]) -> Vec<(i64, i32)> {
        let received = self.received.lock().unwrap();
        let mut out = Vec::new();
        for request in received.iter() {
            for rm in &request.resource_metrics {
                for sm in &rm.scope_metrics {
                    for m in sm.metrics.iter().filter(|m| m.name == metric) {
                        let Some(Data::Sum(sum)) = &m.data else { continue };
                        for p in &sum.data_points {
                            if attrs.iter().all(|(k, v)| has(&p.attributes, k, v)) {
                                let value = match p.value {
                                    Some(number_data_point::Value::AsInt(n)) => n,
                                    Some(number_data_point::Value::AsDouble(d)) => d as i64,
                                    None => continue,
                                };
                                out.push((value, sum.aggregation_temporality));
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// The latest cumulative value of a series (0 if never seen).
    fn latest(&self, metric: &str, attrs: &[(&str, Value)]) -> i64 {
        self.points(metric, attrs).last().map_or(0, |p| p.0)
    }

    /// The resource attributes of the last request.
    fn resource(&self) -> Vec<KeyValue> {
        let received = self.received.lock().unwrap();
        received
            .last()
            .and_then(|r| r.resource_metrics.first())
            .and_then(|rm| rm.resource.clone())
            .map(|r| r.attributes)
            .unwrap_or_default()
    }

    fn wait_for(&self, limit: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if done(self) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        done(self)
    }
}

#[derive(Clone, Debug)]
enum Value {
    Int(i64),
    Str(&'static str),
}

fn has(attrs: &[KeyValue], key: &str, want: &Value) -> bool {
    attrs.iter().any(|kv| {
        kv.key == key
            && match (&kv.value, want) {
                (Some(AnyValue { value: Some(any_value::Value::IntValue(n)) }), Value::Int(w)) => n == w,
                (Some(AnyValue { value: Some(any_value::Value::StringValue(s)) }), Value::Str(w)) => s == w,
                _ => false,
            }
    })
}

fn string_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| match &kv.value {
        Some(AnyValue { value: Some(any_value::Value::StringValue(s)) }) => Some(s.clone()),
        _ => None,
    })
}

/// The port-exhaustion incident in its own namespace: 6 ports, 9 held
/// connections; the client sees 3 EADDRNOTAVAIL. Returns (netns, client
/// pid, failures the client saw); keep the netns (and the server) alive.
fn exhaust_ports() -> (Netns, Server, u32, u64) {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41005");
    let server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let client = ns.client(&["--to", "127.0.0.1:8080", "--count", "9", "--hold"]);
    let failures = client.errors("EADDRNOTAVAIL");
    assert_eq!((client.connected, failures), (6, 3), "{client:?}");
    (ns, server, client.pid, failures)
}

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
    let (_ns, _server, pid, failures) = exhaust_ports();
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
    let (_ns, _server, pid, failures) = exhaust_ports();
    let failed = |body: &str| sample(body, "observer_export_failures_total", &["exporter=\"otlp\""]).unwrap_or(0);
    let body = scrape_until(&daemon, Duration::from_secs(30), |b| {
        failed(b) >= 3 && sample(b, "observer_tcp_connect_errors_total", &[&format!("process_pid=\"{pid}\"")]).is_some()
    });
    assert!(failed(&body) >= 3, "pushes to a closed port must fail: {body}");
    let pending = sample(&body, "observer_export_pending_batches", &["exporter=\"otlp\""]).unwrap();
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
    assert_eq!(sample(&body, "observer_export_pending_batches", &["exporter=\"otlp\""]), Some(0), "{body}");
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
    let (ns, server, pid, failures) = exhaust_ports();
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
            sample(b, "observer_export_failures_total", &["exporter=\"otlp\""]).is_some_and(|n| n >= 2)
        });
        assert!(
            sample(&body, "observer_export_failures_total", &["exporter=\"otlp\""]).is_some_and(|n| n >= 2),
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
