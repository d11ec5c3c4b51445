//! The node's gauges: ceilings next to usage per network namespace,
//! accept queues per listener (with its owner), open files per process.
//! Names, units and meanings: `contract.rs`.
use std::sync::Arc;

use opentelemetry::{KeyValue, metrics::Meter};

use super::{contract, mark_overflow, process_attrs, reading, u64_counter, u64_gauge};
use crate::{
    attribution::PodLabels,
    node::conntrack::DropReason,
    snapshot::{NamespaceGauge, Published},
};

/// Each process's open files against its RLIMIT_NOFILE (the processes
/// with series: those that connect, accept or listen).
pub(super) fn register_open_files(meter: &Meter, published: &Arc<Published>) {
    type Pick = fn(&crate::node::files::OpenFiles) -> u64;
    let gauges: [(&'static contract::Instrument, Pick); 2] =
        [(&contract::OPEN_FILE_DESCRIPTORS, |f| f.open), (&contract::OPEN_FILE_DESCRIPTOR_LIMIT, |f| f.limit)];
    for (instrument, pick) in gauges {
        u64_gauge(meter, published, instrument, move |st, obs| {
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
    out.push(KeyValue::new("observer.network_namespace", name.to_string()));
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

/// Ceilings next to usage, per network namespace
/// (`observer.network_namespace`: "host" or the namespace's inode number).
pub(super) fn register_ceilings(meter: &Meter, published: &Arc<Published>) {
    type DestinationPick = fn(&crate::node::usage::Destination) -> u32;
    let per_destination: [(&'static contract::Instrument, DestinationPick); 2] =
        [(&contract::EPHEMERAL_PORT_USAGE, |d| d.used), (&contract::EPHEMERAL_PORT_TIME_WAIT, |d| d.time_wait)];
    for (instrument, pick) in per_destination {
        u64_gauge(meter, published, instrument, move |st, obs| {
            for ns in &st.node.namespaces {
                for d in ns.usage.counts.iter().flat_map(|c| &c.destinations) {
                    obs.observe(pick(d).into(), &destination_attrs(ns, d));
                }
            }
        });
    }
    let exhaustion = &contract::EPHEMERAL_PORT_TIME_TO_EXHAUSTION;
    meter
        .f64_observable_gauge(exhaustion.name)
        .with_description(exhaustion.description)
        .with_unit(exhaustion.unit)
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
    let per_netns: [(&'static contract::Instrument, NetnsPick); 11] = [
        (&contract::CONNTRACK_USAGE, |u| u.conntrack.map(|c| c.entries)),
        (&contract::CONNTRACK_LIMIT, |u| u.conntrack.map(|c| c.limit)),
        (&contract::EPHEMERAL_PORT_LIMIT, |u| Some(u.settings.ephemeral_ports().into())),
        (&contract::TIME_WAIT_USAGE, |u| u.counts.as_ref().map(|c| c.time_wait)),
        (&contract::SYSCTL_PORT_RANGE_LOW, |u| Some(u.settings.ip_local_port_range.0.into())),
        (&contract::SYSCTL_PORT_RANGE_HIGH, |u| Some(u.settings.ip_local_port_range.1.into())),
        (&contract::SYSCTL_TCP_FIN_TIMEOUT, |u| Some(u.settings.tcp_fin_timeout.into())),
        (&contract::SYSCTL_TCP_TW_REUSE, |u| Some(u.settings.tcp_tw_reuse.into())),
        (&contract::SYSCTL_SOMAXCONN, |u| Some(u.settings.somaxconn.into())),
        (&contract::SYSCTL_TCP_MAX_SYN_BACKLOG, |u| Some(u.settings.tcp_max_syn_backlog.into())),
        (&contract::SYSCTL_TCP_MAX_TW_BUCKETS, |u| Some(u.settings.tcp_max_tw_buckets.into())),
    ];
    for (instrument, pick) in per_netns {
        u64_gauge(meter, published, instrument, move |st, obs| {
            let mut attrs = Vec::with_capacity(4);
            for ns in &st.node.namespaces {
                // TIME_WAIT of a namespace never dumped yet: no value.
                let Some(value) = pick(&ns.usage) else { continue };
                attrs.clear();
                netns_attrs(&ns.name, ns.pod.as_deref(), &mut attrs);
                obs.observe(value, &attrs);
            }
        });
    }

    u64_counter(meter, published, &contract::CONNTRACK_DROPS, |st, obs| {
        let mut attrs = Vec::with_capacity(5);
        for ns in &st.node.namespaces {
            let Some(drops) = ns.conntrack_drops else { continue };
            for (reason, n) in DropReason::ALL.iter().zip(drops) {
                attrs.clear();
                netns_attrs(&ns.name, ns.pod.as_deref(), &mut attrs);
                attrs.push(KeyValue::new("observer.conntrack.drop_reason", reason.as_str()));
                obs.observe(n, &attrs);
            }
        }
    });

    type QueuePick = fn(&crate::node::sock_diag::Listener) -> u64;
    type FoldPick = fn(&crate::queues::Folded) -> u64;
    let queues: [(&'static contract::Instrument, QueuePick, FoldPick); 2] = [
        (&contract::LISTEN_QUEUE_USAGE, |q| q.queued.into(), |f| f.queued),
        (&contract::LISTEN_QUEUE_LIMIT, |q| q.backlog.into(), |f| f.backlog),
    ];
    for (instrument, pick, pick_folded) in queues {
        u64_gauge(meter, published, instrument, move |st, obs| {
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
                        attrs.push(KeyValue::new("observer.network_namespace", gauge.netns.clone()));
                        process_attrs(owner, &mut attrs);
                    }
                    None => netns_attrs(&gauge.netns, gauge.pod.as_deref(), &mut attrs),
                }
                obs.observe(pick(q), &attrs);
            }
            // The listeners beyond --max-listeners, one pair per namespace.
            for fold in &st.node.folded_listeners {
                attrs.clear();
                netns_attrs(&fold.netns, fold.pod.as_deref(), &mut attrs);
                mark_overflow(&mut attrs);
                obs.observe(pick_folded(&fold.folded), &attrs);
            }
        });
    }
}
