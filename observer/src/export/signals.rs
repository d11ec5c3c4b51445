//! The signals' counters: connects, accepts, TIME_WAIT entries, connect()
//! errors by errno and destination, listen overflows, per process.
use std::sync::Arc;

use opentelemetry::{KeyValue, metrics::Meter};

use super::{errno_name, reading, who_attrs};
use crate::{
    series::{Dest, ProcSeries, SeriesStore},
    snapshot::Published,
};

/// The counters of the signals, per process (and destination, port).
pub(super) fn register(meter: &Meter, published: &Arc<Published>) {
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
}
