//! The signals' counters: connects, accepts, TIME_WAIT entries, connect()
//! errors by errno and destination, listen overflows, per process.
use std::sync::Arc;

use opentelemetry::{KeyValue, metrics::Meter};

use super::{errno_name, reading, who_attrs};
use crate::{
    series::{Counter, Dest, OTHER_PORT, ProcSeries, SeriesStore},
    snapshot::Published,
};

/// The counters of the signals, per process (and destination, port).
pub(super) fn register(meter: &Meter, published: &Arc<Published>) {
    type ProcPick = fn(&SeriesStore) -> &std::collections::BTreeMap<ProcSeries, u64>;
    let per_process: [(Counter, &str, ProcPick); 3] = [
        (Counter::Connects, "TCP connection attempts (SYN sent) by process", |s| &s.connects),
        (Counter::Accepts, "TCP connections accepted by process", |s| &s.accepts),
        (Counter::TimeWaitEntries, "TCP sockets of the process that entered TIME_WAIT", |s| &s.time_wait_entries),
    ];
    for (counter, description, pick) in per_process {
        meter
            .u64_observable_counter(counter.instrument())
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
        .u64_observable_counter(Counter::ConnectErrors.instrument())
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
        .u64_observable_counter(Counter::ListenOverflows.instrument())
        .with_description(
            "Connections a listener dropped because its accept (or SYN) queue was full, by owner and port",
        )
        .with_unit("{connection}")
        .with_callback(reading(published, move |st, obs| {
            for (s, value) in &st.series.listen_overflows {
                let mut attrs = Vec::with_capacity(4);
                who_attrs(&s.who, s.network, &mut attrs);
                if s.port == OTHER_PORT {
                    attrs.push(KeyValue::new("server.port", "other"));
                } else {
                    attrs.push(KeyValue::new("server.port", s.port as i64));
                }
                obs.observe(*value, &attrs);
            }
        }))
        .build();
}
