//! Collect: every interval, the kernel's counts since the last one (the
//! counter buffers, read once each), the listeners' drops as deltas, and
//! which processes have ended, as `Deltas`.
mod buffers;
mod holdback;
mod ledger_check;
mod listeners;
mod lru;
mod open_connections;
mod overflow_ledger;
mod unseen;

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as AyaHashMap, MapData, PerCpuArray, PerCpuHashMap, Queue};
pub use buffers::Buffers;
pub use listeners::{DropReason, ListenerDrops, ListenerTracker};
pub use lru::{EvictionTracker, LruMaps, MapFill};
use observer_common::{
    Actor, ClosedListener, ConnectErrorKey, ConnectionCounts, ConnectionKey, ListenerDropKey, ListenerKey,
    ProcCounters, ProcKey, QueuedEnd, capacity, listener_drop, lost, names::maps,
};

use crate::{
    attribution::{
        Attributor, Identity, PodKey, PodLabels, pod_key,
        resolver::{Lookup, Resolver},
    },
    error::Error,
    node::{self, NodeReading, owners, sock_diag},
};

/// The maps the collector reads, taken out of the loaded object.
pub struct KernelMaps {
    pub counters: Buffers,
    pub listeners: AyaHashMap<MapData, ListenerKey, Actor>,
    pub exited: AyaHashMap<MapData, u32, u32>,
    pub lost: PerCpuArray<MapData, u64>,
    pub lru: LruMaps,
    /// TIME_WAIT entries per network namespace, cumulative.
    pub time_wait_by_netns: PerCpuHashMap<MapData, u32, u64>,
    /// Listeners that closed, with their last drop count (sweep's mode).
    pub closed_listeners: Queue<MapData, ClosedListener>,
    /// Connection ends that found `CONNECTIONS` full.
    pub queued_ends: Queue<MapData, QueuedEnd>,
    /// The size `OPEN_CONNECTIONS` was loaded with.
    pub open_connections_capacity: u32,
    /// The connections established before observer started, entered in
    /// `OPEN_CONNECTIONS` at start (`probes::older`): the open ledger's
    /// opening balance, per key.
    pub older_connections: Vec<(ConnectionKey, u64)>,
    /// What the start-up pass had no room for (`probes::older`).
    pub left_out_at_start: LeftOutAtStart,
}

/// What changed since the previous collection.
/// Entries the start-up pass over the sockets older than observer could
/// not write for want of room: its established connections left out of
/// `OPEN_CONNECTIONS` (not counted open). Exported with the maps' lost
/// updates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeftOutAtStart {
    pub open_connections: u64,
    /// The namespaces whose sockets the pass could not read (no TCP
    /// iterator, or not in time): the connections among them are not
    /// followed, unnumbered, so their ledgers are never checked. Those
    /// gone from the node are dropped (an inode can be reused).
    pub unread: BTreeSet<u32>,
}

#[derive(Debug, Default)]
pub struct Deltas {
    pub procs: Vec<(ProcKey, ProcCounters)>,
    pub connect_errors: Vec<(ConnectErrorKey, u64)>,
    pub listen_drops: Vec<ListenerDrops>,
    /// Connections established and closed, by lifetime.
    pub connections: Vec<(ConnectionKey, ConnectionCounts)>,
    /// The connections open now, per key (not a delta: the whole ledger).
    pub open_connections: Vec<(ConnectionKey, u64)>,
    /// Processes whose grace period ended (and unknown owners of a cgroup
    /// idle as long): drop their series.
    pub retired: Vec<PodKey>,
    /// Processes whose pid a new process has taken: drop their series
    /// before this round's counts, which are the new process's series.
    pub reused: Vec<PodKey>,
    /// Kernel-side updates lost to full maps, cumulative, by `lost` slot.
    pub lost: [u64; lost::SLOTS as usize],
    /// And those the start-up pass could not make (fixed after the start).
    pub left_out_at_start: LeftOutAtStart,
    /// How full each map is (and, for LRU maps, what they evicted).
    pub map_fill: Vec<MapFill>,
    /// The owner of every listener whose owner is known, by socket cookie.
    pub listener_owners: HashMap<u64, Actor>,
    /// Who every actor in these deltas is (its pod, its executable), by
    /// `pod_key`.
    pub pods: HashMap<PodKey, Identity>,
    /// The pod of each network namespace that belongs to one, by inode.
    pub namespace_pods: HashMap<u32, Arc<PodLabels>>,
    /// TIME_WAIT entries the kernel counted and observer's programs never
    /// saw, cumulative (`unseen.rs`).
    pub unseen_time_wait: u64,
    /// Listen overflows likewise, where programs count them.
    pub unseen_overflows: u64,
    /// Connections whose start or end the programs missed, at least
    /// (`ledger_check.rs`): what the checks found, kept after they stop.
    pub unseen_connections: u64,
    /// The checks it has made so far, per namespace.
    pub connection_checks: HashMap<u32, u64>,
}

pub struct Collector {
    maps: KernelMaps,
    /// Processes with counts since they were last retired: checked
    /// against /proc for an exit whose notice was missed.
    known: HashSet<u32>,
    /// Processes that have ended, since when (their grace period).
    exited_at: HashMap<u32, Instant>,
    /// The start time of each process checked, to tell a reused pid.
    started: HashMap<u32, u64>,
    /// Per cgroup, when the unknown owner (tgid 0) of its sockets last
    /// counted: it has no process to end, so it ends when idle for the
    /// grace period (a removed pod's cgroup stays idle).
    unknown_owners: HashMap<u64, Instant>,
    /// Exit notices of this round, to check against /proc.
    noticed: HashSet<u32>,
    listeners: ListenerTracker,
    proc_root: PathBuf,
    resolver: Resolver,
    /// Each namespace's pod, once known (None: not a pod's), by inode: a
    /// namespace never changes pods.
    namespace_pods: HashMap<u32, Option<Arc<PodLabels>>>,
    unseen: unseen::Unseen,
    /// The programs' TIME_WAIT entries per namespace read just before the
    /// sweep of a round that checks them (`unseen.rs`), taken by the check.
    time_wait_before_sweep: HashMap<u32, u64>,
    /// The programs' listen overflows per namespace, cumulative, and what
    /// they left unseen (the same check as TIME_WAIT's), where programs
    /// count them.
    overflows_by_netns: HashMap<u32, u64>,
    unseen_overflows: unseen::Unseen,
    /// The sweep's mode: listener drops -> overflows, by each namespace's
    /// own count (None where programs count overflows).
    overflow_ledger: Option<overflow_ledger::OverflowLedger>,
    held: holdback::Held,
    /// Hold back counts whose pod labels are pending (off for the last
    /// round before exit, when nothing may stay behind).
    holding: bool,
    evictions: lru::EvictionTracker,
    open_connections: open_connections::OpenConnections,
    ledger_check: ledger_check::LedgerCheck,
}

/// A failpoint's namespace: its inode, or a path that opens it (for a
/// namespace a test makes after the daemon started).
#[cfg(feature = "failpoints")]
fn failpoint_netns(arg: Option<String>) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let arg = arg?;
    arg.parse().ok().or_else(|| Some(std::fs::metadata(&arg).ok()?.ino() as u32))
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |e| Error::Map { map, source: e.into() }
}

impl Collector {
    /// `overflows_from_sweep`: no overflow hook attached, the listeners'
    /// drop counters are the counts (`ListenerTracker`).
    pub fn new(maps: KernelMaps, proc_root: PathBuf, attributor: Attributor, overflows_from_sweep: bool) -> Self {
        Self {
            known: HashSet::new(),
            exited_at: HashMap::new(),
            started: HashMap::new(),
            unknown_owners: HashMap::new(),
            noticed: HashSet::new(),
            listeners: ListenerTracker::new(overflows_from_sweep),
            proc_root,
            resolver: Resolver::spawn(attributor),
            namespace_pods: HashMap::new(),
            unseen: unseen::Unseen::default(),
            time_wait_before_sweep: HashMap::new(),
            overflows_by_netns: HashMap::new(),
            unseen_overflows: unseen::Unseen::default(),
            overflow_ledger: overflows_from_sweep.then(overflow_ledger::OverflowLedger::default),
            held: holdback::Held::default(),
            holding: true,
            evictions: lru::EvictionTracker::default(),
            open_connections: open_connections::OpenConnections::opening(&maps.older_connections),
            ledger_check: ledger_check::LedgerCheck::default(),
            maps,
        }
    }

    /// Before the sweep of a round that reads each namespace's own count of
    /// TIME_WAIT entries: the programs' counts as they are then, where each
    /// namespace's first check starts from (`unseen.rs`).
    pub fn before_time_wait_check(&mut self) -> Result<(), Error> {
        self.time_wait_before_sweep = self.time_wait_counts()?;
        Ok(())
    }

    /// The programs' TIME_WAIT entries per namespace (since the
    /// namespace's first check, or since observer started).
    fn time_wait_counts(&self) -> Result<HashMap<u32, u64>, Error> {
        let mut counts = HashMap::new();
        for entry in self.maps.time_wait_by_netns.iter() {
            let (netns, values) = entry.map_err(map_err(maps::TIME_WAIT_BY_NETNS))?;
            counts.insert(netns, values.iter().sum::<u64>());
        }
        Ok(counts)
    }

    /// The next collection is the last: let every count out, labelled or
    /// not.
    pub fn last_round(&mut self) {
        self.holding = false;
    }

    /// The pod labels of every actor in `deltas`, from the lookup thread;
    /// counts whose labels are still pending wait for the next round. Also
    /// each namespace's pod, from a process in it (asked once).
    fn attribute(&mut self, deltas: &mut Deltas, node: &NodeReading, now: Instant) {
        self.held.release_into(deltas);
        self.namespace_pods.retain(|inode, _| node.on_node.contains(inode));
        let namespaces: Vec<(u32, u32)> = node
            .namespaces
            .iter()
            .filter(|n| !self.namespace_pods.contains_key(&n.inode))
            .filter_map(|n| Some((n.inode, n.pid?)))
            .collect();
        let wanted: Vec<(PodKey, u64, u32)> = deltas
            .procs
            .iter()
            .map(|(k, _)| k.actor)
            .chain(deltas.connect_errors.iter().map(|(k, _)| k.actor))
            .chain(deltas.connections.iter().map(|(k, _)| k.actor))
            // A process whose connections are all older than observer has
            // no count but these.
            .chain(deltas.open_connections.iter().map(|(k, _)| k.actor))
            .chain(deltas.listen_drops.iter().map(|d| d.owner))
            .chain(deltas.listener_owners.values().copied())
            .map(|actor| (pod_key(&actor), actor.cgroup_id, actor.tgid))
            .chain(namespaces.iter().map(|&(_, pid)| ((pid, 0), 0, pid)))
            .collect();
        let resolved = self.resolver.resolve(&wanted, now);
        for (inode, pid) in namespaces {
            if let Some(Lookup::Known(identity)) = resolved.get(&(pid, 0)) {
                self.namespace_pods.insert(inode, identity.pod.clone());
                // Kept per namespace from now on (a process's own counts,
                // if it has any, ask again).
                self.resolver.forget((pid, 0));
            }
        }
        deltas.namespace_pods =
            self.namespace_pods.iter().filter_map(|(inode, pod)| Some((*inode, pod.clone()?))).collect();
        let mut pending = HashSet::new();
        for (key, lookup) in resolved {
            match lookup {
                Lookup::Known(identity) => {
                    deltas.pods.insert(key, identity);
                }
                Lookup::Pending if self.holding => {
                    pending.insert(key);
                }
                Lookup::Pending => {
                    deltas.pods.insert(key, Identity::default());
                }
            }
        }
        if !pending.is_empty() {
            tracing::debug!(?pending, "pod labels pending: their counts wait a round");
        }
        self.held.hold(deltas, &pending);
        for key in &deltas.retired {
            self.resolver.forget(*key);
        }
    }

    /// One collection: the kernel maps, and the listeners of every
    /// namespace as the round's reading of the node just dumped them.
    /// `grace` is how long a process's series outlive it; `overflows_now`
    /// reads a namespace's own count of listen overflows (the sweep's mode
    /// turns drops into overflows with it).
    pub fn collect(
        &mut self,
        now: Instant,
        grace: Duration,
        node: &NodeReading,
        overflows_now: &dyn Fn(u32) -> Option<u64>,
    ) -> Result<Deltas, Error> {
        let listeners: Vec<sock_diag::Listener> = node.listeners().copied().collect();
        let swept: HashSet<u32> = node.namespaces.iter().map(|n| n.inode).collect();
        let mut deltas = Deltas::default();
        self.note_exits();

        // Ends the programs queued for want of room, read before the
        // buffers swap: an end queued after this read may belong to a
        // connection whose start goes to the buffer filled from the swap
        // on, read next round, and the ledger must never see an end
        // before its start.
        let queued_ends = self.take_queued_ends();
        // The ledger as of the last round's read, before this round's
        // counts: what a namespace found quiet since must hold.
        let ledger_before = self.open_connections.by_netns();
        // The counts since the last round, each read once (buffers.rs).
        let mut interval = self.maps.counters.take()?;
        count_queued_ends(&mut interval.connections, &queued_ends);
        for (key, counts) in &interval.procs {
            self.seen(&key.actor, now);
            if *counts != ProcCounters::default() {
                deltas.procs.push((*key, *counts));
            }
        }
        for (key, n) in &interval.connect_errors {
            self.seen(&key.actor, now);
            if *n != 0 {
                deltas.connect_errors.push((*key, *n));
            }
        }
        self.open_connections.update(&interval.connections);
        for (key, counts) in &interval.connections {
            self.seen(&key.actor, now);
            if *counts != ConnectionCounts::default() {
                deltas.connections.push((*key, *counts));
            }
        }
        // An owner with connections open is not idle, even when none
        // opened or closed this round (a pool of long-lived connections
        // of an unknown owner must not retire while they last).
        let open: Vec<(ConnectionKey, u64)> = self.open_connections.iter().map(|(k, n)| (*k, n)).collect();
        for (key, _) in &open {
            self.seen(&key.actor, now);
        }
        deltas.open_connections = open;
        // How full each map got in one interval.
        deltas.map_fill.push(MapFill {
            map: maps::PROC_COUNTERS,
            entries: interval.procs.len() as u64,
            capacity: capacity::PROC_COUNTERS as u64,
            evictions: None,
        });
        deltas.map_fill.push(MapFill {
            map: maps::CONNECT_ERRORS,
            entries: interval.connect_errors.len() as u64,
            capacity: capacity::CONNECT_ERRORS as u64,
            evictions: None,
        });
        deltas.map_fill.push(MapFill {
            map: maps::CONNECTIONS,
            entries: interval.connections.len() as u64,
            capacity: capacity::CONNECTIONS as u64,
            evictions: None,
        });
        deltas.map_fill.push(MapFill {
            map: maps::OPEN_CONNECTIONS,
            entries: self.open_connections.total(),
            capacity: self.maps.open_connections_capacity as u64,
            evictions: None,
        });
        deltas.map_fill.push(MapFill {
            map: maps::LISTEN_OVERFLOWS,
            entries: interval.listen_overflows.len() as u64,
            capacity: capacity::LISTEN_OVERFLOWS as u64,
            evictions: None,
        });

        // A process's exit notice can be missed (EXITED full) or early (its
        // leader thread ended, the process runs on): /proc decides, for the
        // processes with entries, the ones noticed, and listener owners.
        // A pid that runs with a new start time, or runs again after it
        // ended, was taken by a new process: the old one's series end now,
        // before this round's counts (which may hold the old one's last
        // interval: charged to the new one rather than lost). Seen only if
        // a round saw the old process running or ended; one that lived
        // less than an interval is not told from its successor.
        let candidates: HashSet<u32> = self
            .known
            .iter()
            .copied()
            .chain(self.noticed.drain())
            .chain(self.listeners.owner_pids())
            .filter(|tgid| *tgid != 0)
            .collect();
        for tgid in candidates {
            match node::process::started_at(&self.proc_root, tgid) {
                None => {
                    self.exited_at.entry(tgid).or_insert(now);
                }
                Some(start) => {
                    // A new start time, or running again after it ended.
                    let before = self.started.insert(tgid, start);
                    if before.is_some_and(|b| b != start) || self.exited_at.contains_key(&tgid) {
                        tracing::debug!(pid = tgid, "pid taken by a new process: the old one's series end now");
                        self.exited_at.remove(&tgid);
                        deltas.reused.push((tgid, 0));
                        self.resolver.forget((tgid, 0));
                    }
                }
            }
        }

        // Retire processes whose grace period is over (their last counts
        // were read above; their keys went with the buffer).
        let expired: Vec<u32> =
            self.exited_at.iter().filter(|(_, at)| now.duration_since(**at) >= grace).map(|(tgid, _)| *tgid).collect();
        for tgid in &expired {
            self.exited_at.remove(tgid);
            self.known.remove(tgid);
            self.started.remove(tgid);
        }
        deltas.retired = expired.into_iter().map(|tgid| (tgid, 0)).collect();

        // Overflows: as the programs counted them, or from the drop
        // counters, of listeners that closed and of those the sweep read.
        deltas.listen_drops = self.listen_overflows(&interval.listen_overflows, &listeners);
        // The namespaces' own overflow counts check overflows alone. A
        // namespace's first check starts from the programs' counts up to
        // the last round's read (before this round's sweep; `unseen.rs`).
        let overflows_before = if node.namespaces.iter().any(|n| n.listen_overflows.is_some()) {
            self.overflows_by_netns.clone()
        } else {
            HashMap::new()
        };
        for (key, n) in interval.listen_overflows.iter().filter(|(k, _)| k.reason == listener_drop::OVERFLOW) {
            *self.overflows_by_netns.entry(key.listener.netns).or_default() += n;
        }
        let closed = self.take_closed_listeners();
        let started = self.listeners.first_scan_done();
        let mut listener_drops = self.listeners.closed(&closed);
        let proc_root = &self.proc_root;
        let swept_drops = self.listeners.update(
            now,
            &listeners,
            &swept,
            |key| self.maps.listeners.get(key, 0).ok(),
            |inodes| owners::owners_of_sockets(proc_root, inodes),
        );
        listener_drops.extend(swept_drops);
        if let Some(ledger) = &mut self.overflow_ledger {
            if !started {
                for n in &node.namespaces {
                    if let Some(counted) = overflows_now(n.inode) {
                        ledger.start(n.inode, counted, now);
                    }
                }
            }
            // Read after every drop of the round, the closed listeners' too.
            listener_drops = ledger.overflows(listener_drops, overflows_now, now);
            ledger.retain(|netns| swept.contains(&netns), now);
        }
        deltas.listen_drops.extend(listener_drops);
        deltas.listener_owners =
            listeners.iter().filter_map(|l| Some((l.cookie, self.listeners.owner(l.cookie)?))).collect();
        for drop in &deltas.listen_drops {
            self.seen(&drop.owner, now);
        }
        let keys = deltas.connections.iter_mut().map(|(k, _)| k);
        for key in keys.chain(deltas.open_connections.iter_mut().map(|(k, _)| k)) {
            self.charge_to_listener_owner(key, &listeners);
        }
        for owner in deltas.listener_owners.values() {
            if owner.tgid == 0 {
                self.unknown_owners.insert(owner.cgroup_id, now);
            }
        }
        // An unknown owner whose counts wait for their pod labels is not
        // idle: retired now, those counts would end with it, unseen (when
        // pod lookups take longer than --grace).
        for actor in self.held.actors() {
            if actor.tgid == 0 {
                self.unknown_owners.insert(actor.cgroup_id, now);
            }
        }
        // Unknown owners idle for the grace period: a cgroup's old sockets
        // all closed, or the cgroup removed with its pod.
        self.unknown_owners.retain(|cgroup, last| {
            let idle = now.duration_since(*last) >= grace;
            if idle {
                tracing::debug!(cgroup, "unknown owner idle for --grace: its series end");
                deltas.retired.push((0, *cgroup));
            }
            !idle
        });

        for slot in 0..lost::SLOTS {
            let values = self.maps.lost.get(&slot, 0).map_err(map_err(maps::LOST))?;
            deltas.lost[slot as usize] = values.iter().sum();
        }
        self.check_ledger(node, ledger_before, &deltas.lost);
        deltas.unseen_connections = self.ledger_check.total();
        deltas.left_out_at_start = self.maps.left_out_at_start.clone();
        deltas.connection_checks = self.ledger_check.checks().clone();
        deltas.map_fill.extend(self.evictions.read(&self.maps.lru, &self.maps.listeners, false)?);
        self.check_time_wait(node)?;
        deltas.unseen_time_wait = self.unseen.total();
        self.check_overflows(node, &overflows_before);
        deltas.unseen_overflows = self.unseen_overflows.total();
        self.attribute(&mut deltas, node, now);
        Ok(deltas)
    }

    /// In the rounds whose reading has the kernel's count of TIME_WAIT
    /// entries per namespace, check the programs' against it; the entries
    /// of namespaces not in the reading are dropped from the map (gone, or
    /// not read: only counts after a namespace's first reading matter).
    fn check_time_wait(&mut self, node: &NodeReading) -> Result<(), Error> {
        let kernel: HashMap<u32, u64> =
            node.namespaces.iter().filter_map(|n| Some((n.inode, n.time_wait_entered?))).collect();
        if kernel.is_empty() {
            return Ok(());
        }
        #[allow(unused_mut, reason = "the failpoint changes it")]
        let (mut ours, elsewhere): (HashMap<u32, u64>, HashMap<u32, u64>) =
            self.time_wait_counts()?.into_iter().partition(|(netns, _)| kernel.contains_key(netns));
        for netns in elsewhere.keys() {
            let _ = self.maps.time_wait_by_netns.remove(netns);
        }
        let before = std::mem::take(&mut self.time_wait_before_sweep);
        // The fault the check exists for, injected: the programs miss 5
        // entries of the namespace named (tests/time_wait.rs).
        #[cfg(feature = "failpoints")]
        if let Some(Some(netns)) = fail::eval("time-wait-unseen", failpoint_netns)
            && let Some(counted) = ours.get_mut(&netns)
        {
            *counted = counted.saturating_sub(5);
        }
        self.unseen.forget_absent(&kernel);
        self.unseen.update(&before, &kernel, &ours);
        Ok(())
    }

    /// Check the ledger of open connections, as of the last round's read,
    /// against the ESTABLISHED sockets of each namespace found quiet since
    /// (`ledger_check.rs`), while it can be whole: every older connection
    /// the start-up pass read entered, and no update it is made of lost
    /// (each loss counted apart); never in a namespace whose older
    /// connections the pass could not read. What a check found stays counted
    /// after checks stop.
    fn check_ledger(&mut self, node: &NodeReading, ledger: HashMap<u32, u64>, lost: &[u64]) {
        let left_out = &mut self.maps.left_out_at_start;
        left_out.unread.retain(|netns| node.on_node.contains(netns));
        let whole = left_out.open_connections == 0
            && [lost::OPEN_CONNECTIONS_FULL, lost::CONNECTIONS_FULL, lost::QUEUED_ENDS_FULL]
                .iter()
                .all(|&slot| lost[slot as usize] == 0);
        if !whole {
            return;
        }
        let unread = &self.maps.left_out_at_start.unread;
        let quiet: HashMap<u32, u64> = node
            .namespaces
            .iter()
            .filter_map(|n| Some((n.inode, n.quiet_established?)))
            .filter(|(netns, established)| {
                let checked = !unread.contains(netns);
                if !checked {
                    tracing::debug!(
                        netns,
                        established,
                        "the ledger of open connections not checked: the start-up pass did not read the namespace"
                    );
                }
                checked
            })
            .collect();
        #[allow(unused_mut, reason = "the failpoint changes it")]
        let mut ledger = ledger;
        // The fault the check exists for, injected: the programs missed
        // one connection's start in the namespace named
        // (tests/connections.rs).
        #[cfg(feature = "failpoints")]
        if let Some(Some(netns)) = fail::eval("connection-unseen", |arg| arg.and_then(|a| a.parse::<u32>().ok()))
            && let Some(followed) = ledger.get_mut(&netns)
        {
            *followed = followed.saturating_sub(1);
        }
        // Only namespaces that left the node: one unread for a round keeps
        // its difference, which its next check would otherwise count again.
        self.ledger_check.forget_absent(|netns| node.on_node.contains(&netns));
        self.ledger_check.update(&quiet, &ledger);
    }

    /// In the rounds whose reading has each namespace's own count of listen
    /// overflows, check the programs' against it, as TIME_WAIT's
    /// (`check_time_wait`). The programs' counts of namespaces not in the
    /// reading are dropped: gone, or not read.
    fn check_overflows(&mut self, node: &NodeReading, before: &HashMap<u32, u64>) {
        let kernel: HashMap<u32, u64> =
            node.namespaces.iter().filter_map(|n| Some((n.inode, n.listen_overflows?))).collect();
        if kernel.is_empty() {
            return;
        }
        self.overflows_by_netns.retain(|netns, _| kernel.contains_key(netns));
        #[allow(unused_mut, reason = "the failpoint changes it")]
        let mut ours = self.overflows_by_netns.clone();
        // The fault the check exists for, injected: the programs miss 2
        // overflows of the namespace named (tests/listen_overflow.rs).
        #[cfg(feature = "failpoints")]
        if let Some(Some(netns)) = fail::eval("listen-overflow-unseen", failpoint_netns)
            && let Some(counted) = ours.get_mut(&netns)
        {
            *counted = counted.saturating_sub(2);
        }
        self.unseen_overflows.forget_absent(&kernel);
        self.unseen_overflows.update(before, &kernel, &ours);
    }

    /// The programs' overflow counts of one interval, per listener. An
    /// owner the programs did not know (a listener older than observer) is
    /// the one the sweep found for that listener, if it still exists.
    fn listen_overflows(
        &self,
        counted: &[(ListenerDropKey, u64)],
        listeners: &[sock_diag::Listener],
    ) -> Vec<ListenerDrops> {
        counted
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(key, n)| {
                let l = key.listener;
                let found = || {
                    let swept =
                        listeners.iter().find(|s| s.netns == l.netns && s.port == l.port && s.family == l.family)?;
                    self.listeners.owner(swept.cookie)
                };
                let owner = if key.owner.tgid == 0 { found().unwrap_or(key.owner) } else { key.owner };
                ListenerDrops {
                    owner,
                    netns: l.netns,
                    family: l.family,
                    port: l.port,
                    reason: DropReason::from_kernel(key.reason),
                    drops: *n,
                }
            })
            .collect()
    }

    /// An inbound connection of a listener whose owner the programs did
    /// not know (one older than observer) is the owner's the sweep found
    /// for that listener, as its overflows are (`listen_overflows`).
    fn charge_to_listener_owner(&self, key: &mut ConnectionKey, listeners: &[sock_diag::Listener]) {
        if key.direction != observer_common::direction::INBOUND || key.actor.tgid != 0 {
            return;
        }
        let listener = listeners.iter().find(|l| l.netns == key.netns && l.port == key.port && l.family == key.family);
        if let Some(owner) = listener.and_then(|l| self.listeners.owner(l.cookie)) {
            key.actor = owner;
        }
    }

    /// Every connection end the programs queued since the last round.
    fn take_queued_ends(&mut self) -> Vec<QueuedEnd> {
        let mut ends = Vec::new();
        while let Ok(end) = self.maps.queued_ends.pop(0) {
            ends.push(end);
        }
        ends
    }

    /// Every listener the programs saw close since the last round.
    fn take_closed_listeners(&mut self) -> Vec<ClosedListener> {
        let mut closed = Vec::new();
        while let Ok(c) = self.maps.closed_listeners.pop(0) {
            closed.push(c);
        }
        closed
    }

    /// `actor` counted in this round: a process to check for its exit, or
    /// a cgroup's unknown owner still active.
    fn seen(&mut self, actor: &Actor, now: Instant) {
        if actor.tgid == 0 {
            self.unknown_owners.insert(actor.cgroup_id, now);
        } else {
            self.known.insert(actor.tgid);
        }
    }

    /// Take the kernel's exit notices (leader threads that exited); /proc
    /// decides below whether their process has ended (`collect`).
    fn note_exits(&mut self) {
        let tgids: Vec<u32> = self.maps.exited.keys().filter_map(Result::ok).collect();
        for tgid in tgids {
            self.noticed.insert(tgid);
            let _ = self.maps.exited.remove(&tgid);
        }
    }
}

/// Growth of a cumulative counter from `last` to `now`. A value below the
/// last one means the entry was deleted and recreated: all of it is new.
pub fn since(last: u64, now: u64) -> u64 {
    if now >= last { now - last } else { now }
}

/// Count each queued end in the interval's counts of its key, as the
/// programs would have had there been room.
fn count_queued_ends(connections: &mut Vec<(ConnectionKey, ConnectionCounts)>, ends: &[QueuedEnd]) {
    if ends.is_empty() {
        return;
    }
    let mut index: HashMap<ConnectionKey, usize> = connections.iter().enumerate().map(|(i, (k, _))| (*k, i)).collect();
    for end in ends {
        let i = *index.entry(end.key).or_insert_with(|| {
            connections.push((end.key, ConnectionCounts::default()));
            connections.len() - 1
        });
        let counts = &mut connections[i].1;
        match counts.closed.get_mut(end.bucket as usize) {
            Some(slot) => *slot += 1,
            None => counts.closed_older += 1,
        }
        counts.closed_by_peer += u64::from(end.by_peer);
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{ConnectionCounts, ConnectionKey, QueuedEnd};

    use super::{count_queued_ends, since};

    #[test]
    fn queued_ends_count_under_their_key_in_their_bucket() {
        let key = |port| ConnectionKey { port, family: 2, ..Default::default() };
        let mut connections = vec![(key(1), ConnectionCounts { established: 3, ..Default::default() })];
        let end = |port, bucket, by_peer| QueuedEnd { key: key(port), bucket, by_peer };
        count_queued_ends(&mut connections, &[end(1, 4, 1), end(2, QueuedEnd::OLDER, 0), end(2, 0, 1), end(1, 4, 0)]);
        assert_eq!(connections.len(), 2);
        let (first, second) = (&connections[0].1, &connections[1].1);
        assert_eq!((first.established, first.closed[4], first.closed_older, first.closed_by_peer), (3, 2, 0, 1));
        assert_eq!((second.established, second.closed[0], second.closed_older, second.closed_by_peer), (0, 1, 1, 1));
    }

    #[test]
    fn delta_of_a_growing_counter() {
        assert_eq!(since(10, 15), 5);
        assert_eq!(since(0, 7), 7);
        assert_eq!(since(7, 7), 0);
    }

    #[test]
    fn recreated_entry_counts_from_zero() {
        assert_eq!(since(10, 3), 3);
    }
}
