//! Reading the node besides the kernel maps: its network namespaces, their
//! sockets (sock_diag) and settings, who owns a socket and how many files
//! a process holds (/proc). The daemon reads it once per round
//! (`sweep`), `observer doctor` on demand; both enter each namespace once.
pub mod files;
pub mod netns;
pub mod owners;
pub mod process;
pub mod settings;
pub mod sock_diag;
pub mod trend;
pub mod usage;

use std::path::Path;

use sock_diag::Listener;
use usage::NetnsUsage;

/// One network namespace as a sweep found it.
#[derive(Clone, Debug)]
pub struct NetnsReading {
    pub inode: u32,
    /// "host", or the namespace's inode number (stable for its life,
    /// unlike a pid).
    pub name: String,
    /// Every listener, with its accept queue and drops.
    pub listeners: Vec<Listener>,
    /// The ceilings and their usage; None if they could not be read (the
    /// listeners, which the drop counts need, are kept apart for that).
    pub usage: Option<NetnsUsage>,
}

/// One reading of every network namespace of the node.
#[derive(Clone, Debug, Default)]
pub struct NodeReading {
    pub namespaces: Vec<NetnsReading>,
}

impl NodeReading {
    /// Every listener of every namespace.
    pub fn listeners(&self) -> impl Iterator<Item = &Listener> {
        self.namespaces.iter().flat_map(|n| &n.listeners)
    }
}

/// Every network namespace of the host, entered once each: its listeners
/// and its usage of the ceilings. A namespace whose listeners cannot be
/// dumped is left out.
pub fn sweep(proc_root: &Path) -> NodeReading {
    let host = netns::host(proc_root);
    let namespaces = netns::in_each_namespace(netns::all(proc_root), move |inode| {
        let name = if Some(inode) == host { "host".to_string() } else { inode.to_string() };
        read_namespace(inode).map(|(listeners, usage)| NetnsReading { inode, name, listeners, usage })
    });
    NodeReading { namespaces }
}

/// The calling thread's namespace (`inode`): its listeners, then its usage.
pub fn read_namespace(inode: u32) -> Option<(Vec<Listener>, Option<NetnsUsage>)> {
    let listeners = sock_diag::dump_listeners(inode).ok()?;
    let usage = usage::read(&listeners).ok();
    Some((listeners, usage))
}
