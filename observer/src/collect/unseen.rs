//! TIME_WAIT entries the kernel counted that observer's programs never
//! saw: each namespace's own count (TcpExtTW + TcpExtTWKilled, bumped when
//! a socket's TIME_WAIT timer is first set) against the programs' count of
//! the same namespace (`TIME_WAIT_BY_NETNS`).
//!
//! Under a full-speed churn a few runs in a hundred lose a block of
//! entries that no program ran for, with no skipped run reported by the
//! kernel (BENCHMARKS.md, history item 6): the runs another tool's
//! programs attaching or detaching on the same tracepoints cost (history
//! 25; tests/time_wait.rs makes it happen). observer cannot prevent that,
//! so the loss is at least a number, not a silent gap.
//!
//! The two counts move within microseconds of each other, in one kernel
//! call, but they are read tens of milliseconds apart (the kernel's in the
//! sweep, the programs' after it), so each side is compared at a reading
//! where it cannot be ahead: the kernel's count one check late (every
//! entry it had counted by its previous reading was long since seen by
//! the programs, unless missed) and, at a namespace's first check, the
//! programs' start read just before the sweep (so a churn going on during
//! that first check cannot look like a loss). The shortfall then is what
//! the programs missed; it only grows (kept as the largest seen). Entries
//! from before a namespace's first check do not count.
//!
//! The programs' start must be that close to the kernel's: their count of
//! a namespace goes back further than its first check (to observer's
//! start, or to the check before, when the entries of namespaces not read
//! are dropped), and a start of 0 let every entry seen before the first
//! check make up for as many missed after it. A namespace born with a
//! burst hid its later losses that way, and so did a churn under way when
//! a new daemon made its first check (a 39-entry loss with nothing unseen
//! in the bench, BENCHMARKS.md history item 20).
use std::collections::HashMap;

/// One namespace's two counts since its first reading.
#[derive(Debug)]
struct Tally {
    kernel_base: u64,
    ours_base: u64,
    /// The kernel's count at the previous reading.
    kernel_previous: u64,
    unseen: u64,
}

#[derive(Debug, Default)]
pub struct Unseen {
    namespaces: HashMap<u32, Tally>,
    /// What namespaces gone had left unseen.
    gone: u64,
}

impl Unseen {
    /// One check of each namespace's counts: the programs' just before the
    /// kernel's (`ours_before`), the kernel's (`kernel`), then the
    /// programs' again (`ours`). A namespace missing from a reading of
    /// ours has no count there (none yet, or dropped since the previous
    /// check). Namespaces not in `kernel` keep their tallies.
    pub fn update(&mut self, ours_before: &HashMap<u32, u64>, kernel: &HashMap<u32, u64>, ours: &HashMap<u32, u64>) {
        for (&netns, &now) in kernel {
            let counted = ours.get(&netns).copied().unwrap_or(0);
            let tally = self.namespaces.entry(netns).or_insert_with(|| Tally {
                kernel_base: now,
                ours_base: ours_before.get(&netns).copied().unwrap_or(0),
                kernel_previous: now,
                unseen: 0,
            });
            let by_kernel = tally.kernel_previous.saturating_sub(tally.kernel_base);
            let by_us = counted.saturating_sub(tally.ours_base);
            tally.unseen = tally.unseen.max(by_kernel.saturating_sub(by_us));
            tally.kernel_previous = now;
        }
    }

    /// The namespaces not in `present` are gone: what they left unseen
    /// stays in the total.
    pub fn forget_absent(&mut self, present: &HashMap<u32, u64>) {
        let gone = &mut self.gone;
        self.namespaces.retain(|netns, tally| {
            let kept = present.contains_key(netns);
            if !kept {
                *gone += tally.unseen;
            }
            kept
        });
    }

    /// Entries unseen so far, every namespace together.
    pub fn total(&self) -> u64 {
        self.gone + self.namespaces.values().map(|t| t.unseen).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(pairs: &[(u32, u64)]) -> HashMap<u32, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn entries_counted_on_both_sides_leave_nothing_unseen_even_across_a_round() {
        let mut u = Unseen::default();
        // Before observer: 500 entries the kernel counted, none of ours.
        u.update(&reading(&[]), &reading(&[(7, 500)]), &reading(&[]));
        // 100 entries; the kernel's reading is a moment ahead of ours.
        u.update(&reading(&[(7, 97)]), &reading(&[(7, 600)]), &reading(&[(7, 98)]));
        u.update(&reading(&[(7, 100)]), &reading(&[(7, 600)]), &reading(&[(7, 100)]));
        assert_eq!(u.total(), 0);
    }

    #[test]
    fn entries_only_the_kernel_counted_are_unseen_and_stay_so() {
        let mut u = Unseen::default();
        u.update(&reading(&[]), &reading(&[(7, 0)]), &reading(&[]));
        u.update(&reading(&[(7, 980)]), &reading(&[(7, 1000)]), &reading(&[(7, 980)]));
        u.update(&reading(&[(7, 980)]), &reading(&[(7, 1000)]), &reading(&[(7, 980)]));
        assert_eq!(u.total(), 20);
        // More entries, all seen: still 20.
        u.update(&reading(&[(7, 1980)]), &reading(&[(7, 2000)]), &reading(&[(7, 1980)]));
        u.update(&reading(&[(7, 1980)]), &reading(&[(7, 2000)]), &reading(&[(7, 1980)]));
        assert_eq!(u.total(), 20);
        // The namespace goes (a reading without it); its 20 stay; another's
        // add up.
        u.forget_absent(&reading(&[(8, 0)]));
        u.update(&reading(&[]), &reading(&[(8, 0)]), &reading(&[]));
        u.update(&reading(&[(8, 7)]), &reading(&[(8, 10)]), &reading(&[(8, 7)]));
        u.update(&reading(&[(8, 7)]), &reading(&[(8, 10)]), &reading(&[(8, 7)]));
        assert_eq!(u.total(), 23);
    }

    #[test]
    fn entries_counted_before_a_namespaces_first_reading_are_not_unseen() {
        let mut u = Unseen::default();
        // Our programs counted 30 in a namespace created between rounds;
        // the kernel's first reading includes them.
        u.update(&reading(&[(9, 30)]), &reading(&[(9, 30)]), &reading(&[(9, 30)]));
        u.update(&reading(&[(9, 40)]), &reading(&[(9, 40)]), &reading(&[(9, 40)]));
        u.update(&reading(&[(9, 40)]), &reading(&[(9, 40)]), &reading(&[(9, 40)]));
        assert_eq!(u.total(), 0);
    }

    #[test]
    fn a_churn_going_on_at_a_namespaces_first_check_is_no_loss() {
        let mut u = Unseen::default();
        u.update(&reading(&[]), &reading(&[(1, 0)]), &reading(&[]));
        // Namespace 9's first check falls in a churn: 990 counted by the
        // programs before the sweep, 1000 by the kernel in it, 1900 by the
        // programs after it.
        u.update(&reading(&[(9, 990)]), &reading(&[(1, 0), (9, 1000)]), &reading(&[(9, 1900)]));
        u.update(&reading(&[(9, 3000)]), &reading(&[(1, 0), (9, 3000)]), &reading(&[(9, 3000)]));
        u.update(&reading(&[(9, 3000)]), &reading(&[(1, 0), (9, 3000)]), &reading(&[(9, 3000)]));
        assert_eq!(u.total(), 0);
    }

    #[test]
    fn entries_seen_before_a_namespaces_first_check_do_not_make_up_for_later_misses() {
        let mut u = Unseen::default();
        // A namespace born with a burst of 5000 entries, all seen, before
        // its first check; then 1000 more, of which the programs miss 39.
        u.update(&reading(&[(9, 5000)]), &reading(&[(9, 5000)]), &reading(&[(9, 5000)]));
        u.update(&reading(&[(9, 5961)]), &reading(&[(9, 6000)]), &reading(&[(9, 5961)]));
        u.update(&reading(&[(9, 5961)]), &reading(&[(9, 6000)]), &reading(&[(9, 5961)]));
        assert_eq!(u.total(), 39);
    }
}
