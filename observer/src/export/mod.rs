//! Export: one OpenTelemetry MeterProvider whose instruments read the
//! latest round's `Snapshot`. Observable (asynchronous) instruments,
//! because the totals are computed by the round; and because the SDK then
//! reports only the series observed in each collection, a retired
//! process's series vanish.
pub mod contract;
mod gauges;
mod health;
pub mod http;
pub mod otlp;
pub mod resource;
mod signals;
pub mod stats;

use std::sync::Arc;

use opentelemetry::{
    KeyValue,
    metrics::{AsyncInstrument, MeterProvider as _},
};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use prometheus::{Encoder, TextEncoder};
pub use stats::{ExportCounts, ExportStats};

use crate::{
    error::Error,
    series::{NetworkType, Who},
    snapshot::{Published, Snapshot},
};

/// Resource attributes also put on every Prometheus series: the cluster
/// (from OTEL_RESOURCE_ATTRIBUTES, e.g. `k8s.cluster.name=prod-eu`), the
/// node (NODE_NAME) and the host.
pub const NODE_LABELS: [&str; 3] = ["k8s.cluster.name", "k8s.node.name", "host.name"];

pub struct Metrics {
    provider: SdkMeterProvider,
    round_durations: opentelemetry::metrics::Histogram<f64>,
    registry: prometheus::Registry,
    stats: Arc<ExportStats>,
    connections: Arc<http::ConnectionStats>,
}

impl Metrics {
    /// One MeterProvider for both exports: the Prometheus registry and,
    /// when OTLP push is on, its reader; so both carry the same
    /// instruments, names, units and values.
    /// `series_ceiling`: the most series one instrument can have
    /// (`Limits::series_ceiling`), the SDK's cardinality limit.
    pub fn new(
        published: Arc<Published>,
        stats: Arc<ExportStats>,
        push: Option<otlp::SharedReader>,
        series_ceiling: usize,
    ) -> Result<Self, Error> {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .scope_info_enabled(false)
            // Where a series comes from, on every series (as OTLP has it
            // from the resource), so dashboards and alerts can select a
            // cluster or a node without joining target_info.
            .with_resource_selector(
                NODE_LABELS
                    .iter()
                    .map(|k| opentelemetry::Key::from_static_str(k))
                    .collect::<std::collections::HashSet<_>>(),
            )
            .build()
            .map_err(|e| Error::Export { what: "Prometheus exporter".into(), source: e.into() })?;
        // The SDK folds what is past its cardinality limit (2,000 by default)
        // into one series without attributes, losing who and where; our
        // own caps fold with the errno kept and count it. So the SDK may
        // hold every series our caps allow, and never folds.
        let no_sdk_folding = move |_: &opentelemetry_sdk::metrics::Instrument| {
            opentelemetry_sdk::metrics::Stream::builder().with_cardinality_limit(series_ceiling).build().ok()
        };
        let mut builder = SdkMeterProvider::builder()
            .with_reader(exporter)
            .with_resource(resource::from_environment())
            .with_view(no_sdk_folding);
        if let Some(reader) = push {
            builder = builder.with_reader(reader);
        }
        let provider = builder.build();
        let meter = provider.meter("observer");
        signals::register(&meter, &published);
        signals::register_connections(&meter, &published);
        health::register(&meter, &published);
        health::register_exports(&meter, &stats);
        health::register_series(&meter, &published);
        let connections = Arc::new(http::ConnectionStats::default());
        health::register_connections(&meter, &connections);
        let round_durations = health::round_durations(&meter);
        gauges::register_ceilings(&meter, &published);
        gauges::register_open_files(&meter, &published);
        Ok(Self { provider, registry, stats, connections, round_durations })
    }

    /// The Prometheus text exposition of every instrument (one scrape).
    pub fn encode(&self) -> Result<String, Error> {
        let counted = |failed: bool| {
            self.stats.update("prometheus", |c| {
                c.attempts += 1;
                c.failures += u64::from(failed);
            })
        };
        let mut out = Vec::new();
        let encoded = TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| Error::Export { what: "encoding a scrape".into(), source: e.into() })
            .and_then(|()| {
                String::from_utf8(out).map_err(|e| Error::Export { what: "encoding a scrape".into(), source: e.into() })
            });
        counted(encoded.is_err());
        encoded
    }

    /// The histogram each round's duration goes into (recorded by the
    /// collector thread: a histogram has no callback to read a snapshot).
    pub fn round_durations(&self) -> opentelemetry::metrics::Histogram<f64> {
        self.round_durations.clone()
    }

    /// What the endpoint's connection cap closed, for it to count into.
    pub fn connection_stats(&self) -> Arc<http::ConnectionStats> {
        self.connections.clone()
    }

    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

fn who_attrs(who: &Who, network: NetworkType, out: &mut Vec<KeyValue>) {
    process_attrs(who, out);
    out.push(KeyValue::new("network.type", network.as_str()));
}

/// The process and, in a pod, its container and pod.
fn process_attrs(who: &Who, out: &mut Vec<KeyValue>) {
    match who {
        Who::Process { pid, name, pod } => {
            out.push(KeyValue::new("process.pid", *pid as i64));
            out.push(KeyValue::new("process.executable.name", name.clone()));
            if let Some(pod) = pod {
                out.push(KeyValue::new("container.id", pod.container_id.clone()));
                out.push(KeyValue::new("k8s.pod.uid", pod.pod_uid.clone()));
                let optional = [
                    ("k8s.pod.name", &pod.pod_name),
                    ("k8s.namespace.name", &pod.namespace),
                    ("k8s.container.name", &pod.container_name),
                ];
                for (key, value) in optional {
                    if let Some(v) = value {
                        out.push(KeyValue::new(key, v.clone()));
                    }
                }
            }
        }
        // What a cap folded: no process, marked as OpenTelemetry marks it.
        Who::Other => mark_overflow(out),
    }
}

/// Mark a series as counting what a cap folded (`otel.metric.overflow`,
/// as OpenTelemetry's SDK marks its own), once.
fn mark_overflow(out: &mut Vec<KeyValue>) {
    const KEY: &str = "otel.metric.overflow";
    if !out.iter().any(|kv| kv.key.as_str() == KEY) {
        out.push(KeyValue::new(KEY, true));
    }
}

/// errno number -> its name, e.g. 99 -> "EADDRNOTAVAIL".
pub fn errno_name(errno: u32) -> String {
    let e = nix::errno::Errno::from_raw(errno as i32);
    if e == nix::errno::Errno::UnknownErrno { format!("errno_{errno}") } else { format!("{e:?}") }
}

/// A u64 gauge of the contract whose callback `read`s the latest snapshot.
fn u64_gauge(
    meter: &opentelemetry::metrics::Meter,
    published: &Arc<Published>,
    instrument: &'static contract::Instrument,
    read: impl Fn(&Snapshot, &dyn AsyncInstrument<u64>) + Send + Sync + 'static,
) {
    debug_assert_eq!(instrument.kind, contract::Kind::Gauge, "{}", instrument.name);
    meter
        .u64_observable_gauge(instrument.name)
        .with_description(instrument.description)
        .with_unit(instrument.unit)
        .with_callback(reading(published, read))
        .build();
}

/// A u64 counter of the contract whose callback `read`s the latest
/// snapshot.
fn u64_counter(
    meter: &opentelemetry::metrics::Meter,
    published: &Arc<Published>,
    instrument: &'static contract::Instrument,
    read: impl Fn(&Snapshot, &dyn AsyncInstrument<u64>) + Send + Sync + 'static,
) {
    debug_assert_eq!(instrument.kind, contract::Kind::Counter, "{}", instrument.name);
    meter
        .u64_observable_counter(instrument.name)
        .with_description(instrument.description)
        .with_unit(instrument.unit)
        .with_callback(reading(published, read))
        .build();
}

/// A callback for an observable instrument: `read` gets the latest
/// snapshot at each collection.
fn reading<T: 'static>(
    published: &Arc<Published>,
    read: impl Fn(&Snapshot, &dyn AsyncInstrument<T>) + Send + Sync + 'static,
) -> impl Fn(&dyn AsyncInstrument<T>) + Send + Sync + 'static {
    let published = published.clone();
    move |obs| read(&published.latest(), obs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(99), "EADDRNOTAVAIL");
        assert_eq!(errno_name(111), "ECONNREFUSED");
        assert_eq!(errno_name(101), "ENETUNREACH");
        assert_eq!(errno_name(100_000), "errno_100000");
    }
}
