//! Listener drop counters -> per-owner deltas.
//!
//! sock_diag gives each listener's cumulative `sk_drops`. A listener seen in
//! the first scan may have dropped connections before observer started:
//! those are the baseline, not counted. A listener first seen later was
//! created while observer ran, so all its drops are new.
use std::collections::{HashMap, HashSet};

use observer_common::{Actor, ListenerKey};

use super::{since, sock_diag::Listener};

/// Drops of one listener since the previous scan, with its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerDrops {
    pub owner: Actor,
    pub family: u16,
    pub port: u16,
    pub drops: u64,
}

#[derive(Default)]
pub struct ListenerTracker {
    /// Last `sk_drops` per listener, by socket cookie (unique per boot).
    last: HashMap<u64, u32>,
    first_scan_done: bool,
}

impl ListenerTracker {
    pub fn update(
        &mut self,
        listeners: &[Listener],
        owner_of: impl Fn(&ListenerKey) -> Option<Actor>,
    ) -> Vec<ListenerDrops> {
        let mut out = Vec::new();
        let mut alive = HashSet::with_capacity(listeners.len());
        for l in listeners {
            alive.insert(l.cookie);
            let baseline = if self.first_scan_done { 0 } else { l.drops };
            let last = *self.last.entry(l.cookie).or_insert(baseline);
            let delta = since(last as u64, l.drops as u64);
            self.last.insert(l.cookie, l.drops);
            if delta == 0 {
                continue;
            }
            let key = ListenerKey { netns: l.netns, port: l.port, family: l.family };
            out.push(ListenerDrops {
                owner: owner_of(&key).unwrap_or_default(),
                family: l.family,
                port: l.port,
                drops: delta,
            });
        }
        // Forget closed listeners so the map stays as big as what exists.
        self.last.retain(|cookie, _| alive.contains(cookie));
        self.first_scan_done = true;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(cookie: u64, drops: u32) -> Listener {
        Listener { netns: 1, family: 2, port: 8080, cookie, drops, queued: 0, backlog: 1 }
    }

    fn owner(tgid: u32) -> Actor {
        Actor { tgid, ..Default::default() }
    }

    #[test]
    fn drops_before_start_are_a_baseline() {
        let mut t = ListenerTracker::default();
        assert!(t.update(&[listener(1, 5)], |_| Some(owner(7))).is_empty());
        let d = t.update(&[listener(1, 8)], |_| Some(owner(7)));
        assert_eq!(d, vec![ListenerDrops { owner: owner(7), family: 2, port: 8080, drops: 3 }]);
    }

    #[test]
    fn listener_created_after_start_counts_all_its_drops() {
        let mut t = ListenerTracker::default();
        t.update(&[], |_| None);
        let d = t.update(&[listener(2, 4)], |_| Some(owner(9)));
        assert_eq!(d[0].drops, 4);
        assert_eq!(d[0].owner.tgid, 9);
    }

    #[test]
    fn unknown_owner_is_tgid_zero_and_closed_listeners_are_forgotten() {
        let mut t = ListenerTracker::default();
        t.update(&[], |_| None);
        let d = t.update(&[listener(3, 1)], |_| None);
        assert_eq!(d[0].owner.tgid, 0);
        t.update(&[], |_| None);
        assert!(t.last.is_empty());
    }
}
