//! The signals' counters: connects, accepts, TIME_WAIT entries, connect()
//! errors by errno and destination, listen overflows, per process.
use std::sync::Arc;

use opentelemetry::{KeyValue, metrics::Meter};

use super::{errno_name, mark_overflow, u64_counter, who_attrs};
use crate::{
    series::{Counter, Dest, OTHER_PORT, ProcSeries, SeriesStore},
    snapshot::Published,
};

/// The counters of the signals, per process (and destination, port).
pub(super) fn register(meter: &Meter, published: &Arc<Published>) {
    type ProcPick = fn(&SeriesStore) -> &std::collections::BTreeMap<ProcSeries, u64>;
    let per_process: [(Counter, ProcPick); 3] = [
        (Counter::Connects, |s| &s.connects),
        (Counter::Accepts, |s| &s.accepts),
        (Counter::TimeWaitEntries, |s| &s.time_wait_entries),
    ];
    for (counter, pick) in per_process {
        u64_counter(meter, published, counter.contract(), move |st, obs| {
            for (series, value) in pick(&st.series) {
                let mut attrs = Vec::with_capacity(3);
                who_attrs(&series.who, series.network, &mut attrs);
                obs.observe(*value, &attrs);
            }
        });
    }

    u64_counter(meter, published, Counter::ConnectErrors.contract(), move |st, obs| {
        for (s, value) in &st.series.connect_errors {
            let mut attrs = Vec::with_capacity(6);
            who_attrs(&s.who, s.network, &mut attrs);
            attrs.push(KeyValue::new("error.type", errno_name(s.errno)));
            match &s.dest {
                Dest::Addr { addr, port } => {
                    attrs.push(KeyValue::new("server.address", addr.to_string()));
                    attrs.push(KeyValue::new("server.port", *port as i64));
                }
                // The folded destinations: no address, marked (once).
                Dest::Other => mark_overflow(&mut attrs),
            }
            obs.observe(*value, &attrs);
        }
    });

    u64_counter(meter, published, Counter::ListenOverflows.contract(), move |st, obs| {
        for (s, value) in &st.series.listen_overflows {
            let mut attrs = Vec::with_capacity(4);
            who_attrs(&s.who, s.network, &mut attrs);
            if s.port == OTHER_PORT {
                mark_overflow(&mut attrs);
            } else {
                attrs.push(KeyValue::new("server.port", s.port as i64));
            }
            obs.observe(*value, &attrs);
        }
    });
}
