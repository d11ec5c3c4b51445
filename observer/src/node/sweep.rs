//! Every network namespace, every round, at a cost that does not multiply
//! with the pods.
//!
//! Only a dump of a namespace's connections tells its ports per
//! destination, and every such dump walks the node's whole established
//! hash (every namespace's sockets) to pick the namespace's own: dumping
//! 110 pods at 100k sockets costs 110 walks of 100k. So each round reads
//! every namespace's cheap parts, from files held open since the namespace
//! was first seen (no setns, no open): its listeners (their own small
//! hash), its settings and its screen (`screen.rs`). Then it dumps, of
//! the namespaces that changed since their last dump:
//! - a *hot* namespace, one whose screen says some destination could hold
//!   half of its ports or more: at once if it could be *near* a ceiling
//!   (`NEAR_SHARE`, the warning's 70%: its last dump's most used
//!   destination plus every connect() since, each at most one more port
//!   held), so a namespace near a ceiling is never the one waiting;
//!   else at its own pace (`HOT_PACE`, or sooner as its connect()s could
//!   move a count by 2% of the ports). The dump of a busy namespace is
//!   the round's whole cost (one walk of the node's sockets: ~40 ms at
//!   100k), and one at 51% gains little from it every second;
//! - a *cold* one (or one never dumped, or dumped longer ago than
//!   `MAX_AGE`), the longest waiting first, while the round's cold dumps
//!   take less than 1% of the interval (at least one per round).
//!
//! Between dumps a namespace keeps the destinations of its last one: exact
//! when nothing changed (same screen, settings and listeners), else
//! waiting its turn, counted as `deferred`. At a quiet moment every
//! namespace is exact after `HOT_PACE`, or as many rounds as cold
//! namespaces changed, divided by the dumps a budget allows.
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
    screen::{Screen, ScreenFiles, Traffic},
    settings::{NetSettings, SettingsFiles},
    sock_diag::{DiagSocket, Listener},
    usage::{self, SocketCounts},
};

/// A namespace one of whose destinations could hold this share of its
/// ports is dumped whenever it changes (below the warning at 70%, so a
/// namespace heading for one is read each round before it gets there).
pub const HOT_SHARE: f64 = 0.5;

/// A hot namespace that could have come this near a ceiling since its last
/// dump (a destination's ports, or TIME_WAIT against its own) is dumped
/// every round it changes: ObserverEphemeralPortsNearLimit's share.
pub const NEAR_SHARE: f64 = 0.7;

/// A hot namespace below `NEAR_SHARE` is dumped at least this often while
/// it changes (every round at intervals this long or longer)...
pub const HOT_PACE: Duration = Duration::from_secs(5);

/// ... and sooner once its connect()s since its last dump could have moved
/// a destination's count by this share of the ports: a destination filling
/// fast is followed closely, one that barely moves costs a dump per
/// `HOT_PACE`.
pub const HOT_DRIFT_SHARE: f64 = 0.02;

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
        let dirs = netns::Dirs::open()?;
        Ok(Self {
            diag: DiagSocket::open()?,
            screen: ScreenFiles::open(&dirs, follow_changes)?,
            settings: SettingsFiles::open(&dirs)?,
            conntrack: ConntrackFiles::open(&dirs, follow_changes),
        })
    }

    /// The cheap parts: listeners, settings, screen, conntrack table.
    pub fn glance(&mut self, inode: u32) -> io::Result<Glance> {
        let listeners = self.diag.listeners(inode)?;
        let settings = self.settings.read()?;
        let (screen, traffic) = self.screen.read()?;
        Ok(Glance {
            listeners,
            settings,
            screen,
            traffic,
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
    /// None where changes are not followed (doctor).
    pub traffic: Option<Traffic>,
    pub conntrack: Option<Conntrack>,
}

impl Glance {
    /// Whether some destination could hold `share` of its ports (the
    /// sockets that hold any port, against the ports one destination can
    /// have: the range minus the reserved and the listened-on ones), or
    /// TIME_WAIT `share` of tcp_max_tw_buckets.
    pub fn could_reach(&self, share: f64) -> bool {
        self.screen.port_holders() as f64 >= share * self.ports_per_destination() as f64
            || self.time_wait_reaches(share)
    }

    /// Whether some destination could have come to hold `share` of its
    /// ports since `last`: the most used one then plus `connects` since,
    /// or TIME_WAIT `share` of its ceiling.
    fn could_have_reached(&self, last: &LastDump, connects: u64, share: f64) -> bool {
        let most_used = last.counts.destinations.iter().map(|d| u64::from(d.used)).max().unwrap_or(0);
        (most_used + connects) as f64 >= share * self.ports_per_destination() as f64 || self.time_wait_reaches(share)
    }

    /// The ports one destination can have: the range minus the reserved
    /// and the listened-on ones.
    fn ports_per_destination(&self) -> u64 {
        let listened = self.listeners.iter().filter(|l| self.settings.is_ephemeral(l.port)).count() as u64;
        u64::from(self.settings.ephemeral_ports()).saturating_sub(listened)
    }

    fn time_wait_reaches(&self, share: f64) -> bool {
        self.screen.minisockets as f64 >= share * f64::from(self.settings.tcp_max_tw_buckets)
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

impl DumpKey {
    /// The connect()s since `was`, the key of the namespace's last dump
    /// (ActiveOpens): a socket comes to hold an ephemeral port toward a
    /// destination only through one (an accepted one has its listener's
    /// port), so no destination's count can have grown by more. None when
    /// that dump's reading no longer applies (other settings or listeners,
    /// or a counter gone back).
    fn connects_since(&self, was: &DumpKey) -> Option<u64> {
        if was.settings != self.settings || was.listened != self.listened {
            return None;
        }
        self.screen.active_opens.checked_sub(was.screen.active_opens)
    }
}

struct LastDump {
    key: DumpKey,
    counts: SocketCounts,
    at: Instant,
}

struct Tracked {
    files: NetnsFiles,
    last: Option<LastDump>,
    /// Its last dump, if that was last round's, waiting to be found quiet.
    settling: Option<Settling>,
}

/// A dump's count of ESTABLISHED sockets and the namespace's key and
/// traffic when it was taken: the same key and traffic a round later mean
/// no socket changed state between the two readings, so the count still
/// held when the collector read the kernel's maps in between.
struct Settling {
    key: DumpKey,
    traffic: Traffic,
    established: u64,
}

impl Settling {
    /// Whether nothing changed between its reading and this one (`key`,
    /// `traffic`): no socket changed state.
    fn still_holds(&self, key: &DumpKey, traffic: Option<Traffic>) -> bool {
        Some(self.traffic) == traffic && self.key == *key
    }
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
    interval: Duration,
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
    /// Sweeps that count toward the next check (all of them, but for a
    /// test's hold: `checks_held`).
    rounds: u64,
    /// Read each namespace's count of TIME_WAIT entries every
    /// `KERNEL_CHECK_EVERY` rounds (off where the kernel counts them
    /// only when they end).
    pub check_time_wait: bool,
    /// The same for listen overflows (on where programs count them).
    pub check_overflows: bool,
}

/// A test's hold on the checks (`kernel-checks-held=return(PATH)`: while
/// PATH exists, sweeps do not count toward the next check), so that what a
/// test does between two checks cannot outlast the rounds between them
/// however slow the machine (tests/common/daemon.rs `between_checks`).
/// The check a hold began too late to defer still runs: the decision is
/// the last sweep's, as the programs' read before a check needs.
fn checks_held() -> bool {
    #[cfg(feature = "failpoints")]
    if fail::eval("kernel-checks-held", |arg| arg.map(|path| Path::new(&path).exists())) == Some(Some(true)) {
        return true;
    }
    false
}

impl Sweeper {
    pub fn new(proc_root: &Path, max_namespaces: usize, interval: Duration) -> Self {
        Self {
            proc_root: proc_root.to_path_buf(),
            max_namespaces,
            interval,
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

    /// Whether the next sweep reads each namespace's own counts for the
    /// checks (every `KERNEL_CHECK_EVERY` rounds, the first included).
    fn next_sweep_checks(&self) -> bool {
        (self.check_time_wait || self.check_overflows) && (self.rounds + 1) % KERNEL_CHECK_EVERY == 1
    }

    /// Whether the next sweep reads the namespaces' TIME_WAIT counts (the
    /// programs' must then be read just before it: `collect::unseen`).
    pub fn next_sweep_checks_time_wait(&self) -> bool {
        self.check_time_wait && self.next_sweep_checks()
    }

    /// Read every namespace of the node.
    pub fn sweep(&mut self) -> NodeReading {
        let mut counts = SweepCounts::default();
        let check = self.next_sweep_checks();
        if !checks_held() {
            self.rounds += 1;
        }
        let now = Instant::now();
        let found = netns::all(&self.proc_root);
        let on_node = found.keys().copied().collect();
        let pids: BTreeMap<u32, u32> =
            found.iter().filter_map(|(inode, path)| Some((*inode, netns::pid_of(path)?))).collect();
        counts.unread += self.track(found);

        // Every namespace's cheap parts, and whether its last dump still
        // holds.
        let mut glanced = BTreeMap::new();
        let mut candidates = Vec::new();
        let mut deferred = BTreeSet::new();
        let mut quiet_established = BTreeMap::new();
        for (&inode, tracked) in &mut self.tracked {
            let Ok(glance) = tracked.files.glance(inode) else {
                counts.unread += 1;
                continue;
            };
            let key = glance.key();
            let settled = tracked.settling.take().filter(|s| s.still_holds(&key, glance.traffic));
            if let Some(settled) = settled {
                quiet_established.insert(inode, settled.established);
            }
            let stale = match &tracked.last {
                None => true,
                Some(last) => last.key != key || last.at.elapsed() > MAX_AGE,
            };
            if stale {
                let hot = glance.could_reach(HOT_SHARE);
                match &tracked.last {
                    Some(last) if hot && !hot_dump_due(&glance, &key, last, self.interval) => {
                        deferred.insert(inode);
                    }
                    last => candidates.push(Candidate { inode, hot, last: last.as_ref().map(|l| l.at) }),
                }
            }
            glanced.insert(inode, (glance, key));
        }

        let (hot, cold) = dump_order(candidates);
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
                let current = !deferred.contains(&inode);
                if !current {
                    counts.deferred += 1;
                } else if last.is_some() {
                    counts.current += 1;
                }
                let last_counts = last.as_ref().map(|l| SocketCounts {
                    // Unchanged since its dump: its counts hold now.
                    as_of: if current { Some(now) } else { l.counts.as_of },
                    ..l.counts.clone()
                });
                let (listeners, usage) = glance.usage(last_counts);
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
                    quiet_established: quiet_established.get(&inode).copied(),
                }
            })
            .collect();
        NodeReading { namespaces, counts, on_node }
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
            self.tracked.insert(inode, Tracked { files, last: None, settling: None });
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

/// Whether a hot namespace that changed since `last`, its last dump, is
/// dumped this round: if it could be near a ceiling, or its readings could
/// be off by `HOT_DRIFT_SHARE` of its ports, or its dump is `HOT_PACE` old
/// (to within half a round, so a 1 s interval dumps every fifth round, not
/// sixth).
fn hot_dump_due(glance: &Glance, key: &DumpKey, last: &LastDump, interval: Duration) -> bool {
    let Some(connects) = key.connects_since(&last.key) else { return true };
    glance.could_have_reached(last, connects, NEAR_SHARE)
        || connects as f64 >= HOT_DRIFT_SHARE * glance.ports_per_destination() as f64
        || last.at.elapsed() + interval / 2 >= HOT_PACE
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
            tracked.settling =
                glance.traffic.map(|traffic| Settling { key: key.clone(), traffic, established: counts.established });
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

    #[test]
    fn a_namespace_left_unread_is_still_on_the_node() {
        // No room to read any: this process's namespace is found, not read,
        // and a check keeping its state must not take it for gone.
        let mut sweeper = Sweeper::new(Path::new("/proc"), 0, Duration::from_secs(1));
        let reading = sweeper.sweep();
        let own = netns::inode(Path::new("/proc/self/ns/net")).expect("this process's namespace");
        assert!(reading.namespaces.is_empty(), "{:?}", reading.namespaces);
        assert!(reading.on_node.contains(&own), "{own} not in {:?}", reading.on_node);
        assert!(reading.counts.unread >= 1, "{:?}", reading.counts);
    }

    /// The hold `between_checks` relies on: rounds while its file exists
    /// do not bring the next check nearer, and counting resumes after.
    #[cfg(feature = "failpoints")]
    #[test]
    fn rounds_held_by_a_test_do_not_count_toward_the_next_check() {
        let file = std::env::temp_dir().join(format!("observer-unit-checks-held-{}", std::process::id()));
        fail::cfg("kernel-checks-held", &format!("return({})", file.display())).unwrap();
        // Nothing to read (no namespace may be read): only the rounds count.
        let mut sweeper = Sweeper::new(Path::new("/nonexistent"), 0, Duration::from_secs(1));
        assert!(sweeper.next_sweep_checks(), "the first sweep checks");
        sweeper.sweep();
        std::fs::write(&file, b"").unwrap();
        for _ in 0..3 * KERNEL_CHECK_EVERY {
            assert!(!sweeper.next_sweep_checks(), "a held round brought the check");
            sweeper.sweep();
        }
        std::fs::remove_file(&file).unwrap();
        for _ in 1..KERNEL_CHECK_EVERY {
            assert!(!sweeper.next_sweep_checks());
            sweeper.sweep();
        }
        assert!(sweeper.next_sweep_checks(), "the check after the rounds left when the hold began");
        fail::remove("kernel-checks-held");
    }

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
            settings: NetSettings::with_range(range, tw_buckets),
            screen,
            traffic: None,
            conntrack: None,
        }
    }

    /// `hot_dump_due` with the glance's own key, as the sweep passes it.
    fn due(glance: &Glance, last: &LastDump, interval: Duration) -> bool {
        hot_dump_due(glance, &glance.key(), last, interval)
    }

    /// A last dump of a namespace whose most used destination held `used`
    /// ports, `age` ago, when its screen read `screen`.
    fn last_dump(glance: &Glance, used: u32, age: Duration) -> LastDump {
        LastDump {
            key: glance.key(),
            counts: SocketCounts {
                destinations: vec![usage::Destination::held(used)],
                time_wait: 0,
                as_of: None,
                established: 0,
            },
            at: Instant::now() - age,
        }
    }

    #[test]
    fn a_hot_namespace_below_the_warning_waits_for_its_pace_unless_it_could_be_near_or_has_moved() {
        // 10,000 ports; one destination held `used` of them 1 s ago.
        let screen = Screen { in_use: 11_000, minisockets: 0, active_opens: 50_000, passive_opens: 50_000 };
        let range = (40000, 49999);
        let was = glance(range, 1_000_000, screen);
        let second = Duration::from_secs(1);
        let after = |connects: u64, accepts: u64| {
            let opens = Screen { active_opens: 50_000 + connects, passive_opens: 50_000 + accepts, ..screen };
            glance(range, 1_000_000, opens)
        };
        let at_55 = last_dump(&was, 5_500, second);
        // 199 connect()s since: a count off by less than 2% of the ports.
        // Accepted connections hold no ephemeral port: they do not count.
        assert!(!due(&after(199, 9_000), &at_55, second));
        // 200: it could be off by 2%.
        assert!(due(&after(200, 0), &at_55, second));
        // At 69%, 99 connect()s cannot reach 70%; 100 could.
        let at_69 = last_dump(&was, 6_900, second);
        assert!(!due(&after(99, 0), &at_69, second));
        assert!(due(&after(100, 0), &at_69, second));
        // Its pace: a dump 5 s old (to within half a round) is redone.
        assert!(due(&after(1, 0), &last_dump(&was, 5_500, Duration::from_millis(4600)), second));
        assert!(!due(&after(1, 0), &last_dump(&was, 5_500, Duration::from_millis(4400)), second));
        // Counters that went back (a namespace's never do): read it.
        let back = Screen { active_opens: 40_000, ..screen };
        assert!(due(&glance(range, 1_000_000, back), &at_55, second));
    }

    #[test]
    fn a_hot_namespace_whose_settings_listeners_or_time_wait_changed_is_dumped_at_once() {
        let screen = Screen { in_use: 1100, minisockets: 0, active_opens: 5000, passive_opens: 5000 };
        let was = glance((40000, 40999), 100_000, screen);
        let last = last_dump(&was, 550, Duration::from_secs(1));
        let second = Duration::from_secs(1);
        // A smaller range: 550 of 700 ports.
        assert!(due(&glance((40000, 40699), 100_000, screen), &last, second));
        // A new listener in the range.
        let mut listening = glance((40000, 40999), 100_000, screen);
        listening.listeners.push(Listener {
            netns: 1,
            family: 2,
            address: "0.0.0.0".parse().unwrap(),
            port: 40500,
            cookie: 1,
            inode: 7,
            drops: 0,
            queued: 0,
            backlog: 128,
        });
        assert!(due(&listening, &last, second));
        // TIME_WAIT at 70% of its ceiling.
        let tw = glance((40000, 40999), 1000, Screen { minisockets: 700, ..screen });
        assert!(due(&tw, &last_dump(&glance((40000, 40999), 1000, screen), 550, second), second));
    }

    #[test]
    fn a_dumps_established_count_holds_only_while_no_segment_moved_and_the_screen_is_the_same() {
        let screen = Screen { in_use: 10, minisockets: 0, active_opens: 5, passive_opens: 5 };
        let at_dump = glance((40000, 40999), 1000, screen);
        let settling = Settling { key: at_dump.key(), traffic: Traffic::segments(100), established: 8 };
        assert!(settling.still_holds(&at_dump.key(), Some(Traffic::segments(100))));
        // One segment: a FIN, say, that took a connection out of ESTABLISHED.
        assert!(!settling.still_holds(&at_dump.key(), Some(Traffic::segments(101))));
        // A timer's close sends nothing but unhashes the socket.
        let closed = glance((40000, 40999), 1000, Screen { in_use: 9, ..screen });
        assert!(!settling.still_holds(&closed.key(), Some(Traffic::segments(100))));
        // No traffic read: nothing known.
        assert!(!settling.still_holds(&at_dump.key(), None));
    }

    #[test]
    fn a_namespace_is_hot_when_its_sockets_could_fill_half_a_destinations_ports_or_of_its_time_wait_ceiling() {
        let sockets = |in_use, minisockets| Screen { in_use, minisockets, ..Screen::default() };
        // 10 ports: 5 sockets could all go to one destination.
        assert!(glance((41000, 41009), 100_000, sockets(3, 2)).could_reach(HOT_SHARE));
        assert!(!glance((41000, 41009), 100_000, sockets(2, 2)).could_reach(HOT_SHARE));
        // The default range, and TIME_WAIT at half its ceiling.
        assert!(!glance((32768, 60999), 100, sockets(10, 49)).could_reach(HOT_SHARE));
        assert!(glance((32768, 60999), 100, sockets(10, 50)).could_reach(HOT_SHARE));
    }
}
