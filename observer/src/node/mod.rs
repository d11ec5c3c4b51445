//! Reading the node besides the kernel maps: its network namespaces, their
//! sockets (sock_diag), counts and settings, who owns a socket and how many
//! files a process holds (/proc). The daemon reads it once per round
//! (`sweep::Sweeper`), `observer doctor` on demand (`sweep::once`).
pub mod conntrack;
pub mod executable;
pub mod files;
pub mod netns;
pub mod owners;
pub mod process;
pub mod screen;
pub mod settings;
pub mod sock_diag;
pub mod sweep;
pub mod trend;
pub mod usage;

use std::collections::BTreeSet;

use serde::Serialize;
use settings::NetSettings;
use sock_diag::Listener;
use sweep::SweepCounts;
use usage::SocketCounts;

/// One network namespace as a sweep found it.
#[derive(Clone, Debug)]
pub struct NetnsReading {
    pub inode: u32,
    /// "host", or the namespace's inode number (stable for its life,
    /// unlike a pid).
    pub name: String,
    /// A process in it, whose pod is the namespace's (None: no process,
    /// only a bind mount holds it).
    pub pid: Option<u32>,
    /// Every listener, with its accept queue and drops.
    pub listeners: Vec<Listener>,
    /// The ceilings and their usage; None if they could not be read (the
    /// listeners, which the drop counts need, are kept apart for that).
    pub usage: Option<NetnsUsage>,
    /// The kernel's count of TIME_WAIT entries in it, in the rounds that
    /// check observer's (`sweep::KERNEL_CHECK_EVERY`).
    pub time_wait_entered: Option<u64>,
    /// Its count of listen overflows, likewise.
    pub listen_overflows: Option<u64>,
    /// Its ESTABLISHED sockets at last round's dump, when nothing of it
    /// changed since (`sweep::Settling`): what observer's ledger of open
    /// connections, read between the two, must hold for it.
    pub quiet_established: Option<u64>,
}

/// A namespace's ceilings and what it uses of them.
#[derive(Clone, Debug, Serialize)]
pub struct NetnsUsage {
    pub settings: NetSettings,
    /// Sockets that hold a local port now (the screen's in_use +
    /// minisockets): no destination has more of the namespace's ports.
    pub port_holders: u64,
    /// TIME_WAIT and orphaned FIN_WAIT2 minisockets now, what
    /// tcp_max_tw_buckets bounds.
    pub minisockets: u64,
    /// Ports per destination and TIME_WAIT from the namespace's latest dump
    /// (see `sweep`); None before its first.
    pub counts: Option<SocketCounts>,
    /// Its connection tracking table, read each round (None where
    /// nf_conntrack is not loaded).
    pub conntrack: Option<conntrack::Conntrack>,
}

/// One reading of every network namespace of the node.
#[derive(Clone, Debug, Default)]
pub struct NodeReading {
    pub namespaces: Vec<NetnsReading>,
    pub counts: SweepCounts,
    /// Every namespace found on the node this round, read or not (a
    /// namespace whose files failed to read for a round, or one beyond
    /// `--max-namespaces`, is still there): what a check that keeps a
    /// namespace's state across rounds may forget is only what is not.
    pub on_node: BTreeSet<u32>,
}

impl NodeReading {
    /// Every listener of every namespace.
    pub fn listeners(&self) -> impl Iterator<Item = &Listener> {
        self.namespaces.iter().flat_map(|n| &n.listeners)
    }
}
