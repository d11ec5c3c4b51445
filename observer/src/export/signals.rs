//! The signals' counters: connects, accepts, TIME_WAIT entries, connect()
//! errors by errno and destination, listen overflows and full SYN queues,
//! per process; and the connections: established, closed by lifetime,
//! open now.
use std::sync::Arc;

use opentelemetry::{KeyValue, metrics::Meter};

use super::{contract, errno_name, mark_overflow, u64_counter, u64_gauge, who_attrs};
use crate::{
    config::LimitOf,
    series::{ConnectionSeries, Counter, Dest, Direction, OTHER_PORT, ProcSeries, SeriesStore, durations},
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

    u64_counter(meter, published, Counter::SynQueueFull.contract(), move |st, obs| {
        for (s, value) in &st.series.syn_queue_full {
            let mut attrs = Vec::with_capacity(5);
            who_attrs(&s.listener.who, s.listener.network, &mut attrs);
            if s.listener.port == OTHER_PORT {
                mark_overflow(&mut attrs);
            } else {
                attrs.push(KeyValue::new("server.port", s.listener.port as i64));
            }
            attrs.push(KeyValue::new("observer.syn_queue.action", s.action.as_str()));
            obs.observe(*value, &attrs);
        }
    });
}

/// A connection series' attributes: who, direction, far end.
fn connection_attrs(s: &ConnectionSeries, out: &mut Vec<KeyValue>) {
    who_attrs(&s.who, s.network, out);
    out.push(KeyValue::new("observer.connection.direction", s.direction.as_str()));
    match (&s.dest, s.direction) {
        (Dest::Addr { addr, port }, Direction::Outbound) => {
            out.push(KeyValue::new("server.address", addr.to_string()));
            out.push(KeyValue::new("server.port", *port as i64));
        }
        (Dest::Addr { port, .. }, Direction::Inbound) => out.push(KeyValue::new("server.port", *port as i64)),
        // The folded destinations: no address, marked (once).
        (Dest::Other, _) => mark_overflow(out),
    }
}

/// Connections: established (and their handshakes' times and packets sent
/// again) and closed (by lifetime) per process, direction and far end,
/// those open now, and the limits declared.
pub(super) fn register_connections(meter: &Meter, published: &Arc<Published>) {
    u64_counter(meter, published, Counter::ConnectionsEstablished.contract(), move |st, obs| {
        observe_connections(&st.series.connections_established, obs)
    });
    u64_counter(meter, published, Counter::HandshakeRetransmits.contract(), move |st, obs| {
        observe_connections(&st.series.handshake_retransmits, obs)
    });
    u64_counter(meter, published, Counter::ConnectionsClosed.contract(), move |st, obs| {
        observe_by_bound(&st.series.connections_closed, obs)
    });
    u64_counter(meter, published, Counter::ConnectionsClosedByPeer.contract(), move |st, obs| {
        observe_connections(&st.series.connections_closed_by_peer, obs)
    });
    u64_counter(meter, published, Counter::Handshakes.contract(), move |st, obs| {
        observe_by_bound(&st.series.handshakes, obs)
    });
    u64_gauge(meter, published, &contract::TCP_CONNECTION_LIMIT, move |st, obs| {
        for limit in st.node.connection_limits.iter() {
            let attrs = match limit.of {
                LimitOf::Server(addr) => vec![
                    KeyValue::new("observer.connection.direction", Direction::Outbound.as_str()),
                    KeyValue::new("server.address", addr.ip().to_string()),
                    KeyValue::new("server.port", i64::from(addr.port())),
                ],
                LimitOf::Listeners(port) => vec![
                    KeyValue::new("observer.connection.direction", Direction::Inbound.as_str()),
                    KeyValue::new("server.port", i64::from(port)),
                ],
            };
            obs.observe(limit.connections, &attrs);
        }
    });
    u64_gauge(meter, published, &contract::TCP_CONNECTION_LIMIT_INFERRED, move |st, obs| {
        for inferred in &st.node.inferred_limits {
            let attrs = [
                KeyValue::new("observer.connection.direction", Direction::Outbound.as_str()),
                KeyValue::new("server.address", inferred.server.addr.to_string()),
                KeyValue::new("server.port", i64::from(inferred.server.port)),
            ];
            obs.observe(inferred.limit, &attrs);
        }
    });
    u64_gauge(meter, published, &contract::TCP_CONNECTION_LIMIT_INFERENCE_UNFOLLOWED, move |st, obs| {
        obs.observe(st.node.servers_unfollowed, &[])
    });
    u64_gauge(meter, published, &contract::TCP_CONNECTION_USAGE, move |st, obs| {
        observe_connections(&st.node.open_connections, obs)
    });
}

/// One value per connection series.
fn observe_connections(
    series: &std::collections::BTreeMap<ConnectionSeries, u64>,
    obs: &dyn opentelemetry::metrics::AsyncInstrument<u64>,
) {
    let mut attrs = Vec::with_capacity(8);
    for (s, value) in series {
        attrs.clear();
        connection_attrs(s, &mut attrs);
        obs.observe(*value, &attrs);
    }
}

/// Counts by duration bucket (`durations`), observed cumulatively: one
/// series per bound, `observer.le`, as a histogram's buckets.
fn observe_by_bound<const M: usize>(
    series: &std::collections::BTreeMap<ConnectionSeries, [u64; M]>,
    obs: &dyn opentelemetry::metrics::AsyncInstrument<u64>,
) {
    let mut attrs = Vec::with_capacity(9);
    for (s, counts) in series {
        for (j, value) in durations::cumulative(counts).into_iter().enumerate() {
            attrs.clear();
            connection_attrs(s, &mut attrs);
            attrs.push(KeyValue::new("observer.le", durations::le(j, M)));
            obs.observe(value, &attrs);
        }
    }
}
