//! Export: one OpenTelemetry MeterProvider whose instruments read the
//! latest round's `Snapshot`. Observable (asynchronous) instruments,
//! because the totals are computed by the round; and because the SDK then
//! reports only the series observed in each collection, a retired
//! process's series vanish.
pub mod http;
pub mod otlp;
pub mod resource;
pub mod stats;

use std::sync::Arc;

use opentelemetry::{
    KeyValue,
    metrics::{AsyncInstrument, Meter, MeterProvider as _},
};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use prometheus::{Encoder, TextEncoder};
pub use stats::{ExportCounts, ExportStats};

use crate::{
    error::Error,
    series::{Dest, NetworkType, ProcSeries, SeriesStore, Who},
    snapshot::{Published, Snapshot},
};

/// Resource attributes also put on every Prometheus series: the cluster
/// (from OTEL_RESOURCE_ATTRIBUTES, e.g. `k8s.cluster.name=prod-eu`), the
/// node (NODE_NAME) and the host.
pub const NODE_LABELS: [&str; 3] = ["k8s.cluster.name", "k8s.node.name", "host.name"];

pub struct Metrics {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
    stats: Arc<ExportStats>,
}

impl Metrics {
    /// One MeterProvider for both exports: the Prometheus registry and,
    /// when OTLP push is on, its reader; so both carry the same
    /// instruments, names, units and values.
    pub fn new(
        published: Arc<Published>,
        stats: Arc<ExportStats>,
        push: Option<otlp::SharedReader>,
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
        let mut builder = SdkMeterProvider::builder().with_reader(exporter).with_resource(resource::from_environment());
        if let Some(reader) = push {
            builder = builder.with_reader(reader);
        }
        let provider = builder.build();
        let meter = provider.meter("observer");
        register(&meter, &published);
        register_ceilings(&meter, &published);
        register_open_files(&meter, &published);
        register_exports(&meter, &stats);
        Ok(Self { provider, registry, stats })
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
        Who::Other => {
            out.push(KeyValue::new("process.pid", "other"));
            out.push(KeyValue::new("process.executable.name", "other"));
        }
    }
}

/// errno number -> its name, e.g. 99 -> "EADDRNOTAVAIL".
pub fn errno_name(errno: u32) -> String {
    let e = nix::errno::Errno::from_raw(errno as i32);
    if e == nix::errno::Errno::UnknownErrno { format!("errno_{errno}") } else { format!("{e:?}") }
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

fn register(meter: &Meter, published: &Arc<Published>) {
    type ProcPick = fn(&SeriesStore) -> &std::collections::BTreeMap<ProcSeries, u64>;
    let per_process: [(&str, &str, ProcPick); 3] = [
        ("observer.tcp.connects", "TCP connection attempts (SYN sent) by process", |s| &s.connects),
        ("observer.tcp.accepts", "TCP connections accepted by process", |s| &s.accepts),
        ("observer.tcp.time_wait_entries", "TCP sockets of the process that entered TIME_WAIT", |s| {
            &s.time_wait_entries
        }),
    ];
    for (name, description, pick) in per_process {
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_unit("{connection}")
            .with_callback(reading(published, move |st, obs| {
                for (series, value) in pick(&st.series) {
                    let mut attrs = Vec::with_capacity(3);
                    who_attrs(&series.who, series.network, &mut attrs);
                    obs.observe(*value, &attrs);
                }
            }))
            .build();
    }

    meter
        .u64_observable_counter("observer.tcp.connect_errors")
        .with_description("connect() failures by process, errno (error.type) and destination")
        .with_unit("{error}")
        .with_callback(reading(published, move |st, obs| {
            for (s, value) in &st.series.connect_errors {
                let mut attrs = Vec::with_capacity(6);
                who_attrs(&s.who, s.network, &mut attrs);
                attrs.push(KeyValue::new("error.type", errno_name(s.errno)));
                match &s.dest {
                    Dest::Addr { addr, port } => {
                        attrs.push(KeyValue::new("server.address", addr.to_string()));
                        attrs.push(KeyValue::new("server.port", *port as i64));
                    }
                    Dest::Other => {
                        attrs.push(KeyValue::new("server.address", "other"));
                        attrs.push(KeyValue::new("server.port", "other"));
                    }
                }
                obs.observe(*value, &attrs);
            }
        }))
        .build();

    meter
        .u64_observable_counter("observer.tcp.listen_overflows")
        .with_description(
            "Connections a listener dropped because its accept (or SYN) queue was full, by owner and port",
        )
        .with_unit("{connection}")
        .with_callback(reading(published, move |st, obs| {
            for (s, value) in &st.series.listen_overflows {
                let mut attrs = Vec::with_capacity(4);
                who_attrs(&s.who, s.network, &mut attrs);
                attrs.push(KeyValue::new("server.port", s.port as i64));
                obs.observe(*value, &attrs);
            }
        }))
        .build();

    meter
        .u64_observable_gauge("observer.probe.attached")
        .with_description("1 for each hook and the mode it is attached in")
        .with_callback(reading(published, move |st, obs| {
            for a in &st.kernel.attachments {
                obs.observe(1, &[KeyValue::new("hook", a.hook), KeyValue::new("mode", a.mode.to_string())]);
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
        meter
            .u64_observable_gauge(name)
            .with_description(description)
            .with_unit("{entry}")
            .with_callback(reading(published, move |st, obs| {
                for f in &st.kernel.maps {
                    obs.observe(pick(f), &[KeyValue::new("map", f.map)]);
                }
            }))
            .build();
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

/// The exporters' own counts.
fn register_exports(meter: &Meter, stats: &Arc<ExportStats>) {
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

/// Each process's open files against its RLIMIT_NOFILE (the processes
/// with series: those that connect, accept or listen).
fn register_open_files(meter: &Meter, published: &Arc<Published>) {
    type Pick = fn(&crate::node::files::OpenFiles) -> u64;
    let gauges: [(&str, &str, Pick); 2] = [
        (
            "observer.process.open_files",
            "Open file descriptors of the process; at observer_process_open_files_limit, accept() and socket() \
             fail with EMFILE",
            |f| f.open,
        ),
        ("observer.process.open_files.limit", "The process's soft RLIMIT_NOFILE", |f| f.limit),
    ];
    for (name, description, pick) in gauges {
        meter
            .u64_observable_gauge(name)
            .with_description(description)
            .with_unit("{file}")
            .with_callback(reading(published, move |st, obs| {
                let mut attrs = Vec::with_capacity(7);
                for (who, files) in &st.node.open_files {
                    attrs.clear();
                    process_attrs(who, &mut attrs);
                    obs.observe(pick(files), &attrs);
                }
            }))
            .build();
    }
}

/// A destination of a namespace's ephemeral ports.
fn destination_attrs(netns: &str, d: &crate::node::usage::Destination) -> [KeyValue; 4] {
    [
        KeyValue::new("network_namespace", netns.to_string()),
        KeyValue::new("source.address", d.source.to_string()),
        KeyValue::new("server.address", d.destination.ip().to_string()),
        KeyValue::new("server.port", i64::from(d.destination.port())),
    ]
}

/// Ceilings next to usage, per network namespace (`network_namespace`:
/// "host" or the namespace's inode number).
fn register_ceilings(meter: &Meter, published: &Arc<Published>) {
    meter
        .u64_observable_gauge("observer.ephemeral_ports.used")
        .with_description(
            "Local ports of the ephemeral range in use toward a destination (all states holding one, TIME_WAIT \
             included), for the most used destinations of each namespace; compare with \
             observer_ephemeral_ports_limit: connect() fails with EADDRNOTAVAIL at the limit",
        )
        .with_unit("{port}")
        .with_callback(reading(published, move |st, obs| {
            for (netns, u) in &st.node.namespaces {
                for d in &u.destinations {
                    obs.observe(d.used.into(), &destination_attrs(netns, d));
                }
            }
        }))
        .build();
    meter
        .f64_observable_gauge("observer.ephemeral_ports.exhaustion")
        .with_description(
            "Seconds until no ephemeral port is left toward a destination, at the rate its use grew over the last \
             minute (0: exhausted); only for destinations whose use is growing",
        )
        .with_unit("s")
        .with_callback(reading(published, move |st, obs| {
            for (netns, u) in &st.node.namespaces {
                for d in &u.destinations {
                    let Some(seconds) = d.exhaustion_seconds else { continue };
                    obs.observe(seconds, &destination_attrs(netns, d));
                }
            }
        }))
        .build();
    type NetnsPick = fn(&crate::node::usage::NetnsUsage) -> u64;
    let per_netns: [(&str, &str, &str, NetnsPick); 3] = [
        (
            "observer.ephemeral_ports.limit",
            "Local ports connect() can use toward one destination: ip_local_port_range minus the reserved ports",
            "{port}",
            |u| u.settings.ephemeral_ports().into(),
        ),
        ("observer.time_wait.sockets", "TCP sockets in TIME_WAIT now", "{socket}", |u| u.time_wait.into()),
        (
            "observer.time_wait.limit",
            "net.ipv4.tcp_max_tw_buckets: beyond it, sockets skip TIME_WAIT (TCPTimeWaitOverflow)",
            "{socket}",
            |u| u.settings.tcp_max_tw_buckets.into(),
        ),
    ];
    for (name, description, unit, pick) in per_netns {
        meter
            .u64_observable_gauge(name)
            .with_description(description)
            .with_unit(unit)
            .with_callback(reading(published, move |st, obs| {
                for (netns, u) in &st.node.namespaces {
                    obs.observe(pick(u), &[KeyValue::new("network_namespace", netns.clone())]);
                }
            }))
            .build();
    }
    type QueuePick = fn(&crate::node::sock_diag::Listener) -> u64;
    let queues: [(&str, &str, QueuePick); 2] = [
        ("observer.listen_queue.length", "Connections waiting in a listener's accept queue (ss -lnt Recv-Q)", |q| {
            q.queued.into()
        }),
        ("observer.listen_queue.limit", "A listener's accept queue limit, its backlog (ss -lnt Send-Q)", |q| {
            q.backlog.into()
        }),
    ];
    for (name, description, pick) in queues {
        meter
            .u64_observable_gauge(name)
            .with_description(description)
            .with_unit("{connection}")
            .with_callback(reading(published, move |st, obs| {
                let mut attrs = Vec::with_capacity(10);
                for gauge in &st.node.listeners {
                    let q = &gauge.listener;
                    attrs.clear();
                    attrs.push(KeyValue::new("network_namespace", gauge.netns.clone()));
                    attrs.push(KeyValue::new("server.address", q.address.to_string()));
                    attrs.push(KeyValue::new("server.port", i64::from(q.port)));
                    // The process that listens (and its pod), when known.
                    if let Some(owner) = &gauge.owner {
                        process_attrs(owner, &mut attrs);
                    }
                    obs.observe(pick(q), &attrs);
                }
            }))
            .build();
    }
    meter
        .u64_observable_gauge("observer.net.setting")
        .with_description(
            "The namespace's settings that bound connections: ip_local_port_range_low/high, tcp_fin_timeout, \
             tcp_tw_reuse, somaxconn, tcp_max_syn_backlog, tcp_max_tw_buckets",
        )
        .with_callback(reading(published, move |st, obs| {
            for (netns, u) in &st.node.namespaces {
                let s = &u.settings;
                for (setting, value) in [
                    ("ip_local_port_range_low", u32::from(s.ip_local_port_range.0)),
                    ("ip_local_port_range_high", u32::from(s.ip_local_port_range.1)),
                    ("tcp_fin_timeout", s.tcp_fin_timeout),
                    ("tcp_tw_reuse", s.tcp_tw_reuse),
                    ("somaxconn", s.somaxconn),
                    ("tcp_max_syn_backlog", s.tcp_max_syn_backlog),
                    ("tcp_max_tw_buckets", s.tcp_max_tw_buckets),
                ] {
                    obs.observe(
                        value.into(),
                        &[KeyValue::new("network_namespace", netns.clone()), KeyValue::new("setting", setting)],
                    );
                }
            }
        }))
        .build();
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
