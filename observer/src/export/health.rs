//! observer's own health: which hooks run in which mode, what the kernel
//! side lost or skipped, how rounds go, how full the maps are, and the
//! exporters' own counts. Names, units and meanings: `contract.rs`.
use std::sync::Arc;

use opentelemetry::{
    KeyValue,
    metrics::{AsyncInstrument, Meter},
};

use super::{ExportCounts, ExportStats, contract, u64_counter, u64_gauge};
use crate::series::Counter;
use crate::snapshot::Published;

/// How observer itself is doing: hooks, kernel-side losses, rounds, maps.
pub(super) fn register(meter: &Meter, published: &Arc<Published>) {
    u64_gauge(meter, published, &contract::PROBE_INFO, move |st, obs| {
        for a in &st.kernel.attachments {
            obs.observe(
                1,
                &[
                    KeyValue::new("observer.hook", a.hook),
                    KeyValue::new("observer.probe.mode", a.mode.to_string()),
                    KeyValue::new("observer.probe.missed_events", a.skipped_runs.as_str()),
                ],
            );
        }
    });
    u64_counter(meter, published, &contract::KERNEL_LOST_UPDATES, move |st, obs| {
        for (map, value) in &st.kernel.lost {
            obs.observe(*value, &[KeyValue::new("observer.map.name", *map)]);
        }
    });
    u64_counter(meter, published, &contract::KERNEL_MISSED_EVENTS, move |st, obs| {
        for (hook, program, value) in &st.kernel.missed {
            obs.observe(*value, &[KeyValue::new("observer.hook", *hook), KeyValue::new("observer.program", *program)]);
        }
    });
    u64_counter(meter, published, &contract::KERNEL_UNSEEN_EVENTS, move |st, obs| {
        for (event, value) in &st.kernel.unseen {
            obs.observe(*value, &[KeyValue::new("observer.event", *event)]);
        }
    });

    u64_counter(meter, published, &contract::COLLECTION_FAILURES, move |st, obs| {
        obs.observe(st.rounds.failures, &[]);
    });
    u64_gauge(meter, published, &contract::NETWORK_NAMESPACE_USAGE, move |st, obs| {
        let c = &st.node.sweep;
        for (reading, value) in [("current", c.current), ("deferred", c.deferred), ("unread", c.unread)] {
            obs.observe(value, &[KeyValue::new("observer.reading", reading)]);
        }
    });

    type FillPick = fn(&crate::collect::MapFill) -> u64;
    let fill: [(&'static contract::Instrument, FillPick); 2] =
        [(&contract::MAP_USAGE, |f| f.entries), (&contract::MAP_LIMIT, |f| f.capacity)];
    for (instrument, pick) in fill {
        u64_gauge(meter, published, instrument, move |st, obs| {
            for f in &st.kernel.maps {
                obs.observe(pick(f), &[KeyValue::new("observer.map.name", f.map)]);
            }
        });
    }
    u64_counter(meter, published, &contract::MAP_EVICTIONS, move |st, obs| {
        for f in &st.kernel.maps {
            if let Some(evictions) = f.evictions {
                obs.observe(evictions, &[KeyValue::new("observer.map.name", f.map)]);
            }
        }
    });
}

/// How long rounds take: from 1 ms (a quiet node) to 10 s (a round far
/// behind any interval).
pub(super) fn round_durations(meter: &Meter) -> opentelemetry::metrics::Histogram<f64> {
    let duration = &contract::COLLECTION_DURATION;
    meter
        .f64_histogram(duration.name)
        .with_description(duration.description)
        .with_unit(duration.unit)
        .with_boundaries(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
        .build()
}

/// How many series each counter has, its limit, and how often a cap folded
/// an update into an overflow series.
pub(super) fn register_series(meter: &Meter, published: &Arc<Published>) {
    type Pick = fn(&crate::series::SeriesStore, Counter) -> u64;
    let gauges: [(&'static contract::Instrument, Pick); 2] = [
        (&contract::SERIES_USAGE, |s, c| s.len(c) as u64),
        (&contract::SERIES_LIMIT, |s, _| s.limits().max_series as u64),
    ];
    for (instrument, pick) in gauges {
        u64_gauge(meter, published, instrument, move |st, obs| {
            for counter in Counter::ALL {
                obs.observe(pick(&st.series, counter), &[KeyValue::new("observer.instrument", counter.instrument())]);
            }
        });
    }
    u64_counter(meter, published, &contract::SERIES_FOLDED, move |st, obs| {
        for counter in Counter::ALL {
            let folded = st.series.folded.get(&counter).copied().unwrap_or(0);
            obs.observe(folded, &[KeyValue::new("observer.instrument", counter.instrument())]);
        }
    });
}

/// Connections the metrics endpoint's cap closed or refused.
pub(super) fn register_connections(meter: &Meter, stats: &Arc<super::http::ConnectionStats>) {
    let stats = stats.clone();
    let closed = &contract::HTTP_CONNECTIONS_CLOSED;
    meter
        .u64_observable_counter(closed.name)
        .with_description(closed.description)
        .with_unit(closed.unit)
        .with_callback(move |obs| {
            use std::sync::atomic::Ordering::Relaxed;
            obs.observe(stats.evicted.load(Relaxed), &[KeyValue::new("observer.close_reason", "evicted")]);
            obs.observe(stats.refused.load(Relaxed), &[KeyValue::new("observer.close_reason", "refused")]);
        })
        .build();
}

/// The exporters' own counts.
pub(super) fn register_exports(meter: &Meter, stats: &Arc<ExportStats>) {
    type ExportPick = fn(&ExportCounts) -> u64;
    let exports: [(&'static contract::Instrument, ExportPick); 3] = [
        (&contract::EXPORT_ATTEMPTS, |c| c.attempts),
        (&contract::EXPORT_FAILURES, |c| c.failures),
        (&contract::EXPORT_DROPPED_BATCHES, |c| c.dropped),
    ];
    for (instrument, pick) in exports {
        meter
            .u64_observable_counter(instrument.name)
            .with_description(instrument.description)
            .with_unit(instrument.unit)
            .with_callback(counting(stats, move |all, obs| {
                for (exporter, counts) in all {
                    obs.observe(pick(counts), &[KeyValue::new("observer.exporter", *exporter)]);
                }
            }))
            .build();
    }

    let pending = &contract::EXPORT_PENDING_BATCHES;
    meter
        .u64_observable_gauge(pending.name)
        .with_description(pending.description)
        .with_unit(pending.unit)
        .with_callback(counting(stats, move |all, obs| {
            for (exporter, counts) in all.iter().filter(|(e, _)| **e == "otlp") {
                obs.observe(counts.pending, &[KeyValue::new("observer.exporter", *exporter)]);
            }
        }))
        .build();
}

/// A callback for an observable instrument on the exporters' counts.
fn counting(
    stats: &Arc<ExportStats>,
    read: impl Fn(&std::collections::BTreeMap<&'static str, ExportCounts>, &dyn AsyncInstrument<u64>)
    + Send
    + Sync
    + 'static,
) -> impl Fn(&dyn AsyncInstrument<u64>) + Send + Sync + 'static {
    let stats = stats.clone();
    move |obs| read(&stats.all(), obs)
}
