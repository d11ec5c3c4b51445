//! Time to port exhaustion: how long, at the rate ports toward a
//! destination were taken over the last minute, until none is left.
//!
//! The rate is the growth from the oldest sample of the window to now, so
//! a burst in the window counts fully and a steady climb gives its slope;
//! a destination whose use is flat or falling gets no estimate (it is not
//! heading for exhaustion), one at its limit gets 0.
use std::{
    collections::{BTreeMap, VecDeque},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use super::NodeReading;

/// How far back the rate looks.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Destinations per namespace that are followed over time and exported:
/// the closest to exhaustion (the sweep sorts them by use).
pub const TOP_DESTINATIONS: usize = 20;

type Key = (u32, IpAddr, SocketAddr);

/// Recent use of the destinations each sweep reports (the most used of
/// each namespace; others are forgotten, which bounds the memory).
#[derive(Default)]
pub struct PortTrend {
    samples: BTreeMap<Key, VecDeque<(Instant, u32)>>,
}

impl PortTrend {
    /// Keep the `TOP_DESTINATIONS` of each namespace of this sweep (read at
    /// `now`), record them as of when they held (a namespace waiting for
    /// its next dump repeats its last counts: not a new sample) and set their
    /// `exhaustion_seconds`.
    pub fn update(&mut self, now: Instant, sweep: &mut NodeReading) {
        let mut seen = BTreeMap::new();
        for netns in &mut sweep.namespaces {
            let Some(usage) = &mut netns.usage else { continue };
            let limit = usage.settings.ephemeral_ports();
            let Some(counts) = &mut usage.counts else { continue };
            let as_of = counts.as_of.unwrap_or(now);
            counts.destinations.truncate(TOP_DESTINATIONS);
            for d in &mut counts.destinations {
                let key = (netns.inode, d.source, d.destination);
                let mut samples = self.samples.remove(&key).unwrap_or_default();
                while samples.front().is_some_and(|(at, _)| now.duration_since(*at) > WINDOW) {
                    samples.pop_front();
                }
                if samples.back().is_none_or(|(at, _)| *at < as_of) {
                    samples.push_back((as_of, d.used));
                }
                d.exhaustion_seconds = estimate(&samples, limit);
                seen.insert(key, samples);
            }
        }
        self.samples = seen;
    }
}

/// Seconds until `limit` at the rate from the oldest sample to the newest.
fn estimate(samples: &VecDeque<(Instant, u32)>, limit: u32) -> Option<f64> {
    let (&(last_at, used), &(first_at, first)) = (samples.back()?, samples.front()?);
    if used >= limit {
        return Some(0.0);
    }
    let elapsed = last_at.duration_since(first_at).as_secs_f64();
    if used <= first || elapsed <= 0.0 {
        return None;
    }
    let per_second = f64::from(used - first) / elapsed;
    Some(f64::from(limit - used) / per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, secs: u64, used: u32) -> (Instant, u32) {
        (start + Duration::from_secs(secs), used)
    }

    #[test]
    fn a_steady_climb_gives_the_remaining_ports_over_its_rate() {
        let t = Instant::now();
        // 10 ports a second, 600 of 1000 used: 40 s left.
        let samples = VecDeque::from([at(t, 0, 500), at(t, 5, 550), at(t, 10, 600)]);
        assert_eq!(estimate(&samples, 1000), Some(40.0));
    }

    /// A reading of one namespace whose one destination holds `used` of
    /// 1,000 ports, as of `as_of`.
    fn reading(used: u32, as_of: Instant) -> NodeReading {
        use super::super::{NetnsReading, NetnsUsage, settings::NetSettings, usage};
        let settings = NetSettings::with_range((40000, 40999), 100_000);
        let destinations = vec![usage::Destination::held(used)];
        let counts = usage::SocketCounts { destinations, time_wait: 0, as_of: Some(as_of), established: 0 };
        NodeReading {
            namespaces: vec![NetnsReading {
                inode: 1,
                name: "1".into(),
                pid: None,
                listeners: vec![],
                usage: Some(NetnsUsage {
                    settings,
                    port_holders: u64::from(used),
                    minisockets: 0,
                    counts: Some(counts),
                    conntrack: None,
                }),
                time_wait_entered: None,
                listen_overflows: None,
                quiet_established: None,
            }],
            counts: Default::default(),
            on_node: Default::default(),
        }
    }

    fn estimate_of(reading: &NodeReading) -> Option<f64> {
        reading.namespaces[0].usage.as_ref()?.counts.as_ref()?.destinations[0].exhaustion_seconds
    }

    #[test]
    fn counts_repeated_while_a_namespace_waits_for_its_dump_keep_the_time_they_were_taken() {
        let t = Instant::now();
        let mut trend = PortTrend::default();
        let mut update = |secs: u64, used: u32, as_of: u64| {
            let mut r = reading(used, t + Duration::from_secs(as_of));
            trend.update(t + Duration::from_secs(secs), &mut r);
            estimate_of(&r)
        };
        update(0, 500, 0);
        // 10 ports a second: 400 left at 600, 40 s.
        assert_eq!(update(10, 600, 10), Some(40.0));
        // The next rounds repeat the dump of 10 s: still 10 a second, not
        // a flat use (which would say no exhaustion is coming).
        assert_eq!(update(11, 600, 10), Some(40.0));
        assert_eq!(update(14, 600, 10), Some(40.0));
        // Its next dump: 50 more in 5 s.
        assert_eq!(update(15, 650, 15), Some(35.0));
    }

    #[test]
    fn flat_or_falling_use_has_no_estimate_and_a_full_range_has_none_left() {
        let t = Instant::now();
        assert_eq!(estimate(&VecDeque::from([at(t, 0, 500), at(t, 10, 500)]), 1000), None);
        assert_eq!(estimate(&VecDeque::from([at(t, 0, 600), at(t, 10, 500)]), 1000), None);
        assert_eq!(estimate(&VecDeque::from([at(t, 0, 600)]), 1000), None);
        assert_eq!(estimate(&VecDeque::from([at(t, 0, 900), at(t, 10, 1000)]), 1000), Some(0.0));
    }
}
