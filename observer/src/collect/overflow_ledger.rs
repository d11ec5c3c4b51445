//! The sweep's mode (no overflow hook): listener drops -> overflows.
//!
//! A listener's drop counter is not the kernel's count of overflows: an
//! overflowed last ACK adds 2 to it (tcp_listendrop, then the dropped
//! packet), and a SYN dropped for a full SYN queue with syncookies off adds
//! 1 but is no overflow. Each namespace's own count, TcpExtListenOverflows,
//! is exact but names no listener. So each round the drops of a namespace's
//! listeners are turned into overflows with it: of the overflows the
//! namespace counted and observer has not charged yet, as many as the drops
//! can explain go to the listeners that dropped, by their share of the
//! drops. The count is read after every drop of the round (the sweep's
//! readings and the closed listeners' last ones), so every overflow charged
//! has happened; an overflow counted after a listener's drop counter was
//! read waits for that listener's next reading, and every overflow shows in
//! some listener's counter, read by a sweep or queued when it closes.
//!
//! A namespace is known by its inode, which the kernel hands to the next
//! namespace as soon as one is freed; an account is kept a while after its
//! namespace left the sweeps (it may only be missing from them). A count
//! below what the account charged is a new namespace's: charged from zero.
//! One whose count at first sight is not below it still inherits the old
//! account (undercounted by up to the old one's charges): to be closed by
//! a namespace identity the kernel never reuses (the netns cookie, 5.14+).
//!
//! Exact per namespace; exact per listener when one listener of the
//! namespace dropped in the round, the usual case (a pod's server). Drops
//! the namespace's count cannot explain (SYN-queue drops, the second count
//! of an ACK) are left out.
use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use super::ListenerDrops;

/// One namespace's overflows: counted by the kernel since `base`, and
/// charged to listeners.
#[derive(Debug)]
struct Account {
    base: u64,
    charged: u64,
    seen: Instant,
}

#[derive(Debug, Default)]
pub struct OverflowLedger {
    namespaces: HashMap<u32, Account>,
}

/// How long the account of a namespace missing from the readings is kept
/// (as its listeners are: `listeners::MISSING_FOR`).
const KEEP: Duration = super::listeners::MISSING_FOR;

impl OverflowLedger {
    /// A namespace at observer's start: what it counted before is not ours
    /// to charge (its listeners' drops so far are the baseline too).
    pub fn start(&mut self, netns: u32, counted: u64, now: Instant) {
        self.namespaces.insert(netns, Account { base: counted, charged: 0, seen: now });
    }

    /// The overflows of one round's `drops`; `count` reads a namespace's
    /// TcpExtListenOverflows now. A namespace without an account was
    /// created while observer ran (as listeners first seen after the first
    /// sweep are taken to be): all its count is to charge. Where the count
    /// cannot be read, the drops stay as they are.
    pub fn overflows(
        &mut self,
        drops: Vec<ListenerDrops>,
        count: impl Fn(u32) -> Option<u64>,
        now: Instant,
    ) -> Vec<ListenerDrops> {
        let mut by_netns: BTreeMap<u32, Vec<ListenerDrops>> = BTreeMap::new();
        for d in drops {
            by_netns.entry(d.netns).or_default().push(d);
        }
        let mut out = Vec::new();
        for (netns, drops) in by_netns {
            let Some(counted) = count(netns) else {
                out.extend(drops);
                continue;
            };
            let account = self.namespaces.entry(netns).or_insert(Account { base: 0, charged: 0, seen: now });
            if counted < account.base + account.charged {
                // A namespace's count never goes back: this is a new one
                // behind the inode of one gone (the kernel hands a freed
                // namespace inode out again at once), whose account is
                // kept for a while in case it was only missing from the
                // sweeps. Charged as new: all its count.
                tracing::debug!(netns, counted, "a new network namespace behind an inode seen before");
                *account = Account { base: 0, charged: 0, seen: now };
            }
            account.seen = now;
            let uncharged = counted.saturating_sub(account.base + account.charged);
            let total: u64 = drops.iter().map(|d| d.drops).sum();
            let take = uncharged.min(total);
            account.charged += take;
            out.extend(share(drops, take, total));
        }
        out
    }

    /// Keep the accounts of namespaces read now, or missing for less than
    /// `KEEP`.
    pub fn retain(&mut self, read: impl Fn(u32) -> bool, now: Instant) {
        self.namespaces.retain(|netns, a| {
            if read(*netns) {
                a.seen = now;
            }
            now.duration_since(a.seen) < KEEP
        });
    }
}

/// `take` of `total` drops shared by each listener's drops, largest
/// remainders first (ties in order), so the parts add up to `take`.
fn share(drops: Vec<ListenerDrops>, take: u64, total: u64) -> Vec<ListenerDrops> {
    if total == 0 || take == 0 {
        return Vec::new();
    }
    let mut parts: Vec<(ListenerDrops, u64, u64)> = drops
        .into_iter()
        .map(|d| {
            let exact = u128::from(d.drops) * u128::from(take);
            let whole = (exact / u128::from(total)) as u64;
            let remainder = (exact % u128::from(total)) as u64;
            (d, whole, remainder)
        })
        .collect();
    let mut left = take - parts.iter().map(|(_, whole, _)| whole).sum::<u64>();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|a, b| parts[*b].2.cmp(&parts[*a].2));
    for i in order {
        if left == 0 {
            break;
        }
        if parts[i].2 > 0 {
            parts[i].1 += 1;
            left -= 1;
        }
    }
    parts.into_iter().filter(|(_, n, _)| *n > 0).map(|(d, n, _)| ListenerDrops { drops: n, ..d }).collect()
}

#[cfg(test)]
mod tests {
    use observer_common::Actor;

    use crate::collect::DropReason;

    use super::*;

    fn drops(netns: u32, port: u16, n: u64) -> ListenerDrops {
        ListenerDrops {
            owner: Actor { tgid: u32::from(port), ..Actor::default() },
            netns,
            family: 2,
            port,
            reason: DropReason::Overflow,
            drops: n,
        }
    }

    fn counts(pairs: &[(u32, u64)]) -> impl Fn(u32) -> Option<u64> + '_ {
        move |netns| pairs.iter().find(|(n, _)| *n == netns).map(|(_, c)| *c)
    }

    /// An overflowed last ACK counts twice in the drop counter, once in the
    /// namespace's count; SYN-queue drops not at all.
    #[test]
    fn drops_the_namespace_did_not_count_as_overflows_are_left_out() {
        let now = Instant::now();
        let mut l = OverflowLedger::default();
        l.start(7, 100, now);
        // One overflowed ACK: 2 drops, 1 overflow.
        assert_eq!(l.overflows(vec![drops(7, 80, 2)], counts(&[(7, 101)]), now), vec![drops(7, 80, 1)]);
        // Three SYN-queue drops: no overflow.
        assert!(l.overflows(vec![drops(7, 80, 3)], counts(&[(7, 101)]), now).is_empty());
    }

    /// An overflow the namespace counted after the listener's counter was
    /// read waits for that reading; none is charged twice.
    #[test]
    fn an_overflow_counted_before_its_drop_was_read_waits_for_it() {
        let now = Instant::now();
        let mut l = OverflowLedger::default();
        l.start(7, 0, now);
        assert_eq!(l.overflows(vec![drops(7, 80, 1)], counts(&[(7, 2)]), now), vec![drops(7, 80, 1)]);
        assert_eq!(l.overflows(vec![drops(7, 80, 1)], counts(&[(7, 2)]), now), vec![drops(7, 80, 1)]);
        assert!(l.overflows(vec![drops(7, 80, 1)], counts(&[(7, 2)]), now).is_empty());
    }

    #[test]
    fn several_listeners_share_by_their_drops_and_the_parts_add_up() {
        let now = Instant::now();
        let mut l = OverflowLedger::default();
        l.start(7, 0, now);
        let out = l.overflows(vec![drops(7, 80, 4), drops(7, 81, 2), drops(7, 82, 1)], counts(&[(7, 5)]), now);
        assert_eq!(out.iter().map(|d| d.drops).sum::<u64>(), 5);
        assert_eq!(out[0], drops(7, 80, 3));
    }

    /// The kernel gives a freed namespace's inode to the next one at once
    /// (pods come and go): a count below what was charged is a new
    /// namespace's, charged whole. The last-ACK overflow test counted 0 of
    /// 1 when its namespace took the inode of an earlier test's, whose 3
    /// overflows were charged.
    #[test]
    fn a_new_namespace_behind_a_reused_inode_is_charged_from_zero() {
        let now = Instant::now();
        let mut l = OverflowLedger::default();
        assert_eq!(l.overflows(vec![drops(7, 80, 6)], counts(&[(7, 3)]), now), vec![drops(7, 80, 3)]);
        // Gone, and its inode taken by a namespace that overflowed once.
        assert_eq!(l.overflows(vec![drops(7, 9090, 2)], counts(&[(7, 1)]), now), vec![drops(7, 9090, 1)]);
        assert!(l.overflows(vec![drops(7, 9090, 2)], counts(&[(7, 1)]), now).is_empty(), "charged once");
    }

    /// A namespace first seen while observer runs, and one whose count
    /// cannot be read.
    #[test]
    fn a_new_namespace_charges_its_whole_count_and_an_unreadable_one_its_drops() {
        let now = Instant::now();
        let mut l = OverflowLedger::default();
        assert_eq!(l.overflows(vec![drops(8, 80, 6)], counts(&[(8, 3)]), now), vec![drops(8, 80, 3)]);
        assert_eq!(l.overflows(vec![drops(9, 80, 6)], counts(&[]), now), vec![drops(9, 80, 6)]);
        l.retain(|_| false, now + KEEP);
        assert!(l.namespaces.is_empty());
    }
}
