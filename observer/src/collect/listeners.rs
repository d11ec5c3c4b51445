//! Listeners: their owners, and, where no overflow hook is attached (the
//! sweep's mode), their drop counters as per-owner deltas. With a hook, the
//! programs count each overflow as it happens (observer-ebpf's
//! overflow.rs) and the drop counters are not read as counts here: the two
//! never count a drop twice.
//!
//! sock_diag gives each listener's cumulative `sk_drops`. A listener seen in
//! the first scan may have dropped connections before observer started:
//! those are the baseline, not counted. A listener first seen later was
//! created while observer ran, so all its drops are new.
//!
//! A namespace can be missing from a sweep and back in the next (its one
//! known process exited, entering it failed, its `ip netns` handle was
//! unmounted for a while): its listeners are not forgotten then, or their
//! whole `sk_drops` would count again when they reappear. Listeners of a
//! namespace are forgotten when a sweep of that namespace no longer has
//! them, or when the namespace has been missing for `MISSING_FOR`.
//!
//! A listener that closes takes its counter with it: the programs queue
//! its last value at LISTEN -> CLOSE (`ClosedListener`), and `closed`
//! counts what it dropped since the sweep last read it, so a server that
//! overflows and is killed before the next sweep is still counted.
//!
//! The owner is the process that called listen(), recorded by the eBPF
//! side. A listener opened before observer started has no such record; its
//! owner is then found once through /proc (the process holding the socket's
//! inode) and cached for the listener's lifetime.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use observer_common::{Actor, ClosedListener, ListenerKey, listener_drop};

use super::since;
use crate::node::sock_diag::Listener;

/// Drops of one listener since the previous scan, with its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerDrops {
    pub owner: Actor,
    /// The listener's network namespace (inode).
    pub netns: u32,
    pub family: u16,
    pub port: u16,
    pub reason: DropReason,
    pub drops: u64,
}

/// Why a listener turned connections away, as the kernel counts it
/// (observer-common's `listener_drop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The accept queue was full (TcpExtListenOverflows); the only reason
    /// the listeners' drop counters, read by the sweep, stand for.
    Overflow,
    /// The SYN queue was full: a SYN cookie answered the SYN.
    SynCookie,
    /// The SYN queue was full, syncookies off: the SYN was dropped.
    SynDrop,
}

impl DropReason {
    pub fn from_kernel(reason: u32) -> Self {
        match reason {
            listener_drop::SYN_COOKIE => DropReason::SynCookie,
            listener_drop::SYN_DROP => DropReason::SynDrop,
            _ => DropReason::Overflow,
        }
    }
}

/// How long the listeners of a namespace missing from the sweeps are
/// remembered: past that, the namespace is taken to be gone.
pub const MISSING_FOR: Duration = Duration::from_secs(600);

pub struct ListenerTracker {
    /// Whether drops are counted from the counters (the sweep's mode).
    count_drops: bool,
    /// Listeners `closed` settled this round (the sweep may still have
    /// read them, just before they closed).
    closed_now: HashSet<u64>,
    /// Last `sk_drops` per listener and its namespace, by socket cookie
    /// (unique per boot).
    last: HashMap<u64, (u32, u32)>,
    /// Namespaces with listeners that the latest sweeps missed, since when.
    missing: HashMap<u32, Instant>,
    /// Each listener's owner, resolved once when first seen (None: not
    /// found), by cookie.
    owners: HashMap<u64, Option<Actor>>,
    first_scan_done: bool,
}

impl ListenerTracker {
    /// `count_drops`: whether the listeners' drop counters are the counts
    /// (no overflow hook attached).
    pub fn new(count_drops: bool) -> Self {
        Self {
            count_drops,
            closed_now: HashSet::new(),
            last: HashMap::new(),
            missing: HashMap::new(),
            owners: HashMap::new(),
            first_scan_done: false,
        }
    }

    /// Listeners that closed since the last round, with their last drop
    /// count: what each dropped since the sweep last read it (all of it
    /// for one the sweep never read, once the first sweep is done: it was
    /// opened while observer ran). Called before `update`.
    pub fn closed(&mut self, closed: &[ClosedListener]) -> Vec<ListenerDrops> {
        let mut out = Vec::new();
        for c in closed {
            let known = (c.cookie != 0).then(|| self.last.remove(&c.cookie)).flatten();
            let delta = match known {
                Some((_, last)) => since(last as u64, c.drops as u64),
                None if self.first_scan_done => c.drops as u64,
                None => 0,
            };
            let owner = self.owners.remove(&c.cookie).flatten().unwrap_or(c.owner);
            if c.cookie != 0 {
                self.closed_now.insert(c.cookie);
            }
            if delta > 0 && self.count_drops {
                out.push(ListenerDrops {
                    owner,
                    netns: c.listener.netns,
                    family: c.listener.family,
                    port: c.listener.port,
                    reason: DropReason::Overflow,
                    drops: delta,
                });
            }
        }
        out
    }

    /// Resolve the owners of listeners seen for the first time: what the
    /// eBPF side recorded at listen() (`owner_of`), else one /proc scan for
    /// all of them (`owners_by_inode`); then the drops since the last scan.
    /// `swept`: the namespaces this sweep read (`listeners` are theirs).
    pub fn update(
        &mut self,
        now: Instant,
        listeners: &[Listener],
        swept: &HashSet<u32>,
        owner_of: impl Fn(&ListenerKey) -> Option<Actor>,
        owners_by_inode: impl FnOnce(&HashMap<u32, u32>) -> HashMap<u32, Actor>,
    ) -> Vec<ListenerDrops> {
        // Inode -> (namespace, cookie).
        let mut unknown: HashMap<u32, (u32, u64)> = HashMap::new();
        // Listeners that closed after the sweep read them are settled.
        let closed_now = std::mem::take(&mut self.closed_now);
        let listeners: Vec<&Listener> = listeners.iter().filter(|l| !closed_now.contains(&l.cookie)).collect();
        for l in &listeners {
            if self.owners.contains_key(&l.cookie) {
                continue;
            }
            match owner_of(&ListenerKey { netns: l.netns, port: l.port, family: l.family }) {
                Some(owner) => {
                    self.owners.insert(l.cookie, Some(owner));
                }
                None => {
                    unknown.insert(l.inode, (l.netns, l.cookie));
                }
            }
        }
        if !unknown.is_empty() {
            let found = owners_by_inode(&unknown.iter().map(|(inode, (netns, _))| (*inode, *netns)).collect());
            for (inode, (_, cookie)) in unknown {
                self.owners.insert(cookie, found.get(&inode).copied());
            }
        }

        let mut out = Vec::new();
        let mut alive = HashSet::with_capacity(listeners.len());
        for l in &listeners {
            alive.insert(l.cookie);
            let baseline = if self.first_scan_done { 0 } else { l.drops };
            let (_, last) = *self.last.entry(l.cookie).or_insert((l.netns, baseline));
            let delta = since(last as u64, l.drops as u64);
            self.last.insert(l.cookie, (l.netns, l.drops));
            if delta > 0 && self.count_drops {
                let owner = self.owner(l.cookie).unwrap_or_default();
                out.push(ListenerDrops {
                    owner,
                    netns: l.netns,
                    family: l.family,
                    port: l.port,
                    reason: DropReason::Overflow,
                    drops: delta,
                });
            }
        }
        // Forget closed listeners, so the maps stay as big as what exists;
        // those of a namespace this sweep missed stay, for a while.
        let missing = &mut self.missing;
        missing.retain(|netns, _| !swept.contains(netns));
        for (netns, _) in self.last.values() {
            if !swept.contains(netns) {
                missing.entry(*netns).or_insert(now);
            }
        }
        let last = &self.last;
        missing.retain(|netns, since| {
            let gone = now.duration_since(*since) >= MISSING_FOR;
            if gone {
                // Said, since it is a guess: a namespace back after this
                // would count its listeners' whole drops again.
                let listeners = last.values().filter(|(n, _)| n == netns).count();
                tracing::info!(
                    netns = *netns,
                    listeners,
                    "network namespace missing from the sweeps for {MISSING_FOR:?}: taken to be gone, its listeners \
                     forgotten"
                );
            }
            !gone
        });
        self.last.retain(|cookie, (netns, _)| alive.contains(cookie) || missing.contains_key(netns));
        let last = &self.last;
        self.owners.retain(|cookie, _| last.contains_key(cookie));
        self.first_scan_done = true;
        out
    }

    /// Whether the first sweep (the drop counters' baseline) was read.
    pub fn first_scan_done(&self) -> bool {
        self.first_scan_done
    }

    /// The processes that own a listener now.
    pub fn owner_pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.owners.values().flatten().map(|a| a.tgid)
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

    /// Every test listener is in namespace 1, swept each time.
    fn swept() -> HashSet<u32> {
        [1].into()
    }

    fn owner(tgid: u32) -> Actor {
        Actor { tgid, ..Default::default() }
    }

    #[test]
    fn drops_before_start_are_a_baseline() {
        let mut t = ListenerTracker::new(true);
        assert!(
            t.update(Instant::now(), &[listener(1, 5)], &swept(), |_| Some(owner(7)), |_| HashMap::new()).is_empty()
        );
        let d = t.update(Instant::now(), &[listener(1, 8)], &swept(), |_| Some(owner(7)), |_| HashMap::new());
        assert_eq!(
            d,
            vec![ListenerDrops {
                owner: owner(7),
                netns: 1,
                family: 2,
                port: 8080,
                reason: DropReason::Overflow,
                drops: 3
            }]
        );
    }

    #[test]
    fn listener_created_after_start_counts_all_its_drops() {
        let mut t = ListenerTracker::new(true);
        t.update(Instant::now(), &[], &swept(), |_| None, |_| HashMap::new());
        let d = t.update(Instant::now(), &[listener(2, 4)], &swept(), |_| Some(owner(9)), |_| HashMap::new());
        assert_eq!(d[0].drops, 4);
        assert_eq!(d[0].owner.tgid, 9);
    }

    #[test]
    fn unknown_owner_is_tgid_zero_and_closed_listeners_are_forgotten() {
        let mut t = ListenerTracker::new(true);
        t.update(Instant::now(), &[], &swept(), |_| None, |_| HashMap::new());
        let d = t.update(Instant::now(), &[listener(3, 1)], &swept(), |_| None, |_| HashMap::new());
        assert_eq!(d[0].owner.tgid, 0);
        t.update(Instant::now(), &[], &swept(), |_| None, |_| HashMap::new());
        assert!(t.last.is_empty());
    }

    /// A namespace missing from a sweep (entering it failed, its handle
    /// was unmounted) and back in the next: its drops are not counted again.
    #[test]
    fn a_namespace_missing_from_a_sweep_does_not_count_its_drops_twice() {
        let mut t = ListenerTracker::new(true);
        let start = Instant::now();
        t.update(start, &[], &swept(), |_| None, |_| HashMap::new());
        assert_eq!(t.update(start, &[listener(5, 4)], &swept(), |_| Some(owner(9)), |_| HashMap::new())[0].drops, 4);
        // The next sweep misses namespace 1 altogether.
        assert!(t.update(start, &[], &HashSet::new(), |_| None, |_| HashMap::new()).is_empty());
        // Back with 2 more drops: 2, not 6.
        let d = t.update(start, &[listener(5, 6)], &swept(), |_| Some(owner(9)), |_| HashMap::new());
        assert_eq!(d[0].drops, 2);
        // Missing for longer than MISSING_FOR: taken to be gone.
        t.update(start, &[], &HashSet::new(), |_| None, |_| HashMap::new());
        t.update(start + MISSING_FOR, &[], &HashSet::new(), |_| None, |_| HashMap::new());
        assert!(t.last.is_empty() && t.missing.is_empty());
    }

    fn closing(cookie: u64, drops: u32, owner_tgid: u32) -> ClosedListener {
        ClosedListener {
            cookie,
            listener: ListenerKey { netns: 1, port: 8080, family: 2 },
            drops,
            _pad: 0,
            owner: owner(owner_tgid),
        }
    }

    /// A listener that overflows and closes between two sweeps: its last
    /// drops count once, to its owner, and the sweep that read it just
    /// before it closed does not count them again.
    #[test]
    fn a_closed_listener_counts_its_drops_since_the_last_sweep_once() {
        let mut t = ListenerTracker::new(true);
        t.update(Instant::now(), &[], &swept(), |_| None, |_| HashMap::new());
        assert_eq!(
            t.update(Instant::now(), &[listener(6, 2)], &swept(), |_| Some(owner(9)), |_| HashMap::new())[0].drops,
            2
        );
        // 5 more, then it closes; this round's sweep read it at 4.
        let d = t.closed(&[closing(6, 7, 9)]);
        assert_eq!(
            d,
            vec![ListenerDrops {
                owner: owner(9),
                netns: 1,
                family: 2,
                port: 8080,
                reason: DropReason::Overflow,
                drops: 5
            }]
        );
        assert!(
            t.update(Instant::now(), &[listener(6, 4)], &swept(), |_| Some(owner(9)), |_| HashMap::new()).is_empty()
        );
        assert!(t.last.is_empty() && t.owners.is_empty());
        // One the sweep never read: all its drops, to the owner the
        // programs recorded; one without a cookie too.
        assert_eq!(t.closed(&[closing(8, 3, 11)])[0].drops, 3);
        assert_eq!(t.closed(&[closing(0, 4, 12)])[0].owner.tgid, 12);
    }

    /// With an overflow hook the programs count: the counters are not.
    #[test]
    fn with_an_overflow_hook_drop_counters_are_not_counts() {
        let mut t = ListenerTracker::new(false);
        t.update(Instant::now(), &[], &swept(), |_| None, |_| HashMap::new());
        assert!(
            t.update(Instant::now(), &[listener(6, 2)], &swept(), |_| Some(owner(9)), |_| HashMap::new()).is_empty()
        );
        assert!(t.closed(&[closing(6, 7, 9)]).is_empty());
        assert_eq!(t.owner(6), None, "a closed listener is forgotten");
    }

    #[test]
    fn owner_found_by_inode_is_looked_up_once_and_cached() {
        let mut t = ListenerTracker::new(true);
        t.update(Instant::now(), &[], &swept(), |_| None, |_| HashMap::new());
        let lookups = std::cell::Cell::new(0);
        let by_inode = |inodes: &HashMap<u32, u32>| {
            lookups.set(lookups.get() + 1);
            inodes.keys().filter(|i| **i == 104).map(|i| (*i, owner(42))).collect()
        };
        assert_eq!(t.update(Instant::now(), &[listener(4, 1)], &swept(), |_| None, by_inode)[0].owner.tgid, 42);
        assert_eq!(t.update(Instant::now(), &[listener(4, 3)], &swept(), |_| None, by_inode)[0].owner.tgid, 42);
        assert_eq!(lookups.get(), 1);
        assert_eq!(t.owner(4).map(|a| a.tgid), Some(42));
    }
}
