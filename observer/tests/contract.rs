//! The metric contract (`observer::export::contract`, rendered as
//! docs/metrics.md) held against what observer actually sends, on both
//! paths, while the incidents run (so every signal has data) with a cap
//! small enough that some processes fold: every instrument present (but
//! one whose only hook this kernel cannot attach, said absent), with
//! its documented kind and unit; no attribute beyond its list; integer
//! attributes integers and boolean ones booleans (OTLP: the value's type;
//! Prometheus: the label's text); no instrument that is not documented.
mod common;
#[path = "common/otlp_sink.rs"]
mod otlp_sink;

use std::{collections::BTreeMap, time::Duration};

use common::{
    daemon::{scrape_until, start_daemon_with_env},
    incidents::reproduce_incidents,
};
use observer::export::contract::{self, Instrument, Kind, Type};
use observer_testing::http::{free_port, sample};
use opentelemetry_proto::tonic::{
    common::v1::{AnyValue, any_value},
    metrics::v1::{Metric, metric::Data},
};
use otlp_sink::Sink;

fn by_prometheus_name() -> BTreeMap<String, &'static Instrument> {
    contract::ALL.iter().map(|i| (i.prometheus_name(), *i)).collect()
}

fn attribute_type(instrument: &Instrument, key: &str) -> Option<Type> {
    instrument.keys().find(|a| a.key == key).map(|a| a.ty)
}

#[test]
fn both_exports_keep_the_contract() {
    let port = free_port();
    let sink = Sink::http(port);
    let endpoint = format!("http://127.0.0.1:{port}");
    // Six process slots: the incidents' processes are more, so some fold.
    let daemon = start_daemon_with_env(
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "http/protobuf",
            "--otlp-interval",
            "300ms",
            "--max-processes",
            "6",
            "--connection-limits",
            "127.0.0.1:8080=10,*:8080=10",
        ],
        &[("NODE_NAME", "node-contract"), ("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=contract")],
    );
    let _incidents = reproduce_incidents();
    // The unseen-events check reports after its first rounds, the server
    // limit after 15 s of its shape; the last push after this scrape
    // carries what they show.
    let body = scrape_until(&daemon, Duration::from_secs(40), |b| {
        sample(b, "observer_kernel_unseen_events_total", &["observer_event=\"time_wait_entry\""]).is_some()
            && b.contains("observer_tcp_connection_limit_inferred{")
    });
    let pushes = sink.requests();
    assert!(sink.wait_for(Duration::from_secs(10), |s| s.requests() > pushes + 1), "no push after the incidents");

    let mut failures = prometheus_failures(&body);
    failures.extend(otlp_failures(&sink));
    // An instrument whose only hook this kernel cannot attach is absent,
    // and only where observer_probe_info says so.
    let absent = common::daemon::said_absent(&body);
    let said_absent = |name: &str| absent.iter().any(|a| a == name || by_prometheus_name()[a].name == name);
    failures.retain(|f| !f.strip_prefix("Prometheus: no ").or(f.strip_prefix("OTLP: no ")).is_some_and(said_absent));
    assert!(failures.is_empty(), "{} breaches of docs/metrics.md:\n{}", failures.len(), failures.join("\n"));
}

/// The scrape against the contract.
fn prometheus_failures(response: &str) -> Vec<String> {
    let body = response.split_once("\r\n\r\n").map_or(response, |(_, body)| body);
    let contract = by_prometheus_name();
    let resource: Vec<String> = contract::RESOURCE.iter().map(|a| contract::prometheus_label(a.key)).collect();
    let mut failures = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            if name == "target_info" {
                continue;
            }
            match contract.get(name) {
                Some(i) if i.kind.prometheus_type() != kind => {
                    failures.push(format!("Prometheus {name}: {kind}, documented {}", i.kind.prometheus_type()))
                }
                Some(_) => {}
                None => failures.push(format!("Prometheus {name}: not in the contract")),
            }
            seen.insert(name.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, labels) = match line.split_once('{') {
            Some((name, rest)) => (name, rest.rsplit_once('}').map_or("", |(l, _)| l)),
            None => (line.split(' ').next().unwrap(), ""),
        };
        // A histogram's samples: <name>_bucket (with `le`), _sum, _count.
        let (name, histogram_part) = match ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            name.strip_suffix(suffix)
                .filter(|base| contract.get(*base).is_some_and(|i| i.kind == Kind::Histogram))
                .map(|base| (base, *suffix))
        }) {
            Some((base, suffix)) => (base, Some(suffix)),
            None => (name, None),
        };
        if name == "target_info" {
            continue;
        }
        let Some(instrument) = contract.get(name) else {
            failures.push(format!("Prometheus sample {name}: not in the contract"));
            continue;
        };
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once("=\"").unwrap_or_else(|| panic!("label {pair:?} in {line}"));
            let value = value.trim_end_matches('"');
            if resource.iter().any(|r| r == key) || (histogram_part == Some("_bucket") && key == "le") {
                continue;
            }
            let documented = instrument.keys().find(|a| contract::prometheus_label(a.key) == key);
            match documented.map(|a| a.ty) {
                None => failures.push(format!("Prometheus {name}: label {key} not documented ({line})")),
                Some(Type::Int) if value.parse::<i64>().is_err() => {
                    failures.push(format!("Prometheus {name}: {key}=\"{value}\" is not an integer"))
                }
                Some(Type::Bool) if value != "true" && value != "false" => {
                    failures.push(format!("Prometheus {name}: {key}=\"{value}\" is not a boolean"))
                }
                _ => {}
            }
        }
    }
    for name in contract.keys().filter(|n| !seen.contains(*n)) {
        failures.push(format!("Prometheus: no {name}"));
    }
    assert!(body.contains("otel_metric_overflow=\"true\""), "no series folded: the cap did not bite\n{body}");
    failures
}

/// The last push against the contract.
fn otlp_failures(sink: &Sink) -> Vec<String> {
    let received = sink.received.lock().unwrap();
    let last = received.last().expect("a push");
    let metrics: Vec<&Metric> =
        last.resource_metrics.iter().flat_map(|rm| &rm.scope_metrics).flat_map(|sm| &sm.metrics).collect();
    let mut failures = Vec::new();
    for i in contract::ALL {
        if !metrics.iter().any(|m| m.name == i.name) {
            failures.push(format!("OTLP: no {}", i.name));
        }
    }
    for m in metrics {
        let Some(i) = contract::ALL.iter().find(|i| i.name == m.name) else {
            failures.push(format!("OTLP {}: not in the contract", m.name));
            continue;
        };
        if m.unit != i.unit {
            failures.push(format!("OTLP {}: unit {:?}, documented {:?}", m.name, m.unit, i.unit));
        }
        let (kind, points): (Kind, Vec<&[opentelemetry_proto::tonic::common::v1::KeyValue]>) = match &m.data {
            Some(Data::Sum(s)) => (
                if s.is_monotonic { Kind::Counter } else { Kind::UpDownCounter },
                s.data_points.iter().map(|p| p.attributes.as_slice()).collect(),
            ),
            Some(Data::Gauge(g)) => (Kind::Gauge, g.data_points.iter().map(|p| p.attributes.as_slice()).collect()),
            Some(Data::Histogram(h)) => {
                (Kind::Histogram, h.data_points.iter().map(|p| p.attributes.as_slice()).collect())
            }
            other => {
                failures.push(format!("OTLP {}: data {other:?}", m.name));
                continue;
            }
        };
        if kind != i.kind {
            failures.push(format!("OTLP {}: {kind:?}, documented {:?}", m.name, i.kind));
        }
        for attrs in points {
            for kv in attrs {
                let got = match &kv.value {
                    Some(AnyValue { value: Some(any_value::Value::StringValue(_)) }) => Some(Type::String),
                    Some(AnyValue { value: Some(any_value::Value::IntValue(_)) }) => Some(Type::Int),
                    Some(AnyValue { value: Some(any_value::Value::BoolValue(_)) }) => Some(Type::Bool),
                    _ => None,
                };
                match attribute_type(i, &kv.key) {
                    None => failures.push(format!("OTLP {}: attribute {} not documented", m.name, kv.key)),
                    Some(want) if got != Some(want) => failures.push(format!(
                        "OTLP {}: attribute {} is {got:?}, documented {want:?} ({:?})",
                        m.name, kv.key, kv.value
                    )),
                    Some(_) => {}
                }
            }
        }
    }
    failures
}
