//! The connections open now: per kernel key (owner, direction, far end),
//! the connections the programs saw reach ESTABLISHED less those they saw
//! leave it, summed over every interval since the programs were attached.
//! The kernel counts an end only for a connection whose start it counted
//! (connections.rs in the eBPF crate), under the same key, and a start is
//! read no later than its end (a later buffer, or the same): so no count
//! goes below zero, and each key leaves the ledger when its last
//! connection ends. The connections established before observer started
//! are its opening balance (`probes::older` entered them in the kernel's
//! map, so their ends count too, in `closed_older`).
use std::collections::HashMap;

use observer_common::{ConnectionCounts, ConnectionKey};

#[derive(Default)]
pub struct OpenConnections {
    open: HashMap<ConnectionKey, u64>,
    /// Ends without a start (none expected; kept for the debug log).
    unmatched: u64,
}

impl OpenConnections {
    /// A ledger that starts with `older` open (per key).
    pub fn opening(older: &[(ConnectionKey, u64)]) -> Self {
        let mut ledger = Self::default();
        for (key, n) in older.iter().filter(|(_, n)| *n > 0) {
            *ledger.open.entry(*key).or_default() += n;
        }
        ledger
    }

    /// Add one interval's counts.
    pub fn update(&mut self, interval: &[(ConnectionKey, ConnectionCounts)]) {
        for (key, counts) in interval {
            let closed: u64 = counts.closed.iter().sum::<u64>() + counts.closed_older;
            let open = self.open.entry(*key).or_default();
            let now = (*open + counts.established).checked_sub(closed);
            match now {
                Some(0) => {
                    self.open.remove(key);
                }
                Some(n) => *open = n,
                None => {
                    self.unmatched += closed - (*open + counts.established);
                    tracing::debug!(?key, unmatched = self.unmatched, "connection ends without a start");
                    self.open.remove(key);
                }
            }
        }
    }

    /// Every key with connections open, and how many.
    pub fn iter(&self) -> impl Iterator<Item = (&ConnectionKey, u64)> {
        self.open.iter().map(|(k, n)| (k, *n))
    }

    /// The connections followed now per network namespace (the sockets'
    /// own).
    pub fn by_netns(&self) -> HashMap<u32, u64> {
        let mut by_netns = HashMap::new();
        for (key, n) in &self.open {
            *by_netns.entry(key.netns).or_default() += n;
        }
        by_netns
    }

    /// The connections followed now (the entries of `OPEN_CONNECTIONS`).
    pub fn total(&self) -> u64 {
        self.open.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{Actor, lifetime};

    use super::*;

    fn key(tgid: u32) -> ConnectionKey {
        ConnectionKey { actor: Actor { tgid, ..Default::default() }, port: 5432, family: 2, ..Default::default() }
    }

    fn counts(established: u64, closed_in: &[(usize, u64)]) -> ConnectionCounts {
        let mut closed = [0; lifetime::BUCKETS];
        for &(bucket, n) in closed_in {
            closed[bucket] = n;
        }
        ConnectionCounts { established, closed, ..Default::default() }
    }

    #[test]
    fn open_is_established_less_closed_across_intervals() {
        let mut ledger = OpenConnections::default();
        ledger.update(&[(key(1), counts(800, &[])), (key(2), counts(3, &[(0, 3)]))]);
        assert_eq!(ledger.iter().collect::<Vec<_>>(), [(&key(1), 800)], "a key whose connections all ended leaves");
        ledger.update(&[(key(1), counts(11_200, &[(4, 100), (21, 50)]))]);
        assert_eq!(ledger.total(), 800 + 11_200 - 150);
        ledger.update(&[(key(1), counts(0, &[(7, 11_850)]))]);
        assert_eq!(ledger.total(), 0);
        assert_eq!(ledger.unmatched, 0);
    }

    #[test]
    fn connections_older_than_observer_open_the_ledger_and_their_ends_close_it() {
        let mut ledger = OpenConnections::opening(&[(key(1), 800), (key(2), 0)]);
        assert_eq!(ledger.iter().collect::<Vec<_>>(), [(&key(1), 800)], "a key with none open is not kept");
        // 100 new ones, 30 of the new ended (timed), 500 of the older.
        let mut interval = counts(100, &[(3, 30)]);
        interval.closed_older = 500;
        ledger.update(&[(key(1), interval)]);
        assert_eq!(ledger.total(), 800 + 100 - 30 - 500);
        assert_eq!(ledger.unmatched, 0);
    }

    #[test]
    fn an_end_without_a_start_never_goes_below_zero() {
        let mut ledger = OpenConnections::default();
        ledger.update(&[(key(1), counts(1, &[(0, 3)]))]);
        assert_eq!(ledger.total(), 0);
        assert_eq!(ledger.unmatched, 2);
    }
}
