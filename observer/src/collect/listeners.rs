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

use super::since;
use crate::node::sock_diag::Listener;

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
    /// Each listener's owner, resolved once when first seen (None: not
    /// found), by cookie.
    owners: HashMap<u64, Option<Actor>>,
    first_scan_done: bool,
}

impl ListenerTracker {
    /// Resolve the owners of listeners seen for the first time: what the
    /// eBPF side recorded at listen() (`owner_of`), else one /proc scan for
    /// all of them (`owners_by_inode`); then the drops since the last scan.
    pub fn update(
        &mut self,
        listeners: &[Listener],
        owner_of: impl Fn(&ListenerKey) -> Option<Actor>,
        owners_by_inode: impl FnOnce(&HashSet<u32>) -> HashMap<u32, Actor>,
    ) -> Vec<ListenerDrops> {
        let mut unknown: HashMap<u32, u64> = HashMap::new();
        for l in listeners {
            if self.owners.contains_key(&l.cookie) {
                continue;
            }
            match owner_of(&ListenerKey { netns: l.netns, port: l.port, family: l.family }) {
                Some(owner) => {
                    self.owners.insert(l.cookie, Some(owner));
                }
                None => {
                    unknown.insert(l.inode, l.cookie);
                }
            }
        }
        if !unknown.is_empty() {
            let found = owners_by_inode(&unknown.keys().copied().collect());
            for (inode, cookie) in unknown {
                self.owners.insert(cookie, found.get(&inode).copied());
            }
        }

        let mut out = Vec::new();
        let mut alive = HashSet::with_capacity(listeners.len());
        for l in listeners {
            alive.insert(l.cookie);
            let baseline = if self.first_scan_done { 0 } else { l.drops };
            let last = *self.last.entry(l.cookie).or_insert(baseline);
            let delta = since(last as u64, l.drops as u64);
            self.last.insert(l.cookie, l.drops);
            if delta > 0 {
                let owner = self.owner(l.cookie).unwrap_or_default();
                out.push(ListenerDrops { owner, family: l.family, port: l.port, drops: delta });
            }
        }
        // Forget closed listeners so the maps stay as big as what exists.
        self.last.retain(|cookie, _| alive.contains(cookie));
        self.owners.retain(|cookie, _| alive.contains(cookie));
        self.first_scan_done = true;
        out
    }

    /// The owner of the listener with this cookie, if known.
    pub fn owner(&self, cookie: u64) -> Option<Actor> {
        self.owners.get(&cookie).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(cookie: u64, drops: u32) -> Listener {
        Listener {
            netns: 1,
            family: 2,
            address: "0.0.0.0".parse().unwrap(),
            port: 8080,
            cookie,
            inode: 100 + cookie as u32,
            drops,
            queued: 0,
            backlog: 1,
        }
    }

    fn owner(tgid: u32) -> Actor {
        Actor { tgid, ..Default::default() }
    }

    #[test]
    fn drops_before_start_are_a_baseline() {
        let mut t = ListenerTracker::default();
        assert!(t.update(&[listener(1, 5)], |_| Some(owner(7)), |_| HashMap::new()).is_empty());
        let d = t.update(&[listener(1, 8)], |_| Some(owner(7)), |_| HashMap::new());
        assert_eq!(d, vec![ListenerDrops { owner: owner(7), family: 2, port: 8080, drops: 3 }]);
    }

    #[test]
    fn listener_created_after_start_counts_all_its_drops() {
        let mut t = ListenerTracker::default();
        t.update(&[], |_| None, |_| HashMap::new());
        let d = t.update(&[listener(2, 4)], |_| Some(owner(9)), |_| HashMap::new());
        assert_eq!(d[0].drops, 4);
        assert_eq!(d[0].owner.tgid, 9);
    }

    #[test]
    fn unknown_owner_is_tgid_zero_and_closed_listeners_are_forgotten() {
        let mut t = ListenerTracker::default();
        t.update(&[], |_| None, |_| HashMap::new());
        let d = t.update(&[listener(3, 1)], |_| None, |_| HashMap::new());
        assert_eq!(d[0].owner.tgid, 0);
        t.update(&[], |_| None, |_| HashMap::new());
        assert!(t.last.is_empty());
    }

    #[test]
    fn owner_found_by_inode_is_looked_up_once_and_cached() {
        let mut t = ListenerTracker::default();
        t.update(&[], |_| None, |_| HashMap::new());
        let lookups = std::cell::Cell::new(0);
        let by_inode = |inodes: &HashSet<u32>| {
            lookups.set(lookups.get() + 1);
            inodes.iter().filter(|i| **i == 104).map(|i| (*i, owner(42))).collect()
        };
        assert_eq!(t.update(&[listener(4, 1)], |_| None, by_inode)[0].owner.tgid, 42);
        assert_eq!(t.update(&[listener(4, 3)], |_| None, by_inode)[0].owner.tgid, 42);
        assert_eq!(lookups.get(), 1);
        assert_eq!(t.owner(4).map(|a| a.tgid), Some(42));
    }
}
