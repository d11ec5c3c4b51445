//! observer's own health: which hooks run in which mode, what the kernel
//! side lost or skipped, how rounds go, how full the maps are, and the
//! exporters' own counts.
use std::sync::Arc;

use opentelemetry::{
    KeyValue,
    metrics::{AsyncInstrument, Meter},
};

use super::{ExportCounts, ExportStats, reading, u64_gauge};
use crate::series::Counter;
use crate::snapshot::Published;

/// How observer itself is doing: hooks, kernel-side losses, rounds, maps.
pub(super) fn register(meter: &Meter, published: &Arc<Published>) {
    meter
        .u64_observable_gauge("observer.probe.attached")
        .with_description(
            "1 for each hook and the mode it is attached in; missed_events says whether this kernel counts the \
             runs of its programs it skips (counted, uncounted: too old for that program type, no_program)",
        )
        .with_callback(reading(published, move |st, obs| {
            for a in &st.kernel.attachments {
                obs.observe(
                    1,
                    &[
                        KeyValue::new("hook", a.hook),
                        KeyValue::new("mode", a.mode.to_string()),
                        KeyValue::new("missed_events", a.skipped_runs.as_str()),
                    ],
                );
            }
        }))
        .build();

    meter
        .u64_observable_counter("observer.kernel.lost_updates")
        .with_description("Kernel-side counter updates lost because a map was full (should stay 0)")
        .with_unit("{update}")
        .with_callback(reading(published, move |st, obs| {
            for (map, value) in &st.kernel.lost {
                obs.observe(*value, &[KeyValue::new("map", *map)]);
            }
        }))
        .build();

    meter
        .u64_observable_counter("observer.kernel.missed_events")
        .with_description(
            "Hook events the kernel did not hand to observer's program because a BPF program was already \
             running on that CPU (recursion protection; counted by Linux 5.12+ for fentry/tp_btf, 6.7+ for \
             kprobes and tracepoints). When not 0, counts may be short by up to this many events.",
        )
        .with_unit("{event}")
        .with_callback(reading(published, move |st, obs| {
            for (hook, program, value) in &st.kernel.missed {
                obs.observe(*value, &[KeyValue::new("hook", *hook), KeyValue::new("program", *program)]);
            }
        }))
        .build();

    meter
        .u64_observable_counter("observer.kernel.unseen_events")
        .with_description(
            "Events the kernel counted that observer's programs never ran for, with no skipped run reported, \
             each namespace's own count against observer's, checked every 10 rounds: event=\"time_wait_entry\" \
             (TcpExtTW + TcpExtTWKilled), event=\"listen_overflow\" (TcpExtListenOverflows, where programs \
             count overflows). When not 0, those counts are short by this many.",
        )
        .with_unit("{event}")
        .with_callback(reading(published, move |st, obs| {
            for (event, value) in &st.kernel.unseen {
                obs.observe(*value, &[KeyValue::new("event", *event)]);
            }
        }))
        .build();

    meter
        .f64_observable_gauge("observer.collection.duration")
        .with_description(
            "How long the last read of the kernel maps (and sock_diag sweep) took; near the interval means \
             collections fall behind",
        )
        .with_unit("s")
        .with_callback(reading(published, move |st, obs| {
            obs.observe(st.rounds.seconds, &[]);
        }))
        .build();

    u64_gauge(
        meter,
        published,
        "observer.namespaces",
        "Network namespaces by how the last round read them: current (ports per destination exact as of the \
         round), deferred (changed, waiting for their turn to be dumped; their last reading is exported), unread \
         (beyond --max-namespaces, or their files could not be opened)",
        "{namespace}",
        move |st, obs| {
            let c = &st.node.sweep;
            for (reading, value) in [("current", c.current), ("deferred", c.deferred), ("unread", c.unread)] {
                obs.observe(value, &[KeyValue::new("reading", reading)]);
            }
        },
    );

    meter
        .u64_observable_counter("observer.collection.failures")
        .with_description("Collections that failed (logged once per streak, retried every interval)")
        .with_unit("{collection}")
        .with_callback(reading(published, move |st, obs| {
            obs.observe(st.rounds.failures, &[]);
        }))
        .build();

    type FillPick = fn(&crate::collect::MapFill) -> u64;
    let fill: [(&str, &str, FillPick); 2] = [
        ("observer.map.entries", "Entries in each kernel map now (see observer.map.capacity)", |f| f.entries),
        ("observer.map.capacity", "Maximum entries of each kernel map", |f| f.capacity),
    ];
    for (name, description, pick) in fill {
        u64_gauge(meter, published, name, description, "{entry}", move |st, obs| {
            for f in &st.kernel.maps {
                obs.observe(pick(f), &[KeyValue::new("map", f.map)]);
            }
        });
    }
    meter
        .u64_observable_counter("observer.map.evictions")
        .with_description(
            "Entries an LRU map dropped to make room (at least this many): SOCK_OWNERS evictions mean \
             TIME_WAIT entries charged to no process, INFLIGHT_CONNECTS/THREAD_CONNECTS evictions mean lost \
             connect() errors; raise --max-sockets when SOCK_OWNERS evicts",
        )
        .with_unit("{entry}")
        .with_callback(reading(published, move |st, obs| {
            for f in &st.kernel.maps {
                if let Some(evictions) = f.evictions {
                    obs.observe(evictions, &[KeyValue::new("map", f.map)]);
                }
            }
        }))
        .build();
}

/// How many series each counter has, its limit, and how often a cap folded
/// an update into an `other` series.
pub(super) fn register_series(meter: &Meter, published: &Arc<Published>) {
    type Pick = fn(&crate::series::SeriesStore, Counter) -> u64;
    let gauges: [(&str, &str, Pick); 2] = [
        ("observer.series.usage", "Series each counter has now (see observer.series.limit)", |s, c| s.len(c) as u64),
        (
            "observer.series.limit",
            "Series a counter may have (--max-series); beyond, new ones are counted in an other series per errno",
            |s, _| s.limits().max_series as u64,
        ),
    ];
    for (name, description, pick) in gauges {
        u64_gauge(meter, published, name, description, "{series}", move |st, obs| {
            for counter in Counter::ALL {
                obs.observe(pick(&st.series, counter), &[KeyValue::new("instrument", counter.instrument())]);
            }
        });
    }
    meter
        .u64_observable_counter("observer.series.folded")
        .with_description(
            "Updates of a counter charged to an other series because a cap was reached (--max-processes, \
             --max-destinations, --max-series): totals stay exact, the process or destination is lost; raise \
             the cap named in the log",
        )
        .with_unit("{update}")
        .with_callback(reading(published, move |st, obs| {
            for counter in Counter::ALL {
                let folded = st.series.folded.get(&counter).copied().unwrap_or(0);
                obs.observe(folded, &[KeyValue::new("instrument", counter.instrument())]);
            }
        }))
        .build();
}

/// Connections the metrics endpoint's cap closed or refused.
pub(super) fn register_connections(meter: &Meter, stats: &Arc<super::http::ConnectionStats>) {
    let stats = stats.clone();
    meter
        .u64_observable_counter("observer.http.connections.closed")
        .with_description(
            "Connections to the metrics endpoint closed by its cap of open connections: evicted (the oldest \
             without a request, to make room) or refused (every one busy); clients that never finish a request",
        )
        .with_unit("{connection}")
        .with_callback(move |obs| {
            use std::sync::atomic::Ordering::Relaxed;
            obs.observe(stats.evicted.load(Relaxed), &[KeyValue::new("reason", "evicted")]);
            obs.observe(stats.refused.load(Relaxed), &[KeyValue::new("reason", "refused")]);
        })
        .build();
}

/// The exporters' own counts.
pub(super) fn register_exports(meter: &Meter, stats: &Arc<ExportStats>) {
    type ExportPick = fn(&ExportCounts) -> u64;
    let exports: [(&str, &str, &str, ExportPick); 3] = [
        (
            "observer.export.attempts",
            "Exports attempted, by exporter: Prometheus scrapes served, OTLP pushes sent",
            "{export}",
            |c| c.attempts,
        ),
        (
            "observer.export.failures",
            "Exports that failed, by exporter (OTLP: retried with backoff; cumulative counts arrive complete \
             once the collector answers again)",
            "{export}",
            |c| c.failures,
        ),
        (
            "observer.export.dropped_batches",
            "OTLP delta batches dropped because the collector was unreachable for longer than the buffer holds",
            "{batch}",
            |c| c.dropped,
        ),
    ];
    for (name, description, unit, pick) in exports {
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_unit(unit)
            .with_callback(counting(stats, move |all, obs| {
                for (exporter, counts) in all {
                    obs.observe(pick(counts), &[KeyValue::new("exporter", *exporter)]);
                }
            }))
            .build();
    }

    meter
        .u64_observable_gauge("observer.export.pending_batches")
        .with_description("OTLP batches waiting to be sent (1 at most with cumulative temporality)")
        .with_unit("{batch}")
        .with_callback(counting(stats, move |all, obs| {
            for (exporter, counts) in all.iter().filter(|(e, _)| **e == "otlp") {
                obs.observe(counts.pending, &[KeyValue::new("exporter", *exporter)]);
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
