//! The node's gauges: ceilings next to usage per network namespace,
//! accept queues per listener (with its owner), open files per process.
use std::sync::Arc;

use opentelemetry::{KeyValue, metrics::Meter};

use super::{process_attrs, reading, u64_gauge};
use crate::{
    attribution::PodLabels,
    snapshot::{NamespaceGauge, Published},
};

/// Each process's open files against its RLIMIT_NOFILE (the processes
/// with series: those that connect, accept or listen).
pub(super) fn register_open_files(meter: &Meter, published: &Arc<Published>) {
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
        u64_gauge(meter, published, name, description, "{file}", move |st, obs| {
            let mut attrs = Vec::with_capacity(7);
            for (who, files) in &st.node.open_files {
                attrs.clear();
                process_attrs(who, &mut attrs);
                obs.observe(pick(files), &attrs);
            }
        });
    }
}

/// A network namespace: its name, and its pod's labels when it is a pod's.
fn netns_attrs(name: &str, pod: Option<&PodLabels>, out: &mut Vec<KeyValue>) {
    out.push(KeyValue::new("network_namespace", name.to_string()));
    if let Some(pod) = pod {
        out.push(KeyValue::new("k8s.pod.uid", pod.pod_uid.clone()));
        for (key, value) in [("k8s.pod.name", &pod.pod_name), ("k8s.namespace.name", &pod.namespace)] {
            if let Some(v) = value {
                out.push(KeyValue::new(key, v.clone()));
            }
        }
    }
}

/// A destination of a namespace's ephemeral ports.
fn destination_attrs(ns: &NamespaceGauge, d: &crate::node::usage::Destination) -> Vec<KeyValue> {
    let mut attrs = Vec::with_capacity(7);
    netns_attrs(&ns.name, ns.pod.as_deref(), &mut attrs);
    attrs.push(KeyValue::new("source.address", d.source.to_string()));
    attrs.push(KeyValue::new("server.address", d.destination.ip().to_string()));
    attrs.push(KeyValue::new("server.port", i64::from(d.destination.port())));
    attrs
}

/// Ceilings next to usage, per network namespace (`network_namespace`:
/// "host" or the namespace's inode number).
pub(super) fn register_ceilings(meter: &Meter, published: &Arc<Published>) {
    u64_gauge(
        meter,
        published,
        "observer.ephemeral_ports.used",
        "Local ports of the ephemeral range in use toward a destination (all states holding one, TIME_WAIT \
         included), for the most used destinations of each namespace; compare with \
         observer_ephemeral_ports_limit: connect() fails with EADDRNOTAVAIL at the limit",
        "{port}",
        move |st, obs| {
            for ns in &st.node.namespaces {
                for d in ns.usage.counts.iter().flat_map(|c| &c.destinations) {
                    obs.observe(d.used.into(), &destination_attrs(ns, d));
                }
            }
        },
    );
    meter
        .f64_observable_gauge("observer.ephemeral_ports.exhaustion")
        .with_description(
            "Seconds until no ephemeral port is left toward a destination, at the rate its use grew over the last \
             minute (0: exhausted); only for destinations whose use is growing",
        )
        .with_unit("s")
        .with_callback(reading(published, move |st, obs| {
            for ns in &st.node.namespaces {
                for d in ns.usage.counts.iter().flat_map(|c| &c.destinations) {
                    let Some(seconds) = d.exhaustion_seconds else { continue };
                    obs.observe(seconds, &destination_attrs(ns, d));
                }
            }
        }))
        .build();
    type NetnsPick = fn(&crate::node::NetnsUsage) -> Option<u64>;
    let per_netns: [(&str, &str, &str, NetnsPick); 3] = [
        (
            "observer.ephemeral_ports.limit",
            "Local ports connect() can use toward one destination: ip_local_port_range minus the reserved ports",
            "{port}",
            |u| Some(u.settings.ephemeral_ports().into()),
        ),
        (
            "observer.time_wait.sockets",
            "TCP sockets in TIME_WAIT now (ss state time-wait), from the namespace's latest dump",
            "{socket}",
            |u| u.counts.as_ref().map(|c| c.time_wait),
        ),
        (
            "observer.time_wait.limit",
            "net.ipv4.tcp_max_tw_buckets: beyond it, sockets skip TIME_WAIT (TCPTimeWaitOverflow)",
            "{socket}",
            |u| Some(u.settings.tcp_max_tw_buckets.into()),
        ),
    ];
    for (name, description, unit, pick) in per_netns {
        u64_gauge(meter, published, name, description, unit, move |st, obs| {
            let mut attrs = Vec::with_capacity(4);
            for ns in &st.node.namespaces {
                let Some(value) = pick(&ns.usage) else { continue };
                attrs.clear();
                netns_attrs(&ns.name, ns.pod.as_deref(), &mut attrs);
                obs.observe(value, &attrs);
            }
        });
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
        u64_gauge(meter, published, name, description, "{connection}", move |st, obs| {
            let mut attrs = Vec::with_capacity(10);
            for gauge in &st.node.listeners {
                let q = &gauge.listener;
                attrs.clear();
                attrs.push(KeyValue::new("server.address", q.address.to_string()));
                attrs.push(KeyValue::new("server.port", i64::from(q.port)));
                // The process that listens (and its pod), when known; else
                // the namespace's pod.
                match &gauge.owner {
                    Some(owner) => {
                        attrs.push(KeyValue::new("network_namespace", gauge.netns.clone()));
                        process_attrs(owner, &mut attrs);
                    }
                    None => netns_attrs(&gauge.netns, gauge.pod.as_deref(), &mut attrs),
                }
                obs.observe(pick(q), &attrs);
            }
        });
    }
    meter
        .u64_observable_gauge("observer.net.setting")
        .with_description(
            "The namespace's settings that bound connections: ip_local_port_range_low/high, tcp_fin_timeout, \
             tcp_tw_reuse, somaxconn, tcp_max_syn_backlog, tcp_max_tw_buckets",
        )
        .with_callback(reading(published, move |st, obs| {
            let mut attrs = Vec::with_capacity(5);
            for ns in &st.node.namespaces {
                let s = &ns.usage.settings;
                for (setting, value) in [
                    ("ip_local_port_range_low", u32::from(s.ip_local_port_range.0)),
                    ("ip_local_port_range_high", u32::from(s.ip_local_port_range.1)),
                    ("tcp_fin_timeout", s.tcp_fin_timeout),
                    ("tcp_tw_reuse", s.tcp_tw_reuse),
                    ("somaxconn", s.somaxconn),
                    ("tcp_max_syn_backlog", s.tcp_max_syn_backlog),
                    ("tcp_max_tw_buckets", s.tcp_max_tw_buckets),
                ] {
                    attrs.clear();
                    netns_attrs(&ns.name, ns.pod.as_deref(), &mut attrs);
                    attrs.push(KeyValue::new("setting", setting));
                    obs.observe(value.into(), &attrs);
                }
            }
        }))
        .build();
}
