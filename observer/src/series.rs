//! The series: cumulative totals per label set, with bounded cardinality,
//! and the one place that decides who a count (or a gauge) is charged to.
//!
//! Bounds: at most `max_processes` distinct processes and
//! `max_destinations` distinct destinations get their own labels; later
//! ones are counted under `other`, so a storm of short-lived processes or a
//! scan of many addresses cannot blow up the number of series. A retired
//! process (exited longer than the grace period) frees its place. Counts are
//! never dropped: they move to the `other` series instead.
//!
//! Destinations are shared fairly: one process claims at most a quarter
//! of them (a scanner cannot take the label of the next process's
//! incident), a destination that counted nothing for the grace period
//! frees its label, and an EADDRNOTAVAIL keeps its destination beyond the
//! cap, in a reserve of a quarter more, unless EADDRNOTAVAIL toward that
//! many destinations is the flood itself (then the log says so).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use observer_common::{AF_INET6, Actor, ConnectErrorKey, ConnectionKey, buffers, direction};

use crate::{
    attribution::{Identity, PodKey, PodLabels, pod_key},
    collect::{Deltas, DropReason},
    export::contract,
};

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_processes: usize,
    pub max_destinations: usize,
    /// Series per counter; beyond, counts go to that counter's fold series.
    pub max_series: usize,
    /// Listeners per network namespace with accept-queue series of their
    /// own; the rest of the namespace's are summed (`queues.rs`).
    pub max_listeners: usize,
}

impl Limits {
    /// The defaults of `--max-processes`, `--max-destinations`,
    /// `--max-series` and `--max-listeners`.
    pub const DEFAULT: Self =
        Self { max_processes: 200, max_destinations: 100, max_series: 10_000, max_listeners: 100 };

    /// The fold series a counter can have beyond `max_series`: for connect
    /// errors one per address family and errno (Linux has ~133 errnos).
    pub const FOLD_SERIES: usize = 2 * 256;

    /// The most series any counter can have: what the OpenTelemetry SDK
    /// must allow per instrument, so it never folds on its own (its default
    /// is 2,000, beyond which it drops attributes and counts silently).
    pub fn series_ceiling(&self) -> usize {
        self.max_series + Self::FOLD_SERIES
    }
}

/// The counters the store keeps, by the instrument that exports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counter {
    Connects,
    Accepts,
    TimeWaitEntries,
    ConnectErrors,
    ListenOverflows,
    ConnectionsEstablished,
    ConnectionsClosed,
    ConnectionsClosedByPeer,
    Handshakes,
    HandshakeRetransmits,
    SynQueueFull,
}

impl Counter {
    pub const ALL: [Counter; 11] = [
        Counter::Connects,
        Counter::Accepts,
        Counter::TimeWaitEntries,
        Counter::ConnectErrors,
        Counter::ListenOverflows,
        Counter::ConnectionsEstablished,
        Counter::ConnectionsClosed,
        Counter::ConnectionsClosedByPeer,
        Counter::Handshakes,
        Counter::HandshakeRetransmits,
        Counter::SynQueueFull,
    ];

    /// The instrument it is exported as.
    pub fn contract(self) -> &'static contract::Instrument {
        match self {
            Counter::Connects => &contract::TCP_CONNECTS,
            Counter::Accepts => &contract::TCP_ACCEPTS,
            Counter::TimeWaitEntries => &contract::TCP_TIME_WAIT_ENTRIES,
            Counter::ConnectErrors => &contract::TCP_CONNECT_ERRORS,
            Counter::ListenOverflows => &contract::TCP_LISTEN_OVERFLOWS,
            Counter::ConnectionsEstablished => &contract::TCP_CONNECTIONS_ESTABLISHED,
            Counter::ConnectionsClosed => &contract::TCP_CONNECTIONS_CLOSED,
            Counter::ConnectionsClosedByPeer => &contract::TCP_CONNECTIONS_CLOSED_BY_PEER,
            Counter::Handshakes => &contract::TCP_HANDSHAKES,
            Counter::HandshakeRetransmits => &contract::TCP_HANDSHAKE_RETRANSMITS,
            Counter::SynQueueFull => &contract::TCP_SYN_QUEUE_FULL,
        }
    }

    /// The instrument's name.
    pub fn instrument(self) -> &'static str {
        self.contract().name
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Who a count is charged to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Who {
    /// `pod`: the container and pod the process runs in; None on the host.
    Process {
        pid: u32,
        name: String,
        pod: Option<Arc<PodLabels>>,
    },
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dest {
    Addr { addr: IpAddr, port: u16 },
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NetworkType {
    Ipv4,
    Ipv6,
}

impl NetworkType {
    pub fn from_family(family: u16) -> Self {
        if family == AF_INET6 { NetworkType::Ipv6 } else { NetworkType::Ipv4 }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NetworkType::Ipv4 => "ipv4",
            NetworkType::Ipv6 => "ipv6",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcSeries {
    pub who: Who,
    pub network: NetworkType,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrorSeries {
    pub who: Who,
    pub network: NetworkType,
    pub errno: u32,
    pub dest: Dest,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OverflowSeries {
    pub who: Who,
    pub network: NetworkType,
    pub port: u16,
}

/// What the kernel did with a SYN that met a full SYN queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SynQueueAction {
    /// Answered with a SYN cookie (no queued request).
    Syncookie,
    /// Dropped (syncookies off): the client resends it in 1 s.
    Drop,
}

impl SynQueueAction {
    pub fn as_str(self) -> &'static str {
        match self {
            SynQueueAction::Syncookie => "syncookie",
            SynQueueAction::Drop => "drop",
        }
    }
}

/// A listener's SYNs met with a full SYN queue, by what became of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SynQueueSeries {
    pub listener: OverflowSeries,
    pub action: SynQueueAction,
}

/// Which way a connection goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// This host connected: the far end is the server.
    Outbound,
    /// A listener here accepted it: the far end is the listener's port.
    Inbound,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }
}

/// Connections of a process: outbound to a server (`dest`), or inbound to
/// one of its listeners (`dest` is `Addr` with the unspecified address and
/// the listener's port).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionSeries {
    pub who: Who,
    pub network: NetworkType,
    pub direction: Direction,
    pub dest: Dest,
}

/// Durations as exported (connection lifetimes, handshakes): the kernel's
/// log2 ms buckets (observer-common's `lifetime`) two by two, so bounds of
/// 4^j ms, and the kernel's last (longer) bucket last; a count per bucket
/// (not cumulative: the export sums them up to each bound).
pub mod durations {
    use observer_common::{handshake, lifetime};

    /// The bounds in seconds, as the `observer.le` attribute says them.
    const BOUNDS: [&str; 11] =
        ["0.001", "0.004", "0.016", "0.064", "0.256", "1.024", "4.096", "16.384", "65.536", "262.144", "1048.576"];

    pub const LIFETIME_BUCKETS: usize = lifetime::BUCKETS / 2 + 1;
    pub const HANDSHAKE_BUCKETS: usize = handshake::BUCKETS / 2 + 1;
    pub type Lifetimes = [u64; LIFETIME_BUCKETS];
    pub type Handshakes = [u64; HANDSHAKE_BUCKETS];

    /// Kernel bucket i (<= 2^i ms) goes to exported bucket ceil(i / 2)
    /// (<= 4^j ms = 2^2j ms); the kernel's last to the last (M = N / 2 + 1).
    pub fn from_kernel<const N: usize, const M: usize>(kernel: &[u64; N]) -> [u64; M] {
        let mut out = [0; M];
        for (i, n) in kernel.iter().enumerate() {
            out[i.div_ceil(2).min(M - 1)] += n;
        }
        out
    }

    /// Counts up to and including each bound, as a histogram's buckets.
    pub fn cumulative<const M: usize>(counts: &[u64; M]) -> [u64; M] {
        let mut out = *counts;
        for j in 1..M {
            out[j] += out[j - 1];
        }
        out
    }

    /// The `observer.le` of exported bucket `j` of `buckets`.
    pub fn le(j: usize, buckets: usize) -> &'static str {
        if j + 1 == buckets { "+Inf" } else { BOUNDS[j] }
    }
}

/// A process with series of its own, named as when first seen: the pod
/// labels and the executable name are kept, so a process's series never
/// change labels (a process that renames itself, `prctl(PR_SET_NAME)`,
/// would otherwise get a new series per name, past every cap).
#[derive(Clone, Debug)]
struct Process {
    pod: Option<Arc<PodLabels>>,
    name: String,
}

impl Process {
    fn who(&self, pid: u32) -> Who {
        Who::Process { pid, name: self.name.clone(), pod: self.pod.clone() }
    }
}

/// A destination with labels of its own.
#[derive(Clone, Debug)]
struct Labelled {
    /// The process whose share it counts against (the first to need it).
    claimed_by: PodKey,
    /// Held in the EADDRNOTAVAIL reserve, beyond `max_destinations`.
    reserved: bool,
    /// The round it last counted something or had a connection open.
    last_used: u64,
}

/// One process claims at most 1/this of `max_destinations`.
pub const DESTINATION_SHARE: usize = 4;

/// The EADDRNOTAVAIL reserve: 1/this of `max_destinations` more.
pub const EADDRNOTAVAIL_RESERVE: usize = 4;

const EADDRNOTAVAIL: u32 = nix::errno::Errno::EADDRNOTAVAIL as u32;

#[derive(Clone, Default)]
pub struct SeriesStore {
    limits: Limits,
    processes: BTreeMap<PodKey, Process>,
    destinations: BTreeMap<Dest, Labelled>,
    /// Rounds applied so far: the clock of `Labelled::last_used`.
    round: u64,
    pub connects: BTreeMap<ProcSeries, u64>,
    pub accepts: BTreeMap<ProcSeries, u64>,
    pub time_wait_entries: BTreeMap<ProcSeries, u64>,
    pub connect_errors: BTreeMap<ErrorSeries, u64>,
    pub listen_overflows: BTreeMap<OverflowSeries, u64>,
    pub syn_queue_full: BTreeMap<SynQueueSeries, u64>,
    pub connections_established: BTreeMap<ConnectionSeries, u64>,
    /// By lifetime (`durations`): one series per bound.
    pub connections_closed: BTreeMap<ConnectionSeries, durations::Lifetimes>,
    /// Of those, the ones the far end closed first.
    pub connections_closed_by_peer: BTreeMap<ConnectionSeries, u64>,
    /// Outbound handshakes by how long they took (`durations`).
    pub handshakes: BTreeMap<ConnectionSeries, durations::Handshakes>,
    /// SYNs (outbound) and SYN-ACKs (inbound) sent again, counted when
    /// each handshake ended.
    pub handshake_retransmits: BTreeMap<ConnectionSeries, u64>,
    /// Updates charged to an `other` series (a cap reached), per counter.
    pub folded: BTreeMap<Counter, u64>,
    /// The caps already reported in the log (once each).
    reported: BTreeSet<&'static str>,
}

/// The port of the listen-overflow fold series (no listener has port 0).
pub const OTHER_PORT: u16 = 0;

/// A series' total: a count, or counts by lifetime.
trait Total: Default {
    fn add(&mut self, n: &Self);
}

impl Total for u64 {
    fn add(&mut self, n: &Self) {
        *self += n;
    }
}

impl<const N: usize> Total for [u64; N]
where
    [u64; N]: Default,
{
    fn add(&mut self, n: &Self) {
        for (total, n) in self.iter_mut().zip(n) {
            *total += n;
        }
    }
}

/// Add `n` to `series` in `map`, unless it is a new series and `map`
/// holds `max` already: then to `fold(series)`, one of a bounded few.
/// True if folded.
fn add<K: Ord, V: Total>(map: &mut BTreeMap<K, V>, series: K, fold: impl FnOnce(&K) -> K, n: V, max: usize) -> bool {
    if let Some(total) = map.get_mut(&series) {
        total.add(&n);
        return false;
    }
    if map.len() < max {
        map.insert(series, n);
        return false;
    }
    map.entry(fold(&series)).or_default().add(&n);
    true
}

/// Who each actor is (pod, executable), as a round resolved them.
pub type Pods = std::collections::HashMap<PodKey, Identity>;

/// The executable name to show for an actor: the one its lookup found,
/// else its `comm` (the process ended before the lookup); tgid 0 means
/// the socket's owner is unknown (it was opened before observer started).
fn name_of(actor: &Actor, identity: Option<&Identity>) -> String {
    executable_name(actor, identity.and_then(|i| i.executable.clone()))
}

/// `name_of`, given the executable its lookup `found` (if any); also
/// what `observer trace` prints.
pub(crate) fn executable_name(actor: &Actor, found: Option<String>) -> String {
    if actor.tgid == 0 {
        return "unknown".to_string();
    }
    if let Some(executable) = found {
        return executable;
    }
    let len = actor.comm.iter().position(|&b| b == 0).unwrap_or(actor.comm.len());
    String::from_utf8_lossy(&actor.comm[..len]).into_owned()
}

/// The destination address of a connect-error key.
pub fn dest_addr(key: &ConnectErrorKey) -> IpAddr {
    ip_of(key.family, &key.daddr)
}

/// An address as the kernel keys hold it (IPv4 in the first 4 bytes).
fn ip_of(family: u16, addr: &[u8; 16]) -> IpAddr {
    if family == AF_INET6 { IpAddr::from(*addr) } else { IpAddr::from([addr[0], addr[1], addr[2], addr[3]]) }
}

impl SeriesStore {
    pub fn new(limits: Limits) -> Self {
        Self { limits, ..Default::default() }
    }

    /// Who `actor`'s counts are charged to: its own series while there is
    /// room under `max_processes` (with its name and the pod labels of
    /// `pods`, kept from then on), else `other`.
    fn who(&mut self, actor: &Actor, pods: &Pods) -> Who {
        let (pid, key) = (actor.tgid, pod_key(actor));
        if let Some(process) = self.processes.get(&key) {
            return process.who(pid);
        }
        if self.processes.len() < self.limits.max_processes {
            let identity = pods.get(&key);
            let process = Process { pod: identity.and_then(|i| i.pod.clone()), name: name_of(actor, identity) };
            let who = process.who(pid);
            self.processes.insert(key, process);
            who
        } else {
            self.report("--max-processes", self.limits.max_processes, "processes");
            Who::Other
        }
    }

    /// Who a gauge of `actor` (a listener's owner) names, under the same
    /// cap and labels as its counters; None while the pod labels of a
    /// process not seen before are still being looked up.
    pub fn owner(&mut self, actor: &Actor, pods: &Pods) -> Option<Who> {
        let key = pod_key(actor);
        (self.processes.contains_key(&key) || pods.contains_key(&key)).then(|| self.who(actor, pods))
    }

    /// The destination `addr`:`port` as `actor`'s series name it: its own
    /// labels if it has them, or if there is room for it (under the cap,
    /// and under `actor`'s share of it; for an EADDRNOTAVAIL, in the
    /// reserve beyond); else `Other`.
    fn dest(&mut self, actor: &Actor, addr: IpAddr, port: u16, eaddrnotavail: bool) -> Dest {
        let dest = Dest::Addr { addr, port };
        let round = self.round;
        if let Some(labelled) = self.destinations.get_mut(&dest) {
            labelled.last_used = round;
            return dest;
        }
        let claimer = pod_key(actor);
        let max = self.limits.max_destinations;
        let share = (max / DESTINATION_SHARE).max(1);
        let (mut in_cap, mut claimed, mut reserved) = (0, 0, 0);
        for labelled in self.destinations.values() {
            if labelled.reserved {
                reserved += 1;
            } else {
                in_cap += 1;
                claimed += usize::from(labelled.claimed_by == claimer);
            }
        }
        let reserve = if in_cap < max && claimed < share {
            false
        } else if eaddrnotavail && reserved < max / EADDRNOTAVAIL_RESERVE {
            true
        } else {
            if eaddrnotavail {
                self.report_eaddrnotavail_flood();
            } else if in_cap < max {
                self.report_share(share);
            } else {
                self.report("--max-destinations", max, "destinations");
            }
            return Dest::Other;
        };
        self.destinations.insert(dest.clone(), Labelled { claimed_by: claimer, reserved: reserve, last_used: round });
        dest
    }

    /// Free the labels of the destinations that counted nothing and had
    /// no connection open for more than `idle_rounds` rounds (the grace
    /// period): their series end, as a retired process's do, and the
    /// label goes to the next destination that needs one.
    pub fn recycle_destinations(&mut self, idle_rounds: u64) {
        let round = self.round;
        let idle: BTreeSet<Dest> = self
            .destinations
            .iter()
            .filter(|(_, l)| round.saturating_sub(l.last_used) > idle_rounds)
            .map(|(d, _)| d.clone())
            .collect();
        if idle.is_empty() {
            return;
        }
        self.destinations.retain(|d, _| !idle.contains(d));
        let keep = |d: &Dest| !idle.contains(d);
        self.connect_errors.retain(|s, _| keep(&s.dest));
        self.connections_established.retain(|s, _| keep(&s.dest));
        self.connections_closed.retain(|s, _| keep(&s.dest));
        self.connections_closed_by_peer.retain(|s, _| keep(&s.dest));
        self.handshakes.retain(|s, _| keep(&s.dest));
        self.handshake_retransmits.retain(|s, _| keep(&s.dest));
    }

    /// The processes that have their own series, as their series name
    /// them. (pid 0, the sockets of unknown owner, is not a process: left
    /// out.)
    pub fn processes(&self) -> impl Iterator<Item = Who> + '_ {
        self.processes.iter().filter(|((pid, _), _)| *pid != 0).map(|((pid, _), p)| Who::Process {
            pid: *pid,
            name: p.name.clone(),
            pod: p.pod.clone(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// One log line the first time a cap folds counts, naming what to raise.
    fn report(&mut self, setting: &'static str, value: usize, what: &str) {
        if self.reported.insert(setting) {
            tracing::warn!(
                "{value} {what} have series of their own ({setting}): further ones are counted in the series marked \
                 otel_metric_overflow=\"true\" (totals stay exact; observer_series_folded_total counts the folded updates); raise {setting} \
                 to keep them apart"
            );
        }
    }

    /// One log line the first time a process is refused a destination's
    /// labels for its share, though the cap has room.
    fn report_share(&mut self, share: usize) {
        if self.reported.insert("destination share") {
            tracing::warn!(
                "a process met more than {share} destinations (a quarter of --max-destinations: a scanner, or a \
                 proxy toward ever-new addresses): its further ones count without a destination, in the series \
                 marked otel_metric_overflow=\"true\" (its totals stay exact), so that the other processes keep \
                 theirs; a destination that counts nothing for --grace frees its place; raise --max-destinations \
                 to keep more apart"
            );
        }
    }

    /// One log line the first time an EADDRNOTAVAIL finds even its reserve
    /// full.
    fn report_eaddrnotavail_flood(&mut self) {
        if self.reported.insert("EADDRNOTAVAIL reserve") {
            let reserve = self.limits.max_destinations / EADDRNOTAVAIL_RESERVE;
            tracing::warn!(
                "EADDRNOTAVAIL came toward more destinations than have labels ({} and a reserve of {reserve} for \
                 EADDRNOTAVAIL alone): the ports run out toward many destinations at once, which points at the \
                 node's port range or the connections held open across all of them rather than at one \
                 destination; its further destinations count in the series marked otel_metric_overflow=\"true\" \
                 (totals stay exact); raise --max-destinations to keep them apart",
                self.limits.max_destinations
            );
        }
    }

    /// One log line the first time the kernel folds a process's
    /// destinations (`buffers::KEYS_PER_PROCESS`).
    fn report_kernel_fold(&mut self) {
        if self.reported.insert("KEYS_PER_PROCESS") {
            tracing::warn!(
                "a process met more than {} destinations within one interval (a scanner?): its further connect() \
                 errors and connections of that interval count without a destination, in the series marked \
                 otel_metric_overflow=\"true\" (its totals stay exact); a shorter --interval keeps more \
                 destinations apart",
                buffers::KEYS_PER_PROCESS
            );
        }
    }

    /// How many series `counter` has.
    pub fn len(&self, counter: Counter) -> usize {
        match counter {
            Counter::Connects => self.connects.len(),
            Counter::Accepts => self.accepts.len(),
            Counter::TimeWaitEntries => self.time_wait_entries.len(),
            Counter::ConnectErrors => self.connect_errors.len(),
            Counter::ListenOverflows => self.listen_overflows.len(),
            Counter::ConnectionsEstablished => self.connections_established.len(),
            // Each is a series per lifetime bound.
            Counter::ConnectionsClosed => self.connections_closed.len() * durations::LIFETIME_BUCKETS,
            Counter::ConnectionsClosedByPeer => self.connections_closed_by_peer.len(),
            Counter::Handshakes => self.handshakes.len() * durations::HANDSHAKE_BUCKETS,
            Counter::HandshakeRetransmits => self.handshake_retransmits.len(),
            Counter::SynQueueFull => self.syn_queue_full.len(),
        }
    }

    pub fn apply(&mut self, deltas: &Deltas) {
        self.round += 1;
        // A reused pid's old process first: this round's counts start the
        // new process's series (its own name and pod).
        for key in &deltas.reused {
            self.retire(*key);
        }
        let max = self.limits.max_series;
        let before: u64 = self.folded.values().sum();
        for (key, d) in &deltas.procs {
            let series =
                ProcSeries { who: self.who(&key.actor, &deltas.pods), network: NetworkType::from_family(key.family) };
            let fold = |s: &ProcSeries| ProcSeries { who: Who::Other, network: s.network };
            for (counter, map, n) in [
                (Counter::Connects, &mut self.connects, d.connects),
                (Counter::Accepts, &mut self.accepts, d.accepts),
                (Counter::TimeWaitEntries, &mut self.time_wait_entries, d.time_wait_entries),
            ] {
                if n > 0 && (add(map, series.clone(), fold, n, max) || series.who == Who::Other) {
                    *self.folded.entry(counter).or_default() += 1;
                }
            }
        }
        for (key, n) in &deltas.connect_errors {
            let dest = if key.daddr == buffers::FOLDED_DADDR {
                // Folded in the kernel: the process met more destinations
                // in one interval than its share of the map.
                self.report_kernel_fold();
                Dest::Other
            } else {
                self.dest(&key.actor, dest_addr(key), key.dport, key.errno == EADDRNOTAVAIL)
            };
            let series = ErrorSeries {
                who: self.who(&key.actor, &deltas.pods),
                network: NetworkType::from_family(key.family),
                errno: key.errno,
                dest,
            };
            let capped = series.who == Who::Other || series.dest == Dest::Other;
            let fold = |s: &ErrorSeries| ErrorSeries { who: Who::Other, dest: Dest::Other, ..s.clone() };
            if add(&mut self.connect_errors, series, fold, *n, max) || capped {
                *self.folded.entry(Counter::ConnectErrors).or_default() += 1;
            }
        }
        for drop in &deltas.listen_drops {
            let series = OverflowSeries {
                who: self.who(&drop.owner, &deltas.pods),
                network: NetworkType::from_family(drop.family),
                port: drop.port,
            };
            let capped = series.who == Who::Other;
            let fold = |s: &OverflowSeries| OverflowSeries { who: Who::Other, network: s.network, port: OTHER_PORT };
            let action = match drop.reason {
                DropReason::Overflow => {
                    if add(&mut self.listen_overflows, series, fold, drop.drops, max) || capped {
                        *self.folded.entry(Counter::ListenOverflows).or_default() += 1;
                    }
                    continue;
                }
                DropReason::SynCookie => SynQueueAction::Syncookie,
                DropReason::SynDrop => SynQueueAction::Drop,
            };
            let series = SynQueueSeries { listener: series, action };
            let fold = |s: &SynQueueSeries| SynQueueSeries { listener: fold(&s.listener), action: s.action };
            if add(&mut self.syn_queue_full, series, fold, drop.drops, max) || capped {
                *self.folded.entry(Counter::SynQueueFull).or_default() += 1;
            }
        }
        for (key, counts) in &deltas.connections {
            let Some(series) = self.connection_series(key, |store, actor| Some(store.who(actor, &deltas.pods))) else {
                continue;
            };
            let capped = series.who == Who::Other || series.dest == Dest::Other;
            let fold = |s: &ConnectionSeries| ConnectionSeries { who: Who::Other, dest: Dest::Other, ..s.clone() };
            if counts.established > 0
                && (add(&mut self.connections_established, series.clone(), fold, counts.established, max) || capped)
            {
                *self.folded.entry(Counter::ConnectionsEstablished).or_default() += 1;
            }
            if counts.handshake_retransmits > 0
                && (add(&mut self.handshake_retransmits, series.clone(), fold, counts.handshake_retransmits, max)
                    || capped)
            {
                *self.folded.entry(Counter::HandshakeRetransmits).or_default() += 1;
            }
            if counts.closed_by_peer > 0
                && (add(&mut self.connections_closed_by_peer, series.clone(), fold, counts.closed_by_peer, max)
                    || capped)
            {
                *self.folded.entry(Counter::ConnectionsClosedByPeer).or_default() += 1;
            }
            let handshakes: durations::Handshakes = durations::from_kernel(&counts.handshakes);
            if handshakes.iter().any(|n| *n > 0) {
                let max = max / durations::HANDSHAKE_BUCKETS;
                if add(&mut self.handshakes, series.clone(), fold, handshakes, max) || capped {
                    *self.folded.entry(Counter::Handshakes).or_default() += 1;
                }
            }
            let closed: durations::Lifetimes = durations::from_kernel(&counts.closed);
            if closed.iter().any(|n| *n > 0) {
                let max = max / durations::LIFETIME_BUCKETS;
                if add(&mut self.connections_closed, series, fold, closed, max) || capped {
                    *self.folded.entry(Counter::ConnectionsClosed).or_default() += 1;
                }
            }
        }
        for key in &deltas.retired {
            self.retire(*key);
        }
        let series_capped = Counter::ALL.iter().any(|c| self.len(*c) >= max);
        if series_capped && self.folded.values().sum::<u64>() > before {
            self.report("--max-series", max, "series per counter");
        }
    }

    /// Forget a process that exited more than the grace period ago (or the
    /// unknown owner of a cgroup, idle as long): its slot and its series.
    /// The series of a kernel connection key, its process named by
    /// `name` (None: not named yet, as `owner` says while labels are
    /// pending). Outbound destinations share `--max-destinations` with
    /// the connect errors'; a listener's port needs no cap (the kernel's
    /// ports bound it).
    fn connection_series(
        &mut self,
        key: &ConnectionKey,
        name: impl FnOnce(&mut Self, &Actor) -> Option<Who>,
    ) -> Option<ConnectionSeries> {
        let who = name(self, &key.actor)?;
        let network = NetworkType::from_family(key.family);
        let (direction, dest) = if key.direction == direction::INBOUND {
            let unspecified = ip_of(key.family, &[0; 16]);
            (Direction::Inbound, Dest::Addr { addr: unspecified, port: key.port })
        } else if key.addr == buffers::FOLDED_DADDR {
            self.report_kernel_fold();
            (Direction::Outbound, Dest::Other)
        } else {
            (Direction::Outbound, self.dest(&key.actor, ip_of(key.family, &key.addr), key.port, false))
        };
        Some(ConnectionSeries { who, network, direction, dest })
    }

    /// The connections open now, per series, from the ledger of kernel
    /// keys (`Deltas::open_connections`); a process whose pod labels are
    /// still pending is named from the next round on.
    pub fn open_connections(&mut self, open: &[(ConnectionKey, u64)], pods: &Pods) -> BTreeMap<ConnectionSeries, u64> {
        let mut gauges = BTreeMap::new();
        for (key, n) in open {
            if let Some(series) = self.connection_series(key, |store, actor| store.owner(actor, pods)) {
                *gauges.entry(series).or_default() += n;
            }
        }
        gauges
    }

    fn retire(&mut self, key: PodKey) {
        let Some(process) = self.processes.remove(&key) else { return };
        let who = process.who(key.0);
        // The unknown owners (pid 0) of two cgroups with the same pod labels
        // (or none) share their series: those stay while one of them lives.
        if self.processes.iter().any(|(k, p)| p.who(k.0) == who) {
            return;
        }
        let keep = |w: &Who| *w != who;
        self.connects.retain(|s, _| keep(&s.who));
        self.accepts.retain(|s, _| keep(&s.who));
        self.time_wait_entries.retain(|s, _| keep(&s.who));
        self.connect_errors.retain(|s, _| keep(&s.who));
        self.listen_overflows.retain(|s, _| keep(&s.who));
        self.syn_queue_full.retain(|s, _| keep(&s.listener.who));
        self.connections_established.retain(|s, _| keep(&s.who));
        self.connections_closed.retain(|s, _| keep(&s.who));
        self.connections_closed_by_peer.retain(|s, _| keep(&s.who));
        self.handshakes.retain(|s, _| keep(&s.who));
        self.handshake_retransmits.retain(|s, _| keep(&s.who));
        let used: BTreeSet<Dest> = self
            .connect_errors
            .keys()
            .map(|s| &s.dest)
            .chain(self.connections_established.keys().map(|s| &s.dest))
            .chain(self.connections_closed.keys().map(|s| &s.dest))
            .chain(self.connections_closed_by_peer.keys().map(|s| &s.dest))
            .chain(self.handshakes.keys().map(|s| &s.dest))
            .chain(self.handshake_retransmits.keys().map(|s| &s.dest))
            .cloned()
            .collect();
        self.destinations.retain(|d, _| used.contains(d));
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{AF_INET, ProcCounters, ProcKey};

    use super::*;

    fn actor(tgid: u32, comm: &str) -> Actor {
        let mut a = Actor { tgid, ..Default::default() };
        a.comm[..comm.len()].copy_from_slice(comm.as_bytes());
        a
    }

    fn connects(tgid: u32, n: u64) -> (ProcKey, ProcCounters) {
        (
            ProcKey { actor: actor(tgid, "curl"), family: AF_INET, _pad: [0; 3] },
            ProcCounters { connects: n, ..Default::default() },
        )
    }

    fn error(tgid: u32, last_octet: u8, n: u64) -> (ConnectErrorKey, u64) {
        error_with(tgid, last_octet, EADDRNOTAVAIL, n)
    }

    const ECONNREFUSED: u32 = 111;

    fn error_with(tgid: u32, last_octet: u8, errno: u32, n: u64) -> (ConnectErrorKey, u64) {
        let mut daddr = [0u8; 16];
        daddr[..4].copy_from_slice(&[10, 0, 0, last_octet]);
        (ConnectErrorKey { actor: actor(tgid, "client"), family: AF_INET, dport: 8080, errno, daddr }, n)
    }

    /// The destinations (last octets of 10.0.0.x) `tgid`'s errors are
    /// labelled with, and its errors counted without one.
    fn labelled(s: &SeriesStore, tgid: u32) -> (Vec<u8>, u64) {
        let mine = s.connect_errors.iter().filter(|(k, _)| matches!(k.who, Who::Process { pid, .. } if pid == tgid));
        let (mut octets, mut other) = (Vec::new(), 0);
        for (k, n) in mine {
            match k.dest {
                Dest::Addr { addr: IpAddr::V4(a), .. } => octets.push(a.octets()[3]),
                _ => other += n,
            }
        }
        (octets, other)
    }

    #[test]
    fn a_process_claims_at_most_a_quarter_of_the_destinations() {
        let mut s = SeriesStore::new(Limits { max_destinations: 8, ..Limits::DEFAULT });
        let scan: Vec<_> = (1..=5).map(|octet| error_with(1, octet, ECONNREFUSED, 1)).collect();
        s.apply(&Deltas { connect_errors: scan, ..Default::default() });
        s.apply(&Deltas { connect_errors: vec![error_with(2, 9, ECONNREFUSED, 4)], ..Default::default() });
        assert_eq!(labelled(&s, 1), (vec![1, 2], 3), "the scanner: its share, the rest without a destination");
        assert_eq!(labelled(&s, 2), (vec![9], 0), "the next process keeps its destination");
        // A destination another process claimed costs nothing of a share.
        s.apply(&Deltas { connect_errors: vec![error_with(2, 1, ECONNREFUSED, 1)], ..Default::default() });
        assert_eq!(labelled(&s, 2), (vec![1, 9], 0));
        assert_eq!(s.connect_errors.values().sum::<u64>(), 10, "nothing lost");
    }

    #[test]
    fn an_eaddrnotavail_keeps_its_destination_past_a_full_cap_until_it_is_the_flood() {
        let mut s = SeriesStore::new(Limits { max_destinations: 4, ..Limits::DEFAULT });
        // Four processes, a destination each: the cap is full.
        let errors: Vec<_> = (1..=4).map(|p| error_with(p, p as u8, ECONNREFUSED, 1)).collect();
        s.apply(&Deltas { connect_errors: errors, ..Default::default() });
        s.apply(&Deltas {
            connect_errors: vec![error_with(5, 5, ECONNREFUSED, 1), error(6, 6, 6), error(7, 7, 2)],
            ..Default::default()
        });
        assert_eq!(labelled(&s, 5), (vec![], 1), "past the cap");
        assert_eq!(labelled(&s, 6), (vec![6], 0), "an EADDRNOTAVAIL in the reserve (one, a quarter of 4)");
        assert_eq!(labelled(&s, 7), (vec![], 2), "the reserve full: the flood itself, folded (and logged)");
        assert!(s.reported.contains("EADDRNOTAVAIL reserve"));
    }

    #[test]
    fn a_destination_idle_for_the_grace_period_frees_its_label() {
        let mut s = SeriesStore::new(Limits { max_destinations: 1, ..Limits::DEFAULT });
        s.apply(&Deltas { connect_errors: vec![error_with(1, 1, ECONNREFUSED, 3)], ..Default::default() });
        for _ in 0..3 {
            s.apply(&Deltas::default());
            s.recycle_destinations(3);
        }
        assert_eq!(labelled(&s, 1), (vec![1], 0), "idle for 3 rounds: kept");
        s.apply(&Deltas::default());
        s.recycle_destinations(3);
        assert!(s.connect_errors.is_empty(), "idle for 4: its series ended");
        s.apply(&Deltas { connect_errors: vec![error_with(2, 2, ECONNREFUSED, 1)], ..Default::default() });
        assert_eq!(labelled(&s, 2), (vec![2], 0), "the label went to the next destination");
        // One that keeps counting keeps its label.
        for _ in 0..10 {
            s.apply(&Deltas { connect_errors: vec![error_with(2, 2, ECONNREFUSED, 1)], ..Default::default() });
            s.recycle_destinations(3);
        }
        assert_eq!(labelled(&s, 2), (vec![2], 0));
    }

    #[test]
    fn kernel_duration_buckets_are_exported_two_by_two_with_the_longest_last() {
        let mut kernel = [0u64; observer_common::handshake::BUCKETS];
        kernel[0] = 1; // <= 1 ms
        kernel[1] = 2; // <= 2 ms
        kernel[2] = 4; // <= 4 ms
        kernel[11] = 8; // <= 2048 ms
        kernel[15] = 16; // longer than 16 s
        let exported: durations::Handshakes = durations::from_kernel(&kernel);
        assert_eq!(exported, [1, 6, 0, 0, 0, 0, 8, 0, 16]);
        assert_eq!(durations::cumulative(&exported), [1, 7, 7, 7, 7, 7, 15, 15, 31]);
        assert_eq!(
            (durations::le(1, durations::HANDSHAKE_BUCKETS), durations::le(6, durations::HANDSHAKE_BUCKETS)),
            ("0.004", "4.096")
        );
        assert_eq!(durations::le(8, durations::HANDSHAKE_BUCKETS), "+Inf");
        assert_eq!(durations::le(10, durations::LIFETIME_BUCKETS), "1048.576");
    }

    #[test]
    fn deltas_accumulate_per_process() {
        let mut s = SeriesStore::new(Limits::default());
        s.apply(&Deltas { procs: vec![connects(1, 2)], ..Default::default() });
        s.apply(&Deltas { procs: vec![connects(1, 3), connects(2, 1)], ..Default::default() });
        let total: Vec<u64> = s.connects.values().copied().collect();
        assert_eq!(total, vec![5, 1]);
        assert!(s.accepts.is_empty(), "zero deltas create no series");
    }

    #[test]
    fn processes_beyond_the_limit_go_to_other_without_losing_counts() {
        let mut s = SeriesStore::new(Limits { max_processes: 2, max_destinations: 10, ..Limits::DEFAULT });
        s.apply(&Deltas {
            procs: vec![connects(1, 1), connects(2, 1), connects(3, 4), connects(4, 5)],
            ..Default::default()
        });
        assert_eq!(s.connects.len(), 3);
        let other = ProcSeries { who: Who::Other, network: NetworkType::Ipv4 };
        assert_eq!(s.connects[&other], 9);
        assert_eq!(s.connects.values().sum::<u64>(), 11);
    }

    #[test]
    fn destinations_beyond_the_limit_go_to_other() {
        let mut s = SeriesStore::new(Limits { max_processes: 10, max_destinations: 1, ..Limits::DEFAULT });
        s.apply(&Deltas { connect_errors: vec![error(1, 1, 2), error(1, 2, 3)], ..Default::default() });
        let dests: Vec<&Dest> = s.connect_errors.keys().map(|k| &k.dest).collect();
        assert!(matches!(dests[0], Dest::Addr { .. }));
        assert_eq!(dests[1], &Dest::Other);
        assert_eq!(s.connect_errors.values().sum::<u64>(), 5);
    }

    #[test]
    fn series_beyond_the_limit_fold_into_one_per_errno_and_nothing_is_lost() {
        let mut s = SeriesStore::new(Limits { max_series: 2, ..Limits::DEFAULT });
        s.apply(&Deltas {
            connect_errors: vec![error(1, 1, 1), error(1, 2, 2), error(1, 3, 3), error(2, 4, 4)],
            ..Default::default()
        });
        assert_eq!(s.connect_errors.len(), 3, "two series and one fold series");
        let fold = s.connect_errors.keys().find(|k| k.who == Who::Other).unwrap();
        assert_eq!((&fold.dest, fold.errno), (&Dest::Other, 99));
        assert_eq!(s.connect_errors[fold], 7);
        assert_eq!(s.connect_errors.values().sum::<u64>(), 10);
        assert_eq!(s.folded[&Counter::ConnectErrors], 2);
        // A series that exists keeps counting; the fold stays bounded.
        s.apply(&Deltas { connect_errors: vec![error(1, 1, 5), error(3, 5, 1)], ..Default::default() });
        assert_eq!(s.connect_errors.len(), 3);
        assert_eq!(s.connect_errors.values().sum::<u64>(), 16);
    }

    #[test]
    fn a_listeners_full_syn_queue_is_counted_apart_from_its_overflows_and_folds_by_action() {
        use crate::collect::{DropReason, ListenerDrops};
        let drops = |tgid: u32, port: u16, reason: DropReason, drops: u64| ListenerDrops {
            owner: actor(tgid, "nginx"),
            netns: 1,
            family: AF_INET,
            port,
            reason,
            drops,
        };
        let mut s = SeriesStore::new(Limits { max_series: 2, ..Limits::DEFAULT });
        s.apply(&Deltas {
            listen_drops: vec![
                drops(1, 80, DropReason::Overflow, 3),
                drops(1, 80, DropReason::SynCookie, 5),
                drops(1, 80, DropReason::SynDrop, 7),
                drops(1, 443, DropReason::SynDrop, 11),
            ],
            ..Default::default()
        });
        assert_eq!(s.listen_overflows.values().sum::<u64>(), 3, "overflows alone");
        let by_action = |action| s.syn_queue_full.iter().filter(|(k, _)| k.action == action).map(|(_, n)| n).sum();
        assert_eq!((by_action(SynQueueAction::Syncookie), by_action(SynQueueAction::Drop)), (5u64, 18u64));
        // Past the cap, port 443's drops fold, still as drops.
        let fold = s.syn_queue_full.keys().find(|k| k.listener.who == Who::Other).expect("a fold series");
        assert_eq!((fold.listener.port, fold.action, s.syn_queue_full[fold]), (OTHER_PORT, SynQueueAction::Drop, 11));
        assert_eq!(s.folded[&Counter::SynQueueFull], 1);
    }

    #[test]
    fn retiring_frees_the_slot_and_drops_the_series() {
        let mut s = SeriesStore::new(Limits { max_processes: 1, max_destinations: 10, ..Limits::DEFAULT });
        s.apply(&Deltas { procs: vec![connects(1, 1)], connect_errors: vec![error(1, 1, 1)], ..Default::default() });
        s.apply(&Deltas { retired: vec![(1, 0)], ..Default::default() });
        assert!(s.connects.is_empty() && s.connect_errors.is_empty());
        s.apply(&Deltas { procs: vec![connects(2, 1)], ..Default::default() });
        assert!(matches!(s.connects.keys().next().unwrap().who, Who::Process { pid: 2, .. }));
    }

    #[test]
    fn unknown_owners_of_two_cgroups_share_a_series_until_both_are_retired() {
        let mut s = SeriesStore::new(Limits::DEFAULT);
        let unknown = |cgroup_id| ProcKey { actor: Actor { cgroup_id, ..Default::default() }, family: 2, _pad: [0; 3] };
        let tw = ProcCounters { time_wait_entries: 1, ..Default::default() };
        s.apply(&Deltas { procs: vec![(unknown(7), tw), (unknown(8), tw)], ..Default::default() });
        assert_eq!(s.time_wait_entries.values().copied().collect::<Vec<_>>(), vec![2], "one host series");
        s.apply(&Deltas { retired: vec![(0, 7)], ..Default::default() });
        assert_eq!(s.time_wait_entries.len(), 1, "cgroup 8's unknown owner still counts there");
        s.apply(&Deltas { retired: vec![(0, 8)], ..Default::default() });
        assert!(s.time_wait_entries.is_empty() && s.processes.is_empty());
    }

    #[test]
    fn a_process_keeps_the_pod_labels_it_was_first_seen_with() {
        let pod = Arc::new(PodLabels {
            container_id: "c".repeat(64),
            pod_uid: "u".into(),
            pod_name: Some("api-1".into()),
            namespace: Some("shop".into()),
            container_name: None,
        });
        let mut s = SeriesStore::new(Limits::default());
        let pods = [((1, 0), Identity { pod: Some(pod.clone()), executable: None }), ((2, 0), Identity::default())]
            .into_iter()
            .collect();
        s.apply(&Deltas { procs: vec![connects(1, 1), connects(2, 1)], pods, ..Default::default() });
        // Later rounds resolve nothing new: the labels stay, one series each.
        s.apply(&Deltas { procs: vec![connects(1, 2), connects(2, 2)], ..Default::default() });
        let whos: Vec<(&Who, u64)> = s.connects.iter().map(|(k, v)| (&k.who, *v)).collect();
        assert_eq!(whos.len(), 2);
        assert!(
            matches!(whos[0], (Who::Process { pid: 1, pod: Some(p), .. }, 3) if p.pod_name.as_deref() == Some("api-1"))
        );
        assert!(matches!(whos[1], (Who::Process { pid: 2, pod: None, .. }, 3)));
    }

    #[test]
    fn a_process_that_renames_itself_keeps_one_series_and_its_first_name() {
        let mut s = SeriesStore::new(Limits { max_processes: 1, ..Limits::DEFAULT });
        let renamed = |n: u64, comm: &str| {
            (
                ProcKey { actor: actor(7, comm), family: AF_INET, _pad: [0; 3] },
                ProcCounters { connects: n, ..Default::default() },
            )
        };
        s.apply(&Deltas { procs: vec![renamed(1, "worker-1"), renamed(2, "worker-2")], ..Default::default() });
        s.apply(&Deltas { procs: vec![renamed(3, "worker-3")], ..Default::default() });
        let series: Vec<(&Who, &u64)> = s.connects.iter().map(|(k, v)| (&k.who, v)).collect();
        assert!(matches!(series[..], [(Who::Process { pid: 7, name, .. }, 6)] if name == "worker-1"), "{series:?}");
        assert!(!s.folded.contains_key(&Counter::Connects), "no fold: it is one process");
    }

    #[test]
    fn a_process_is_named_by_its_executable_else_its_comm_and_an_unknown_owner_unknown() {
        let found = Identity { pod: None, executable: Some("kube-controller-manager".into()) };
        assert_eq!(name_of(&actor(5, "kube-controller"), Some(&found)), "kube-controller-manager");
        assert_eq!(name_of(&actor(5, "nginx"), Some(&Identity::default())), "nginx", "ended before its lookup");
        assert_eq!(name_of(&actor(5, "nginx"), None), "nginx");
        assert_eq!(name_of(&Actor::default(), None), "unknown");
    }
}
