//! Conntrack drops as counters of what happened while observer watched.
//!
//! The kernel keeps each namespace's drops since the namespace was
//! created. A namespace observer found at start counts from its first
//! reading (what it dropped before is history, and a series born with it
//! would look like a burst to every alert); one that appeared later was
//! created while observer ran, so all of its drops are counted (as the
//! listeners' drops are, `collect::listeners`). A namespace is forgotten
//! when a reading no longer has it: observer holds its files, so it is
//! gone, and an inode the kernel hands out again is a new namespace.
use std::collections::HashMap;

use crate::node::{NodeReading, conntrack::DropReason};

/// Drops per namespace, `DropReason::ALL`'s order.
type Drops = [u64; 3];

#[derive(Debug, Default)]
pub struct ConntrackDrops {
    /// The kernel's count at the last reading, by namespace inode.
    last: HashMap<u32, Drops>,
    /// Counted since observer watched, by namespace inode.
    totals: HashMap<u32, Drops>,
    started: bool,
}

impl ConntrackDrops {
    /// Count one round's readings.
    pub fn update(&mut self, node: &NodeReading) {
        let present: std::collections::HashSet<u32> = node.namespaces.iter().map(|n| n.inode).collect();
        self.last.retain(|inode, _| present.contains(inode));
        self.totals.retain(|inode, _| present.contains(inode));
        for netns in &node.namespaces {
            // A namespace whose table could not be read this round keeps
            // its last reading: the next one counts what happened since.
            let Some(table) = netns.usage.as_ref().and_then(|u| u.conntrack) else { continue };
            let before = match self.last.get(&netns.inode) {
                Some(before) => *before,
                None if self.started => [0; 3],
                None => table.drops,
            };
            let total = self.totals.entry(netns.inode).or_default();
            for (i, reason) in DropReason::ALL.iter().enumerate() {
                // The kernel's counts only grow while the namespace lives.
                total[i] += table.drops(*reason).saturating_sub(before[i]);
            }
            self.last.insert(netns.inode, table.drops);
        }
        self.started = true;
    }

    /// A namespace's drops counted so far (None: its table was never read).
    pub fn total(&self, inode: u32) -> Option<Drops> {
        self.totals.get(&inode).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{NetnsReading, NetnsUsage, conntrack::Conntrack, settings::NetSettings};

    fn reading(tables: &[(u32, [u64; 3])]) -> NodeReading {
        let settings = NetSettings::with_range((32768, 60999), 262_144);
        NodeReading {
            namespaces: tables
                .iter()
                .map(|(inode, drops)| NetnsReading {
                    inode: *inode,
                    name: inode.to_string(),
                    pid: None,
                    listeners: Vec::new(),
                    usage: Some(NetnsUsage {
                        settings: settings.clone(),
                        port_holders: 0,
                        minisockets: 0,
                        counts: None,
                        conntrack: Some(Conntrack { entries: 0, limit: 100, drops: *drops }),
                    }),
                    time_wait_entered: None,
                    listen_overflows: None,
                    quiet_established: None,
                })
                .collect(),
            counts: Default::default(),
            on_node: Default::default(),
        }
    }

    #[test]
    fn drops_before_observer_are_history_and_a_new_namespace_counts_whole() {
        let mut d = ConntrackDrops::default();
        d.update(&reading(&[(1, [50, 5, 1])]));
        assert_eq!(d.total(1), Some([0, 0, 0]), "found at start: its past is not counted");
        d.update(&reading(&[(1, [57, 5, 2]), (2, [3, 0, 0])]));
        assert_eq!(d.total(1), Some([7, 0, 1]));
        assert_eq!(d.total(2), Some([3, 0, 0]), "created while observer ran");
        // Namespace 1 is gone; its inode comes back as a new namespace.
        d.update(&reading(&[(2, [3, 0, 0])]));
        assert_eq!(d.total(1), None);
        d.update(&reading(&[(1, [2, 0, 0]), (2, [4, 0, 0])]));
        assert_eq!((d.total(1), d.total(2)), (Some([2, 0, 0]), Some([4, 0, 0])));
    }
}
