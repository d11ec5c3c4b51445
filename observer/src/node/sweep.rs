//! Every network namespace, every round, at a cost that does not multiply
//! with the pods.
//!
//! Only a dump of a namespace's connections tells its ports per
//! destination, and every such dump walks the node's whole established
//! hash (every namespace's sockets) to pick the namespace's own: dumping
//! 110 pods at 100k sockets costs 110 walks of 100k. So each round reads
//! every namespace's cheap parts, from files held open since the namespace
//! was first seen (no setns, no open): its listeners (their own small
//! hash), its settings and its screen (`screen.rs`). Then it dumps:
//! - at once, a *hot* namespace, one whose screen says some destination
//!   could hold half of its ports or more, if anything changed since its
//!   last dump: a namespace near a ceiling is never the one waiting;
//! - a *cold* one when it changed since its last dump (or was never
//!   dumped, or its dump is older than `MAX_AGE`), the longest waiting
//!   first, while the round's cold dumps take less than 1% of the interval
//!   (at least one per round).
//!
//! Between dumps a namespace keeps the destinations of its last one: exact
//! when nothing changed (same screen, settings and listeners), else a cold
//! namespace waiting its turn, counted as `deferred`. At a quiet moment
//! every namespace is exact after as many rounds as cold namespaces
//! changed, divided by the dumps a budget allows.
use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{
    NetnsReading, NetnsUsage, NodeReading,
    conntrack::{self, Conntrack, ConntrackFiles},
    netns,
    screen::{Screen, ScreenFiles},
    settings::{NetSettings, SettingsFiles},
    sock_diag::{DiagSocket, Listener},
    usage::{self, SocketCounts},
};

/// A namespace one of whose destinations could hold this share of its
/// ports is dumped whenever it changes (below the warning at 70%, so a
/// namespace heading for one is read each round before it gets there).
pub const HOT_SHARE: f64 = 0.5;

/// A cold namespace's dump is redone at least this often, changed or not.
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// Every this many rounds, each namespace's own counts of TIME_WAIT
/// entries and listen overflows are read for the check against observer's
/// (`collect::unseen`): a larger file than the others, and the check needs
/// no hurry.
pub const KERNEL_CHECK_EVERY: u64 = 10;

/// The cold namespaces' dumps may take 1/this of the interval per round
/// (1%: 10 ms at 1 s, three dumps at 100k sockets).
pub const COLD_BUDGET_SHARE: u32 = 100;

/// File descriptors `NetnsFiles` holds (the daemon's): a sock_diag socket,
/// sockstat, sockstat6, snmp, netstat, the 7 settings' sysctl files and the
/// conntrack table's 3.
pub const FILES_PER_NAMESPACE: u64 = 12 + conntrack::FILES;

/// One namespace's kernel interfaces, opened from inside it, read from any
/// thread afterwards. Held open, they keep the namespace alive: they are
/// closed a round after no process or bind mount holds it any more.
pub struct NetnsFiles {
    diag: DiagSocket,
    screen: ScreenFiles,
    settings: SettingsFiles,
    /// None where nf_conntrack is not loaded.
    conntrack: Option<ConntrackFiles>,
}

impl NetnsFiles {
    /// The calling thread's namespace's files; `follow_changes` when they
    /// are read round after round (the daemon), not once (doctor).
    pub fn open(follow_changes: bool) -> io::Result<Self> {
        Ok(Self {
            diag: DiagSocket::open()?,
            screen: ScreenFiles::open(follow_changes)?,
            settings: SettingsFiles::open()?,
            conntrack: ConntrackFiles::open(),
        })
    }

    /// The cheap parts: listeners, settings, screen, conntrack table.
    pub fn glance(&mut self, inode: u32) -> io::Result<Glance> {
        Ok(Glance {
            listeners: self.diag.listeners(inode)?,
            settings: self.settings.read()?,
            screen: self.screen.read()?,
            // A table that cannot be read leaves out its gauges only.
            conntrack: self.conntrack.as_ref().and_then(|files| {
                files.read().map_err(|e| tracing::debug!(netns = inode, error = %e, "conntrack table unread")).ok()
            }),
        })
    }

    /// Ports per destination and TIME_WAIT: the expensive part.
    pub fn dump(&mut self, glance: &Glance) -> io::Result<SocketCounts> {
        usage::count(&mut self.diag, &glance.settings, &glance.listeners)
    }
}

/// A namespace's cheap parts, read each round.
pub struct Glance {
    pub listeners: Vec<Listener>,
    pub settings: NetSettings,
    pub screen: Screen,
    pub conntrack: Option<Conntrack>,
}

impl Glance {
    /// Whether some destination could hold `share` of its ports (the
    /// sockets that hold any port, against the ports one destination can
    /// have: the range minus the reserved and the listened-on ones), or
    /// TIME_WAIT `share` of tcp_max_tw_buckets.
    pub fn could_reach(&self, share: f64) -> bool {
        let listened = self.listeners.iter().filter(|l| self.settings.is_ephemeral(l.port)).count() as u64;
        let ports = u64::from(self.settings.ephemeral_ports()).saturating_sub(listened);
        self.screen.port_holders() as f64 >= share * ports as f64
            || self.screen.minisockets as f64 >= share * f64::from(self.settings.tcp_max_tw_buckets)
    }

    /// What a dump depends on: equal keys, equal dumps.
    fn key(&self) -> DumpKey {
        let mut listened: Vec<u16> = self.listeners.iter().map(|l| l.port).collect();
        listened.sort_unstable();
        DumpKey { screen: self.screen, settings: self.settings.clone(), listened }
    }

    fn usage(self, counts: Option<SocketCounts>) -> (Vec<Listener>, NetnsUsage) {
        let usage = NetnsUsage {
            port_holders: self.screen.port_holders(),
            minisockets: self.screen.minisockets,
            settings: self.settings,
            counts,
            conntrack: self.conntrack,
        };
        (self.listeners, usage)
    }
}

#[derive(Clone, PartialEq, Eq)]
struct DumpKey {
    screen: Screen,
    settings: NetSettings,
    listened: Vec<u16>,
}

struct LastDump {
    key: DumpKey,
    counts: SocketCounts,
    at: Instant,
}

struct Tracked {
    files: NetnsFiles,
    last: Option<LastDump>,
}

/// How the namespaces of one sweep were read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepCounts {
    /// Destinations exact as of this round: dumped now, or unchanged since.
    pub current: u64,
    /// Namespaces that changed and wait for a dump (cold ones beyond the
    /// round's budget, or a dump that failed): their last destinations are
    /// exported meanwhile.
    pub deferred: u64,
    /// Found but not read: beyond `--max-namespaces`, or their files could
    /// not be opened or read.
    pub unread: u64,
}

/// The daemon's sweep, round after round.
pub struct Sweeper {
    proc_root: PathBuf,
    max_namespaces: usize,
    cold_budget: Duration,
    host: Option<u32>,
    tracked: BTreeMap<u32, Tracked>,
    /// The files of the namespaces gone this round, held one round more:
    /// a server killed with its pod closes its listener and its namespace
    /// at once, and the round's count of its overflows is read after the
    /// sweep (`listen_overflows`).
    gone: BTreeMap<u32, Tracked>,
    /// Namespaces left out last round for the bound (logged on change).
    skipped: usize,
    rounds: u64,
    /// Read each namespace's count of TIME_WAIT entries every
    /// `KERNEL_CHECK_EVERY` rounds (off where the kernel counts them
    /// only when they end).
    pub check_time_wait: bool,
    /// The same for listen overflows (on where programs count them).
    pub check_overflows: bool,
}

impl Sweeper {
    pub fn new(proc_root: &Path, max_namespaces: usize, interval: Duration) -> Self {
        Self {
            proc_root: proc_root.to_path_buf(),
            max_namespaces,
            cold_budget: interval / COLD_BUDGET_SHARE,
            host: netns::host(proc_root),
            tracked: BTreeMap::new(),
            gone: BTreeMap::new(),
            skipped: 0,
            rounds: 0,
            check_time_wait: true,
            check_overflows: false,
        }
    }

    /// Read every namespace of the node.
    pub fn sweep(&mut self) -> NodeReading {
        let mut counts = SweepCounts::default();
        self.rounds += 1;
        let check = (self.check_time_wait || self.check_overflows) && self.rounds % KERNEL_CHECK_EVERY == 1;
        let found = netns::all(&self.proc_root);
        let pids: BTreeMap<u32, u32> =
            found.iter().filter_map(|(inode, path)| Some((*inode, netns::pid_of(path)?))).collect();
        counts.unread += self.track(found);

        // Every namespace's cheap parts, and whether its last dump still
        // holds.
        let mut glanced = BTreeMap::new();
        let mut candidates = Vec::new();
        for (&inode, tracked) in &mut self.tracked {
            let Ok(glance) = tracked.files.glance(inode) else {
                counts.unread += 1;
                continue;
            };
            let key = glance.key();
            let stale = match &tracked.last {
                None => true,
                Some(last) => last.key != key || last.at.elapsed() > MAX_AGE,
            };
            if stale {
                let last = tracked.last.as_ref().map(|l| l.at);
                candidates.push(Candidate { inode, hot: glance.could_reach(HOT_SHARE), last });
            }
            glanced.insert(inode, (glance, key));
        }

        let (hot, cold) = dump_order(candidates);
        let mut deferred = BTreeSet::new();
        let mut dump_now = |inode: u32| {
            let (glance, key) = &glanced[&inode];
            let tracked = self.tracked.get_mut(&inode).expect("glanced this round");
            if !dump(inode, tracked, glance, key.clone()) {
                deferred.insert(inode);
            }
        };
        hot.into_iter().for_each(&mut dump_now);
        let cold_started = Instant::now();
        let mut waiting = Vec::new();
        for (i, inode) in cold.into_iter().enumerate() {
            // The first always goes: a budget never starves them.
            if i > 0 && cold_started.elapsed() >= self.cold_budget {
                waiting.push(inode);
            } else {
                dump_now(inode);
            }
        }
        deferred.extend(waiting);

        let namespaces = glanced
            .into_iter()
            .map(|(inode, (glance, _))| {
                let last = &self.tracked[&inode].last;
                if deferred.contains(&inode) {
                    counts.deferred += 1;
                } else if last.is_some() {
                    counts.current += 1;
                }
                let (listeners, usage) = glance.usage(last.as_ref().map(|l| l.counts.clone()));
                let pid = pids.get(&inode).copied();
                let files = &self.tracked[&inode].files;
                let kernel = if check { files.screen.kernel_counts().ok().flatten() } else { None };
                NetnsReading {
                    inode,
                    name: self.name(inode),
                    pid,
                    listeners,
                    usage: Some(usage),
                    time_wait_entered: kernel.filter(|_| self.check_time_wait).map(|k| k.time_wait_entered),
                    listen_overflows: kernel.filter(|_| self.check_overflows).map(|k| k.listen_overflows),
                }
            })
            .collect();
        NodeReading { namespaces, counts }
    }

    /// A namespace's own count of listen overflows now (TcpExtListenOverflows),
    /// from the file held open in it; None if it is not held or unreadable.
    pub fn listen_overflows(&self, inode: u32) -> Option<u64> {
        let tracked = self.tracked.get(&inode).or_else(|| self.gone.get(&inode))?;
        let counts = tracked.files.screen.kernel_counts().ok()??;
        Some(counts.listen_overflows)
    }

    /// Hold files open in the namespaces `found` (up to the bound), close
    /// those of the ones gone so they can go; how many are left unread.
    fn track(&mut self, found: BTreeMap<u32, PathBuf>) -> u64 {
        let (kept, gone) =
            std::mem::take(&mut self.tracked).into_iter().partition(|(inode, _)| found.contains_key(inode));
        (self.tracked, self.gone) = (kept, gone);
        let room = self.max_namespaces.saturating_sub(self.tracked.len());
        let new: BTreeMap<u32, PathBuf> =
            found.into_iter().filter(|(inode, _)| !self.tracked.contains_key(inode)).collect();
        let skipped = new.len().saturating_sub(room);
        if skipped != self.skipped && skipped > 0 {
            tracing::warn!(
                skipped,
                max = self.max_namespaces,
                "network namespaces not read: more than --max-namespaces; raise it to read them"
            );
        }
        self.skipped = skipped;
        let (opened, failed) = open_in_each(new.into_iter().take(room).collect());
        for (inode, files) in opened {
            self.tracked.insert(inode, Tracked { files, last: None });
        }
        (skipped + failed) as u64
    }

    /// "host", or the namespace's inode number (stable for its life,
    /// unlike a pid).
    fn name(&self, inode: u32) -> String {
        if Some(inode) == self.host { "host".to_string() } else { inode.to_string() }
    }
}

/// A namespace whose last dump no longer holds.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    inode: u32,
    /// Some destination could hold `HOT_SHARE` of its ports (or TIME_WAIT of
    /// its ceiling).
    hot: bool,
    /// When it was last dumped (None: never).
    last: Option<Instant>,
}

/// The round's dumps in order: every hot namespace (all of them, always),
/// then the cold ones, never dumped first, then the longest waiting.
fn dump_order(mut candidates: Vec<Candidate>) -> (Vec<u32>, Vec<u32>) {
    candidates.sort_by_key(|c| (!c.hot, c.last, c.inode));
    let (hot, cold): (Vec<Candidate>, Vec<Candidate>) = candidates.into_iter().partition(|c| c.hot);
    (hot.iter().map(|c| c.inode).collect(), cold.iter().map(|c| c.inode).collect())
}

/// Dump a namespace; on failure it keeps its last dump and is retried
/// next round (false).
fn dump(inode: u32, tracked: &mut Tracked, glance: &Glance, key: DumpKey) -> bool {
    match tracked.files.dump(glance) {
        Ok(counts) => {
            tracked.last = Some(LastDump { key, counts, at: Instant::now() });
            true
        }
        Err(e) => {
            tracing::debug!(netns = inode, error = %e, "dump of the namespace's sockets failed");
            false
        }
    }
}

/// Open each namespace's files from inside it; how many could not be.
fn open_in_each(namespaces: BTreeMap<u32, PathBuf>) -> (Vec<(u32, NetnsFiles)>, usize) {
    if namespaces.is_empty() {
        return (Vec::new(), 0);
    }
    let wanted = namespaces.len();
    let opened = netns::in_each_namespace(namespaces, |inode| match NetnsFiles::open(true) {
        Ok(files) => Some((inode, files)),
        Err(e) => {
            // EMFILE names the limit to raise.
            tracing::warn!(netns = inode, error = %e, "cannot open the namespace's sock_diag socket and files");
            None
        }
    });
    let failed = wanted - opened.len();
    (opened, failed)
}

/// One reading of `namespaces` for `observer doctor`: every namespace's
/// cheap parts, and a dump of those where some destination could reach
/// `share` of its ports or TIME_WAIT `share` of its ceiling, or that holds
/// `time_wait` TIME_WAIT sockets, which one destination could have (the
/// others cannot have a finding at that share; their `counts` are None).
pub fn once(namespaces: BTreeMap<u32, PathBuf>, share: f64, time_wait: u64) -> Vec<(u32, Vec<Listener>, NetnsUsage)> {
    netns::in_each_namespace(namespaces, move |inode| {
        let mut files = NetnsFiles::open(false).ok()?;
        let glance = files.glance(inode).ok()?;
        let dumped = glance.could_reach(share) || glance.screen.minisockets >= time_wait;
        let counts = if dumped { Some(files.dump(&glance).ok()?) } else { None };
        let (listeners, usage) = glance.usage(counts);
        Some((inode, listeners, usage))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(inode: u32, hot: bool, last: Option<Instant>) -> Candidate {
        Candidate { inode, hot, last }
    }

    #[test]
    fn every_hot_namespace_goes_first_then_cold_ones_never_dumped_then_oldest() {
        let now = Instant::now();
        let (old, older) = (now - Duration::from_secs(5), now - Duration::from_secs(50));
        let (hot, cold) = dump_order(vec![
            candidate(1, false, Some(old)),
            candidate(2, true, Some(old)),
            candidate(3, false, None),
            candidate(4, false, Some(older)),
            candidate(5, true, None),
        ]);
        assert_eq!(hot, [5, 2]);
        assert_eq!(cold, [3, 4, 1]);
    }

    fn glance(range: (u16, u16), tw_buckets: u32, screen: Screen) -> Glance {
        Glance {
            listeners: Vec::new(),
            settings: NetSettings {
                ip_local_port_range: range,
                ip_local_reserved_ports: vec![],
                tcp_fin_timeout: 60,
                tcp_tw_reuse: 2,
                somaxconn: 4096,
                tcp_max_syn_backlog: 128,
                tcp_max_tw_buckets: tw_buckets,
            },
            screen,
            conntrack: None,
        }
    }

    #[test]
    fn a_namespace_is_hot_when_its_sockets_could_fill_half_a_destinations_ports_or_of_its_time_wait_ceiling() {
        let sockets = |in_use, minisockets| Screen { in_use, minisockets, opened: 0 };
        // 10 ports: 5 sockets could all go to one destination.
        assert!(glance((41000, 41009), 100_000, sockets(3, 2)).could_reach(HOT_SHARE));
        assert!(!glance((41000, 41009), 100_000, sockets(2, 2)).could_reach(HOT_SHARE));
        // The default range, and TIME_WAIT at half its ceiling.
        assert!(!glance((32768, 60999), 100, sockets(10, 49)).could_reach(HOT_SHARE));
        assert!(glance((32768, 60999), 100, sockets(10, 50)).could_reach(HOT_SHARE));
    }
}
