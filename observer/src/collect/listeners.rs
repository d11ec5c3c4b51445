//! Listener drop counters -> per-owner deltas.
//!
//! sock_diag gives each listener's cumulative `sk_drops`. A listener seen in
//! the first scan may have dropped connections before observer started:
//! those are the baseline, not counted. A listener first seen later was
//! created while observer ran, so all its drops are new.
//!
//! The owner is the process that called listen(), recorded by the eBPF
//! side. A listener opened before observer started has no such record; its
//! owner is then found once through /proc (the process holding the socket's
//! inode) and cached for the listener's lifetime.
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
    /// Owners found through /proc, by cookie.
    found_owners: HashMap<u64, Actor>,
    first_scan_done: bool,
}

impl ListenerTracker {
    pub fn update(
        &mut self,
        listeners: &[Listener],
        owner_of: impl Fn(&ListenerKey) -> Option<Actor>,
        owner_by_inode: impl Fn(u32) -> Option<Actor>,
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
            let owner = owner_of(&key)
                .or_else(|| self.found_owners.get(&l.cookie).copied())
                .or_else(|| {
                    let found = owner_by_inode(l.inode)?;
                    self.found_owners.insert(l.cookie, found);
                    Some(found)
                })
                .unwrap_or_default();
            out.push(ListenerDrops { owner, family: l.family, port: l.port, drops: delta });
        }
        // Forget closed listeners so the map stays as big as what exists.
        self.last.retain(|cookie, _| alive.contains(cookie));
        self.found_owners.retain(|cookie, _| alive.contains(cookie));
        self.first_scan_done = true;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(cookie: u64, drops: u32) -> Listener {
        Listener { netns: 1, family: 2, port: 8080, cookie, inode: 100 + cookie as u32, drops, queued: 0, backlog: 1 }
    }

    fn owner(tgid: u32) -> Actor {
        Actor { tgid, ..Default::default() }
    }

    #[test]
    fn drops_before_start_are_a_baseline() {
        let mut t = ListenerTracker::default();
        assert!(t.update(&[listener(1, 5)], |_| Some(owner(7)), |_| None).is_empty());
        let d = t.update(&[listener(1, 8)], |_| Some(owner(7)), |_| None);
        assert_eq!(d, vec![ListenerDrops { owner: owner(7), family: 2, port: 8080, drops: 3 }]);
    }

    #[test]
    fn listener_created_after_start_counts_all_its_drops() {
        let mut t = ListenerTracker::default();
        t.update(&[], |_| None, |_| None);
        let d = t.update(&[listener(2, 4)], |_| Some(owner(9)), |_| None);
        assert_eq!(d[0].drops, 4);
        assert_eq!(d[0].owner.tgid, 9);
    }

    #[test]
    fn unknown_owner_is_tgid_zero_and_closed_listeners_are_forgotten() {
        let mut t = ListenerTracker::default();
        t.update(&[], |_| None, |_| None);
        let d = t.update(&[listener(3, 1)], |_| None, |_| None);
        assert_eq!(d[0].owner.tgid, 0);
        t.update(&[], |_| None, |_| None);
        assert!(t.last.is_empty());
    }

    #[test]
    fn owner_found_by_inode_is_looked_up_once_and_cached() {
        let mut t = ListenerTracker::default();
        t.update(&[], |_| None, |_| None);
        let lookups = std::cell::Cell::new(0);
        let by_inode = |inode: u32| {
            lookups.set(lookups.get() + 1);
            (inode == 104).then(|| owner(42))
        };
        assert_eq!(t.update(&[listener(4, 1)], |_| None, by_inode)[0].owner.tgid, 42);
        assert_eq!(t.update(&[listener(4, 3)], |_| None, by_inode)[0].owner.tgid, 42);
        assert_eq!(lookups.get(), 1);
    }
}
