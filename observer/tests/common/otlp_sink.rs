//! A test OTLP receiver: decodes observer's exports with the official
//! OpenTelemetry protobuf definitions (opentelemetry-proto), over gRPC
//! (tonic) and HTTP/protobuf (axum), plain or TLS. Included by the test
//! binaries that push (`#[path]`), not by every one through `common`.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        metrics_service_server::{MetricsService, MetricsServiceServer},
    },
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{metric::Data, number_data_point},
};
use prost::Message as _;

/// Every request a sink received, in order.
pub type Received = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

/// A test OTLP receiver on 127.0.0.1:`port`, alive as long as this value.
pub struct Sink {
    pub received: Received,
    _runtime: tokio::runtime::Runtime,
}

#[derive(Clone)]
pub struct GrpcReceiver(Received);

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
pub struct Pki {
    pub ca_file: std::path::PathBuf,
    cert: String,
    key: String,
}

impl Pki {
    pub fn new() -> Self {
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
pub struct TlsListener {
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
    pub fn grpc_tls(port: u16, pki: &Pki) -> Self {
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
    pub fn http_tls(port: u16, pki: &Pki) -> Self {
        use rustls::pki_types::pem::PemObject as _;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pki.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(pki.key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key).unwrap();
        Self::http_on(port, Some(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))))
    }

    pub fn grpc(port: u16) -> Self {
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
    pub fn http(port: u16) -> Self {
        Self::http_on(port, None)
    }

    pub fn http_on(port: u16, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
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

    pub fn requests(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// The data points of `metric` whose attributes include `attrs`, over
    /// every request received: (value, temporality).
    pub fn points(&self, metric: &str, attrs: &[(&str, Value)]) -> Vec<(i64, i32)> {
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
    pub fn latest(&self, metric: &str, attrs: &[(&str, Value)]) -> i64 {
        self.points(metric, attrs).last().map_or(0, |p| p.0)
    }

    /// The resource attributes of the last request.
    pub fn resource(&self) -> Vec<KeyValue> {
        let received = self.received.lock().unwrap();
        received
            .last()
            .and_then(|r| r.resource_metrics.first())
            .and_then(|rm| rm.resource.clone())
            .map(|r| r.attributes)
            .unwrap_or_default()
    }

    pub fn wait_for(&self, limit: Duration, done: impl Fn(&Self) -> bool) -> bool {
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
pub enum Value {
    Int(i64),
    Str(&'static str),
}

pub fn has(attrs: &[KeyValue], key: &str, want: &Value) -> bool {
    attrs.iter().any(|kv| {
        kv.key == key
            && match (&kv.value, want) {
                (Some(AnyValue { value: Some(any_value::Value::IntValue(n)) }), Value::Int(w)) => n == w,
                (Some(AnyValue { value: Some(any_value::Value::StringValue(s)) }), Value::Str(w)) => s == w,
                _ => false,
            }
    })
}

pub fn string_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| match &kv.value {
        Some(AnyValue { value: Some(any_value::Value::StringValue(s)) }) => Some(s.clone()),
        _ => None,
    })
}
