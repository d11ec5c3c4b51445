//! A server's connection limit nobody declared, inferred from this node's
//! view of it (the first incident: a database that accepted 10,000
//! connections and closed every further one at once; nobody knew).
//!
//! The shape, toward one server over the last `WINDOW`: the connections
//! open toward it stay flat at N (the median of the rounds', most of them
//! near it); new ones keep being established, and
//! nearly every one that ends is closed by the server (its FIN first)
//! within milliseconds. What tells a limit from a healthy server that
//! closes each connection after its response (HTTP/1.0, `Connection:
//! close`), which has the same short, server-closed lifetimes, is who the
//! N open connections are: by Little's law, connections that live a few
//! milliseconds at the rate they come keep only `rate x lifetime` of them
//! open; N far above that are other, long-held connections, and the new
//! ones are turned away beside them.
//!
//! Node-wide per server address and port (every process and namespace of
//! this node; the fleet's sum is a PromQL away, as for declared limits).
use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    time::{Duration, Instant},
};

use observer_common::{AF_INET6, ConnectionCounts, ConnectionKey, buffers, direction};

/// How far back the shape is judged: long enough for a few dozen new
/// connections at a modest retry rate, short enough to follow a limit
/// raised or a pool shrunk within the minute.
pub const WINDOW: Duration = Duration::from_secs(15);

/// At least this many ends within the window, for a share to mean something.
pub const MIN_ENDS: u64 = 10;

/// Of the ends within the window, at least this share closed by the server,
/// and this share within `QUICK_BUCKETS`.
pub const SERVER_CLOSED_SHARE: f64 = 0.9;

/// "At once": the lifetime buckets up to 16 ms (log2 ms: 0..=4).
pub const QUICK_BUCKETS: usize = 5;
const QUICK_SECONDS: f64 = 0.016;

/// Of the window's rounds, at least this share must find the open count
/// within 2% (or 1) of its median.
pub const FLAT_SHARE: f64 = 0.8;

/// The open connections must be this many times what the quick ones alone
/// would keep open (`rate x 16 ms`): held connections, not the churn.
pub const HELD_FACTOR: f64 = 10.0;

/// Servers followed at once: a client meeting ever-new servers (each with
/// connections established) cannot grow this past it; further ones wait
/// until one is idle for `WINDOW`.
pub const MAX_SERVERS: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Server {
    pub addr: IpAddr,
    pub port: u16,
}

/// A limit inferred: the connections the server holds open before it turns
/// new ones away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InferredLimit {
    pub server: Server,
    pub limit: u64,
}

/// One round's view of one server.
#[derive(Clone, Copy, Default)]
struct Sample {
    open: u64,
    established: u64,
    ends: u64,
    by_server: u64,
    quick: u64,
}

#[derive(Default)]
pub struct LimitInference {
    servers: HashMap<Server, VecDeque<(Instant, Sample)>>,
    /// Servers left unfollowed because `MAX_SERVERS` were (logged once).
    skipped_reported: bool,
    /// Servers with connections in the last round that were left
    /// unfollowed (`unfollowed`).
    unfollowed: usize,
}

fn server_of(key: &ConnectionKey) -> Option<Server> {
    if key.direction != direction::OUTBOUND || key.addr == buffers::FOLDED_DADDR {
        return None;
    }
    let addr = if key.family == AF_INET6 {
        IpAddr::from(key.addr)
    } else {
        IpAddr::from([key.addr[0], key.addr[1], key.addr[2], key.addr[3]])
    };
    Some(Server { addr, port: key.port })
}

impl LimitInference {
    /// Take one round: the interval's counts per connection key and the
    /// connections open now (the ledger's); the limits inferred now.
    pub fn update(
        &mut self,
        now: Instant,
        counts: &[(ConnectionKey, ConnectionCounts)],
        open: &[(ConnectionKey, u64)],
    ) -> Vec<InferredLimit> {
        let mut round: HashMap<Server, Sample> = HashMap::new();
        for (key, n) in open {
            if let Some(server) = server_of(key) {
                round.entry(server).or_default().open += n;
            }
        }
        for (key, c) in counts {
            let Some(server) = server_of(key) else { continue };
            let sample = round.entry(server).or_default();
            sample.established += c.established;
            sample.ends += c.closed.iter().sum::<u64>() + c.closed_older;
            sample.by_server += c.closed_by_peer;
            sample.quick += c.closed[..QUICK_BUCKETS].iter().sum::<u64>();
        }
        // A server whose samples are all older than the window is forgotten
        // first, making room for the round's new ones.
        self.servers.retain(|_, samples| {
            while samples.front().is_some_and(|(at, _)| now.duration_since(*at) > WINDOW) {
                samples.pop_front();
            }
            !samples.is_empty()
        });
        self.unfollowed = 0;
        for (server, sample) in round {
            if !self.servers.contains_key(&server) && self.servers.len() >= MAX_SERVERS {
                self.unfollowed += 1;
                if !self.skipped_reported {
                    self.skipped_reported = true;
                    tracing::warn!(
                        "connections toward more than {MAX_SERVERS} servers at once: the further ones are not \
                         judged for a server-side connection limit until others are idle for {}s \
                         (observer_tcp_connection_limit_inference_unfollowed counts them each round)",
                        WINDOW.as_secs()
                    );
                }
                continue;
            }
            self.servers.entry(server).or_default().push_back((now, sample));
        }
        let mut limits: Vec<InferredLimit> =
            self.servers.iter().filter_map(|(server, samples)| judge(*server, samples, now)).collect();
        limits.sort_by_key(|l| l.server);
        limits
    }

    /// Servers with connections in the last round that were not judged,
    /// `MAX_SERVERS` being followed already: what the bound costs, as a
    /// number (exported; the log says it once).
    pub fn unfollowed(&self) -> usize {
        self.unfollowed
    }
}

/// The limit `samples` (one server's, within the window) show, if any.
fn judge(server: Server, samples: &VecDeque<(Instant, Sample)>, now: Instant) -> Option<InferredLimit> {
    // Judged only over a full window: a shape seen for a moment is not one.
    let (first, _) = samples.front()?;
    if now.duration_since(*first) < WINDOW.mul_f64(0.9) {
        return None;
    }
    let sum = |f: fn(&Sample) -> u64| samples.iter().map(|(_, s)| f(s)).sum::<u64>();
    let (established, ends, by_server, quick) =
        (sum(|s| s.established), sum(|s| s.ends), sum(|s| s.by_server), sum(|s| s.quick));
    // The count held: the median of the rounds' (a round may catch a
    // turned-away connection between its handshake and its close, or the
    // last of the pool's growth at the window's start).
    let mut open: Vec<u64> = samples.iter().map(|(_, s)| s.open).collect();
    open.sort_unstable();
    let held = open[open.len() / 2];
    let tolerance = (held / 50).max(1);
    let near = open.iter().filter(|o| o.abs_diff(held) <= tolerance).count();
    let shaped = ends >= MIN_ENDS
        && by_server as f64 >= SERVER_CLOSED_SHARE * ends as f64
        && quick as f64 >= SERVER_CLOSED_SHARE * ends as f64
        // Flat: the open ones are not growing toward the limit any more
        // (nor shrinking away from it) in nearly every round.
        && near as f64 >= FLAT_SHARE * open.len() as f64;
    let churn_open = established as f64 / WINDOW.as_secs_f64() * QUICK_SECONDS;
    (shaped && held > 0 && held as f64 >= HELD_FACTOR * churn_open).then_some(InferredLimit { server, limit: held })
}

#[cfg(test)]
mod tests {
    use observer_common::{AF_INET, ConnectionCounts, ConnectionKey, direction};

    use super::*;

    fn key(pid: u32) -> ConnectionKey {
        let mut key =
            ConnectionKey { family: AF_INET, port: 27017, direction: direction::OUTBOUND, ..Default::default() };
        key.addr[..4].copy_from_slice(&[10, 0, 0, 5]);
        key.actor.tgid = pid;
        key
    }

    /// `rounds` one-second rounds of: `open` held, `new` established a
    /// round, each closed within a few ms, `by_server` of them by the
    /// server; the limits inferred after each.
    fn run(rounds: u64, open: u64, new: u64, by_server: u64, quick: bool) -> Vec<Vec<InferredLimit>> {
        let mut inference = LimitInference::default();
        let start = Instant::now();
        (0..rounds)
            .map(|r| {
                let mut counts = ConnectionCounts { established: new, closed_by_peer: by_server, ..Default::default() };
                counts.closed[if quick { 2 } else { 12 }] = new;
                let at = start + Duration::from_secs(r);
                inference.update(at, &[(key(1), counts)], &[(key(1), open), (key(2), 0)])
            })
            .collect()
    }

    #[test]
    fn a_server_turning_new_connections_away_at_a_flat_count_is_a_limit() {
        let rounds = run(20, 40, 16, 16, true);
        assert!(rounds[..13].iter().all(Vec::is_empty), "not before a full window");
        let server = Server { addr: "10.0.0.5".parse().unwrap(), port: 27017 };
        assert_eq!(rounds[19], [InferredLimit { server, limit: 40 }]);
    }

    #[test]
    fn healthy_servers_are_not_taken_for_limits() {
        // The clients close their short requests themselves.
        assert!(run(20, 40, 16, 0, true).iter().all(Vec::is_empty));
        // The server closes idle pooled connections after a while.
        assert!(run(20, 40, 16, 16, false).iter().all(Vec::is_empty));
        // The server closes each after its response (HTTP/1.0): 5,000 a
        // second, 10 open at a time, all of them the short ones.
        assert!(run(20, 10, 5000, 5000, true).iter().all(Vec::is_empty));
        // Too few ends to judge.
        assert!(run(20, 40, 0, 0, true).iter().all(Vec::is_empty));
    }

    #[test]
    fn servers_beyond_those_followed_are_counted_each_round_until_others_go_idle() {
        let mut inference = LimitInference::default();
        let start = Instant::now();
        let toward = |server: usize| {
            let mut key = key(1);
            key.port = 1000 + server as u16;
            (key, 1)
        };
        let many: Vec<(ConnectionKey, u64)> = (0..MAX_SERVERS + 3).map(toward).collect();
        inference.update(start, &[], &many[..MAX_SERVERS]);
        assert_eq!(inference.unfollowed(), 0);
        inference.update(start + Duration::from_secs(1), &[], &many);
        assert_eq!(inference.unfollowed(), 3);
        // The first ones idle for the window since their last round: the
        // 3 taken on in the round that forgets them.
        let later = start + Duration::from_secs(1) + WINDOW + Duration::from_secs(1);
        inference.update(later, &[], &many[MAX_SERVERS..]);
        assert_eq!(inference.unfollowed(), 0);
    }

    #[test]
    fn the_metrics_description_states_the_bound_and_the_window() {
        let description = crate::export::contract::TCP_CONNECTION_LIMIT_INFERENCE_UNFOLLOWED.description;
        assert!(description.contains(&format!("follows {MAX_SERVERS} at once")), "{description}");
        assert!(description.contains(&format!("idle for {} s", WINDOW.as_secs())), "{description}");
    }

    #[test]
    fn a_count_still_growing_is_not_a_ceiling() {
        let mut inference = LimitInference::default();
        let start = Instant::now();
        for r in 0..20u64 {
            let mut counts = ConnectionCounts { established: 10, closed_by_peer: 10, ..Default::default() };
            counts.closed[2] = 10;
            let limits = inference.update(start + Duration::from_secs(r), &[(key(1), counts)], &[(key(1), 10 * r)]);
            assert!(limits.is_empty());
        }
    }
}
