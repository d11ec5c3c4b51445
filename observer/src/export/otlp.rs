//! OTLP push: the same instruments the Prometheus endpoint serves, read
//! through a second reader of the one MeterProvider and sent to an
//! OpenTelemetry Collector (gRPC or HTTP/protobuf) every interval.
//!
//! We run the push loop ourselves instead of the SDK's PeriodicReader,
//! which logs every failed attempt and drops a failed batch: when the
//! collector is down or slow, counting goes on, each attempt is bounded by
//! the timeout, retries back off, one log line covers a whole failure
//! streak, and nothing is lost. With cumulative temporality (the default)
//! the newest batch carries every count, so only it is kept; with delta,
//! unsent batches are kept in order, up to `MAX_PENDING`.
use std::{
    collections::{HashMap, VecDeque},
    fmt,
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use opentelemetry_otlp::{MetricExporter, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    metrics::{
        InstrumentKind, ManualReader, Pipeline, Temporality, data::ResourceMetrics, exporter::PushMetricExporter as _,
        reader::MetricReader,
    },
};
use tokio::sync::watch;
use tracing::{info, warn};

use super::ExportStats;
use crate::error::{Cause, Error};

/// Delta batches kept while the collector is unreachable (one per
/// interval: 30 minutes at the default 1 m); older ones are dropped and
/// counted in `observer_export_dropped_batches_total`.
pub const MAX_PENDING: usize = 30;

/// The longest wait between two attempts while failing.
const MAX_BACKOFF: Duration = Duration::from_secs(120);

/// How long the final export at shutdown may take, so that SIGTERM ends
/// the daemon within seconds even when the collector does not answer.
const FINAL_EXPORT: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    #[value(name = "grpc")]
    Grpc,
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TemporalityChoice {
    Cumulative,
    Delta,
    /// The specification's low-memory preference: delta for synchronous
    /// counters, cumulative for observable ones. Every observer instrument
    /// is observable, so this is cumulative.
    #[value(name = "lowmemory")]
    LowMemory,
}

impl fmt::Display for TemporalityChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cumulative => "cumulative",
            Self::Delta => "delta",
            Self::LowMemory => "lowmemory",
        })
    }
}

impl TemporalityChoice {
    fn sdk(self) -> Temporality {
        match self {
            Self::Cumulative => Temporality::Cumulative,
            Self::Delta => Temporality::Delta,
            Self::LowMemory => Temporality::LowMemory,
        }
    }

    /// Whether each batch carries every count so far (so a failed batch
    /// is superseded by the next and need not be kept).
    fn is_cumulative(self) -> bool {
        self != Self::Delta
    }
}

#[derive(Clone, PartialEq)]
pub struct OtlpConfig {
    /// Base URL of the collector: `http(s)://host:4317` for gRPC; for
    /// HTTP, `/v1/metrics` is appended, as for OTEL_EXPORTER_OTLP_ENDPOINT.
    pub endpoint: url::Url,
    pub protocol: Protocol,
    /// Sent with every export (e.g. authorization); never logged.
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub interval: Duration,
    pub temporality: TemporalityChoice,
    /// A CA certificate (PEM) to trust for an https endpoint, besides the
    /// system's roots (OTEL_EXPORTER_OTLP_CERTIFICATE).
    pub certificate: Option<std::path::PathBuf>,
}

/// Header values are credentials: never in a Debug output either.
impl fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<String> = self.headers.iter().map(|(k, _)| format!("{k}=<hidden>")).collect();
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.endpoint.as_str())
            .field("protocol", &self.protocol)
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .field("interval", &self.interval)
            .field("temporality", &self.temporality)
            .field("certificate", &self.certificate)
            .finish()
    }
}

impl OtlpConfig {
    /// Where the exporter sends: the signal path is added for HTTP.
    pub fn target(&self) -> String {
        let base = self.endpoint.as_str().trim_end_matches('/');
        match self.protocol {
            Protocol::Grpc => base.to_string(),
            Protocol::HttpProtobuf => format!("{base}/v1/metrics"),
        }
    }

    /// A reader of the MeterProvider for this exporter, and a handle the
    /// push loop collects through.
    pub fn reader(&self) -> SharedReader {
        SharedReader(Arc::new(ManualReader::builder().with_temporality(self.temporality.sdk()).build()))
    }

    fn exporter(&self) -> Result<MetricExporter, Error> {
        let target = self.target();
        let bad =
            |what: String, source: Cause| Error::Export { what: format!("OTLP exporter for {target}: {what}"), source };
        let https = self.endpoint.scheme() == "https";
        // rustls needs one process-wide crypto provider; we build with ring
        // only. Err means one is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = match &self.certificate {
            Some(path) => {
                let pem =
                    std::fs::read(path).map_err(|e| bad(format!("CA certificate {}", path.display()), e.into()))?;
                // Both TLS stacks skip what they cannot parse: a file
                // without one certificate would silently trust nothing.
                use rustls::pki_types::{CertificateDer, pem::PemObject as _};
                let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>();
                if !certs.is_ok_and(|c| !c.is_empty()) {
                    return Err(bad(
                        format!("CA certificate {}", path.display()),
                        Error::because("no PEM certificate (-----BEGIN CERTIFICATE-----) in it"),
                    ));
                }
                info!(certificate = %path.display(), https, "OTLP: trusting this CA besides the system's");
                Some(pem)
            }
            None => None,
        };
        let built = match self.protocol {
            Protocol::Grpc => {
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (key, value) in &self.headers {
                    let key = tonic::metadata::MetadataKey::from_bytes(key.to_ascii_lowercase().as_bytes())
                        .map_err(|e| bad(format!("header name `{key}`"), e.into()))?;
                    let value = value.parse().map_err(|e: tonic::metadata::errors::InvalidMetadataValue| {
                        bad(format!("header `{key}` value"), e.into())
                    })?;
                    metadata.insert(key, value);
                }
                let mut builder = MetricExporter::builder()
                    .with_tonic()
                    .with_endpoint(self.target())
                    .with_timeout(self.timeout)
                    .with_metadata(metadata);
                if https {
                    let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
                    if let Some(pem) = &ca {
                        tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
                    }
                    builder = builder.with_tls_config(tls);
                }
                builder.with_temporality(self.temporality.sdk()).build()
            }
            Protocol::HttpProtobuf => {
                // No redirects: a collector that redirects would take the
                // headers (credentials) to wherever it points.
                let mut client =
                    reqwest::Client::builder().timeout(self.timeout).redirect(reqwest::redirect::Policy::none());
                if let Some(pem) = &ca {
                    let cert = reqwest::Certificate::from_pem(pem).map_err(|e| {
                        bad(format!("CA certificate {}", self.certificate.as_ref().unwrap().display()), e.into())
                    })?;
                    client = client.tls_certs_merge([cert]);
                }
                let client = client.build().map_err(|e| bad("HTTP client".into(), e.into()))?;
                MetricExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(self.target())
                    .with_timeout(self.timeout)
                    .with_headers(self.headers.iter().cloned().collect::<HashMap<_, _>>())
                    .with_temporality(self.temporality.sdk())
                    .build()
            }
        };
        built.map_err(|e| bad("building it".into(), e.into()))
    }
}

/// A ManualReader the MeterProvider owns and the push loop shares.
#[derive(Clone, Debug)]
pub struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline)
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

pub struct Pusher {
    config: OtlpConfig,
    reader: SharedReader,
    exporter: MetricExporter,
    stats: Option<Arc<ExportStats>>,
    pending: VecDeque<ResourceMetrics>,
    /// Set while failing: when the streak began and its failed attempts.
    streak: Option<(Instant, u64)>,
    /// Intervals to let pass before the next attempt (backoff).
    skip: u64,
}

impl Pusher {
    /// Must run inside the tokio runtime (tonic's channel is bound to it).
    pub fn new(config: OtlpConfig, reader: SharedReader) -> Result<Self, Error> {
        let exporter = config.exporter()?;
        Ok(Self { config, reader, exporter, stats: None, pending: VecDeque::new(), streak: None, skip: 0 })
    }

    /// Push every interval until `stop` changes, then push once more (the
    /// counts since the last push), bounded by `FINAL_EXPORT`.
    /// Its counts go to `stats` (observer_export_*).
    pub async fn run(mut self, stats: Arc<ExportStats>, mut stop: watch::Receiver<bool>) {
        self.stats = Some(stats);
        info!(
            endpoint = %self.config.target(),
            protocol = %self.config.protocol,
            interval = ?self.config.interval,
            temporality = %self.config.temporality,
            "pushing OTLP metrics"
        );
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + self.config.interval, self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            tokio::select! {
                _ = self.push() => {}
                // An attempt in flight is abandoned; its batch stays pending.
                _ = stop.changed() => break,
            }
        }
        self.skip = 0;
        if tokio::time::timeout(FINAL_EXPORT, self.push()).await.is_err() {
            warn!(endpoint = %self.config.target(), "final OTLP export at shutdown did not finish in {FINAL_EXPORT:?}");
        }
        let _ = self.exporter.shutdown();
    }

    /// Collect a batch, then send what is pending, oldest first, unless
    /// backing off.
    async fn push(&mut self) {
        let mut batch = ResourceMetrics::default();
        if let Err(e) = self.reader.collect(&mut batch) {
            warn!(error = %e, "collecting metrics for OTLP failed");
            return;
        }
        if self.config.temporality.is_cumulative() {
            self.pending.clear();
        }
        self.pending.push_back(batch);
        let mut dropped = 0;
        while self.pending.len() > MAX_PENDING {
            self.pending.pop_front();
            dropped += 1;
        }
        self.update_counts(|c| c.dropped += dropped);
        if self.skip > 0 {
            self.skip -= 1;
        } else {
            while let Some(batch) = self.pending.front() {
                self.update_counts(|c| c.attempts += 1);
                // The exporter bounds each request by the timeout; this
                // bounds its internal retries too.
                let sent = tokio::time::timeout(self.config.timeout * 2, self.exporter.export(batch)).await;
                let error = match sent {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some(format!("no answer within {:?}", self.config.timeout * 2)),
                };
                match error {
                    None => {
                        self.pending.pop_front();
                        self.succeeded();
                    }
                    Some(error) => {
                        self.failed(error);
                        break;
                    }
                }
            }
        }
        let waiting = self.pending.len() as u64;
        self.update_counts(|c| c.pending = waiting);
    }

    fn succeeded(&mut self) {
        if let Some((since, failures)) = self.streak.take() {
            info!(
                endpoint = %self.config.target(),
                failed_attempts = failures,
                down_for = ?since.elapsed(),
                "OTLP export recovered; every count is in this export"
            );
        }
    }

    fn failed(&mut self, error: String) {
        self.update_counts(|c| c.failures += 1);
        let failures = match &mut self.streak {
            Some((_, failures)) => {
                *failures += 1;
                *failures
            }
            None => {
                // One line per streak: the next one says when it recovered.
                warn!(
                    endpoint = %self.config.target(),
                    %error,
                    "OTLP export failed; counting goes on, retrying with backoff (up to {MAX_BACKOFF:?}); \
                     further failures are counted in observer_export_failures_total"
                );
                self.streak = Some((Instant::now(), 1));
                1
            }
        };
        // Exponential backoff in whole intervals: after the n-th failure in
        // a row, wait 2^(n-1) intervals, at most MAX_BACKOFF.
        let most = (MAX_BACKOFF.as_millis() / self.config.interval.as_millis().max(1)).max(1) as u64;
        self.skip = (1u64 << (failures - 1).min(20)).min(most) - 1;
    }

    fn update_counts(&self, f: impl FnOnce(&mut super::ExportCounts)) {
        if let Some(stats) = &self.stats {
            stats.update("otlp", f);
        }
    }
}
