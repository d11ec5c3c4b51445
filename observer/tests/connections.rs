//! Connections open now, established and closed by lifetime, per process
//! and far end, against `ss` (the sockets in ESTABLISHED, and who holds
//! them) and the times the client held each connection. Each test loads
//! its own probes (`Observer::start_own`): what a load finds at its start
//! (older connections), its ledger's checks and the updates it lost are
//! that load's.
mod common;

use common::{INBOUND, OUTBOUND, Observer, collect_until};
use observer_testing::Netns;

const PORT: u16 = 5432;

/// File descriptors each side needs for the storm (the default soft
/// limit, 1,024, would stop it; the hard limit here is 20,000).
const NOFILE: u32 = 16_000;

/// Every observer checks its ledger against every quiet namespace of the
/// node, so a connection the default-backlog storm really misses (rare,
/// and what that test expects) would count as unseen in the observer of a
/// test beside it in this binary. The tests that assert the unseen count
/// run one at a time (the series-limits and TIME_WAIT tests do the same).
static LEDGER_CHECK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn ledger_check_alone() -> std::sync::MutexGuard<'static, ()> {
    LEDGER_CHECK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The first incident's storm: a pool of 800 connections to one database,
/// then a burst of 11,200 more from a second process, held. Each
/// process's outbound gauge equals what `ss` shows it holds, the
/// listener's inbound gauge equals every connection the server holds; when
/// the burst's process closes its connections, they count as closed and
/// leave the gauge, the pool's stay.
#[test]
fn a_storm_of_held_connections_is_open_per_process_destination_and_listener() {
    let _alone = ledger_check_alone();
    let mut obs = Observer::start_own();
    let ns = Netns::new();
    let to = format!("127.0.0.1:{PORT}");
    let listen = to.clone();
    // A backlog the burst cannot overflow. With the default 128, SYNs and
    // last ACKs dropped by the full queue delay some handshakes by seconds,
    // and in about one run of four one such connection's start goes
    // uncounted on both sides (MISSED=0, no map full): an open bug, not
    // yet understood (issue 19's note), which this test avoids rather
    // than tolerates.
    let server = ns.serve_with_open_files_limit(NOFILE, &["--listen", &listen, "--hold", "--backlog", "4096"]);
    let pool = ns.client_holding_with_open_files_limit(NOFILE, &["--to", &to, "--count", "800"]);
    assert_eq!(pool.report.connected, 800, "{:?}", pool.report);
    let storm = ns.client_holding_with_open_files_limit(NOFILE, &["--to", &to, "--count", "11200"]);
    assert_eq!(storm.report.connected, 11_200, "{:?}", storm.report);

    let (pool_pid, storm_pid) = (pool.pid(), storm.pid());
    let dport = format!("dport = :{PORT}");
    let sport = format!("sport = :{PORT}");
    // The server accepts in a loop: wait until it holds them all.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while ns.established(&sport, Some(server.pid())) < 12_000 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    collect_until(&mut obs, |o| o.open_connections(server.pid(), INBOUND, PORT) >= 12_000);
    let truth = (
        ns.established(&dport, Some(pool_pid)),
        ns.established(&dport, Some(storm_pid)),
        ns.established(&sport, Some(server.pid())),
    );
    assert_eq!(truth, (800, 11_200, 12_000), "ss");
    let seen = (
        obs.open_connections(pool_pid, OUTBOUND, PORT),
        obs.open_connections(storm_pid, OUTBOUND, PORT),
        obs.open_connections(server.pid(), INBOUND, PORT),
    );
    let keys: Vec<String> = obs
        .open_connection_keys()
        .iter()
        .filter(|(k, _)| k.port == PORT)
        .map(|(k, n)| format!("pid {} {} dir {} netns {}: {n}", k.actor.tgid, k.actor.comm_str(), k.direction, k.netns))
        .collect();
    let counted = |pid, dir| {
        let c = obs.connection_counts(pid, dir, PORT);
        (c.established, c.closed.iter().sum::<u64>())
    };
    let detail = (counted(storm_pid, OUTBOUND), counted(server.pid(), INBOUND), obs.lost());
    assert_eq!(
        seen, truth,
        "open connections (pool, storm, server's listener) against ss; every key: {keys:#?}; (established, closed) of \
         storm and server, lost: {detail:?}"
    );
    assert_eq!(obs.connection_counts(storm_pid, OUTBOUND, PORT).established, 11_200);
    assert_eq!(obs.connection_counts(server.pid(), INBOUND, PORT).established, 12_000);
    // observer's own check agrees: once the namespace is quiet, its 24,000
    // ESTABLISHED sockets are the ledger's (no start or end missed, in
    // this namespace or any other the check found quiet meanwhile).
    let inode = netns_inode(&ns);
    let checks = |o: &Observer| o.connection_checks.get(&inode).copied().unwrap_or(0);
    collect_until(&mut obs, |o| checks(o) >= 1);
    assert!(checks(&obs) >= 1, "the quiet namespace never checked: {:?}", obs.connection_checks);
    assert_eq!(obs.unseen_connections, 0, "checks per namespace: {:?}", obs.connection_checks);

    // The burst ends: its connections close (the server's side sees each
    // FIN: they leave ESTABLISHED there too). Checks are counted from
    // before the close: rounds run only when the test collects, so every
    // check after this is of the namespace quiet after its ends, the
    // first included.
    let before = checks(&obs);
    storm.close();
    collect_until(&mut obs, |o| o.open_connections(server.pid(), INBOUND, PORT) <= 800);
    let truth = (ns.established(&dport, Some(pool_pid)), ns.established(&sport, Some(server.pid())));
    assert_eq!(truth, (800, 800), "ss after the burst");
    assert_eq!(obs.open_connections(storm_pid, OUTBOUND, PORT), 0);
    assert_eq!(
        (obs.open_connections(pool_pid, OUTBOUND, PORT), obs.open_connections(server.pid(), INBOUND, PORT)),
        truth
    );
    let closed: u64 = obs.connection_counts(storm_pid, OUTBOUND, PORT).closed.iter().sum();
    assert_eq!(closed, 11_200, "every connection of the burst counted closed once");
    // Quiet again after 11,200 ends: checked again, still whole.
    collect_until(&mut obs, |o| checks(o) > before);
    assert!(checks(&obs) > before, "not checked after the burst: {:?}", obs.connection_checks);
    assert_eq!(obs.unseen_connections, 0, "checks per namespace: {:?}", obs.connection_checks);
    drop(pool);
}

/// The same storm against the default backlog (128), as a real server
/// meets it: SYNs and last ACKs dropped by the full queue delay handshakes
/// by seconds, and once in such runs one connection's start went uncounted
/// on both sides with nothing reported (issue 19). Whatever the gauges
/// miss of what `ss` shows, observer's own check of its ledger against the
/// quiet namespace's ESTABLISHED sockets counts: exact, or the shortfall
/// is `observer_kernel_unseen_events_total{observer_event="connection"}`.
#[test]
fn a_storm_at_the_default_backlog_is_exact_or_what_it_misses_is_counted() {
    let _alone = ledger_check_alone();
    const STORM_PORT: u16 = 5436;
    let mut obs = Observer::start_own();
    let ns = Netns::new();
    let to = format!("127.0.0.1:{STORM_PORT}");
    let server = ns.serve_with_open_files_limit(NOFILE, &["--listen", &to, "--hold"]);
    let pool = ns.client_holding_with_open_files_limit(NOFILE, &["--to", &to, "--count", "800"]);
    assert_eq!(pool.report.connected, 800, "{:?}", pool.report);
    let storm = ns.client_holding_with_open_files_limit(NOFILE, &["--to", &to, "--count", "11200"]);
    assert_eq!(storm.report.connected, 11_200, "{:?}", storm.report);
    let sport = format!("sport = :{STORM_PORT}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while ns.established(&sport, Some(server.pid())) < 12_000 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let dport = format!("dport = :{STORM_PORT}");
    let truth = [
        ns.established(&dport, Some(pool.pid())),
        ns.established(&dport, Some(storm.pid())),
        ns.established(&sport, Some(server.pid())),
    ];
    assert_eq!(truth, [800, 11_200, 12_000], "ss");
    // Checked once all is quiet: rounds run only when the test collects,
    // so the first check from here is of the namespace after its last
    // handshake (a dump, then a round with no segment), missed
    // connections or not.
    let inode = netns_inode(&ns);
    let checks = |o: &Observer| o.connection_checks.get(&inode).copied().unwrap_or(0);
    let before = checks(&obs);
    collect_until(&mut obs, |o| checks(o) > before);
    assert!(checks(&obs) > before, "the quiet namespace never checked: {:?}", obs.connection_checks);
    let seen = [
        obs.open_connections(pool.pid(), OUTBOUND, STORM_PORT),
        obs.open_connections(storm.pid(), OUTBOUND, STORM_PORT),
        obs.open_connections(server.pid(), INBOUND, STORM_PORT),
    ];
    assert!(seen.iter().zip(&truth).all(|(s, t)| s <= t), "never more than ss: {seen:?} against {truth:?}");
    let missed: u64 = truth.iter().sum::<u64>() - seen.iter().sum::<u64>();
    assert_eq!(
        obs.unseen_connections,
        missed,
        "open (pool, storm, listener) {seen:?} against ss {truth:?}; checks {:?}; lost {:?}",
        obs.connection_checks,
        obs.lost()
    );
}

/// A daemon's scrape: the connections `pid` holds open in `direction`
/// (outbound, inbound) with server port `port`.
fn connection_usage(body: &str, pid: u32, direction: &str, port: u16) -> Option<u64> {
    let labels = [
        format!("process_pid=\"{pid}\""),
        format!("observer_connection_direction=\"{direction}\""),
        format!("server_port=\"{port}\""),
    ];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    observer_testing::http::sample(body, "observer_tcp_connection_usage", &labels)
}

fn netns_inode(ns: &Netns) -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    u32::try_from(std::fs::metadata(ns.path()).unwrap().ino()).unwrap()
}

/// A connection start the programs missed cannot be made on purpose, so
/// the fault is injected where the daemon's check reads its ledger: one
/// of the namespace's 20 connections hidden. The check, against the
/// namespace's ESTABLISHED sockets once it is quiet, counts it once,
/// however many times it is checked while the connection lasts.
#[test]
fn a_connection_the_ledger_missed_is_counted_as_unseen() {
    let _alone = ledger_check_alone();
    use common::daemon::{scrape_until, start_daemon_with_env};
    use observer_testing::http::sample;
    const HELD: u64 = 20;
    let ns = Netns::new();
    let to = "127.0.0.1:5435";
    let server = ns.serve(&["--listen", to, "--hold"]);
    let inode = netns_inode(&ns).to_string();
    let daemon = start_daemon_with_env(&[], &[("FAILPOINTS", &format!("connection-unseen=return({inode})"))]);
    let unseen = |b: &str| sample(b, "observer_kernel_unseen_events_total", &["observer_event=\"connection\""]);
    let client = ns.client_holding(&["--to", to, "--count", &HELD.to_string()]);
    assert_eq!(client.report.connected, HELD, "{:?}", client.report);
    assert_eq!(ns.established("sport = :5435", Some(server.pid())), HELD, "ss");
    let body = scrape_until(&daemon, std::time::Duration::from_secs(20), |b| unseen(b).is_some_and(|n| n > 0));
    assert_eq!(unseen(&body), Some(1), "{body}");
    // A connect() refused changes the namespace (ActiveOpens), so it is
    // dumped and, quiet again, checked again, the hidden connection still
    // open: still one.
    let refused = ns.client(&["--to", "127.0.0.1:5999", "--count", "1"]);
    assert_eq!(refused.errors("ECONNREFUSED"), 1, "{refused:?}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(unseen(&daemon.scrape()), Some(1), "{}", daemon.log());
}

/// Connections established before observer started count open from its
/// start (a restart must not drop a pool's connections from the gauge):
/// while a third process opens and closes connections throughout the
/// start, the old pool's outbound gauge and the listener's inbound one
/// equal what `ss` shows beside ten new connections. Once the pool closes,
/// its ends take it out again (ended, with no lifetime), their TIME_WAIT
/// entries name the pool's process, and what the ledger holds for the
/// namespace is exactly what `ss` lists established.
#[test]
fn connections_older_than_observer_count_open_and_their_ends_close_them() {
    const OLD: u64 = 50;
    const CHURN_PORT: u16 = 5433;
    let ns = Netns::new();
    let to = format!("127.0.0.1:{PORT}");
    let server = ns.serve(&["--listen", &to, "--hold"]);
    let old = ns.client_holding(&["--to", &to, "--count", &OLD.to_string()]);
    assert_eq!(old.report.connected, OLD);
    let churn_to = format!("127.0.0.1:{CHURN_PORT}");
    let _churn_server = ns.serve(&["--listen", &churn_to]);
    let mut churn = ns
        .command(&observer_testing::churn::churn())
        .args(["connect", "--to", &churn_to, "--count", "10000000", "--life", "1ms"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut obs = Observer::start_own();
    let new = ns.client_holding(&["--to", &to, "--count", "10"]);
    collect_until(&mut obs, |o| o.open_connections(new.pid(), OUTBOUND, PORT) >= 10);
    let old_pid = old.pid();
    let (sport, dport) = (format!("sport = :{PORT}"), format!("dport = :{PORT}"));
    assert_eq!(
        (obs.open_connections(old_pid, OUTBOUND, PORT), obs.open_connections(server.pid(), INBOUND, PORT)),
        (ns.established(&dport, Some(old_pid)), ns.established(&sport, Some(server.pid()))),
        "the old pool and the listener against ss; every key: {:#?}",
        obs.open_connection_keys()
    );
    assert_eq!(obs.open_connections(old_pid, OUTBOUND, PORT), OLD);

    churn.kill().unwrap();
    churn.wait().unwrap();
    old.close();
    collect_until(&mut obs, |o| o.open_connections(server.pid(), INBOUND, PORT) <= 10);
    for _ in 0..3 {
        obs.collect();
    }
    assert_eq!(obs.open_connections(old_pid, OUTBOUND, PORT), 0);
    assert_eq!(obs.open_connections(new.pid(), OUTBOUND, PORT), 10);
    assert_eq!(obs.open_connections(server.pid(), INBOUND, PORT), ns.established(&sport, Some(server.pid())));
    let ended = obs.connection_counts(old_pid, OUTBOUND, PORT);
    assert_eq!((ended.established, ended.closed_older, ended.closed.iter().sum::<u64>()), (0, OLD, 0));
    // The pool closed first (the server holds its ends): the ends the
    // kernel made timewait sockets of are charged to the pool's process,
    // whose owner of each socket observer entered at start, none to pid 0.
    let ends = ns.closed_ends(&dport);
    assert_eq!(ends.timewait + ends.full_fin_wait2, OLD, "{}", ends.ss);
    assert_eq!(obs.process(old_pid).time_wait_entries, ends.timewait, "{}", ends.ss);
    // Nothing left over from the start (an entry of a socket that ended
    // while observer entered it would stay open for ever).
    let netns = observer::node::netns::inode(&ns.path()).unwrap();
    let held: u64 = obs.open_connection_keys().iter().filter(|(k, _)| k.netns == netns).map(|(_, n)| n).sum();
    assert_eq!(held, ns.established("", None), "every key: {:#?}\n{}", obs.open_connection_keys(), ns.ss_all());
}

/// A restart (a DaemonSet rollout) keeps the pool in the gauge: a pool of
/// connections held through a daemon's stop and the next one's start is
/// exported by the new daemon as open, for the pool's process and the
/// listener's, equal to `ss`.
#[test]
fn a_restarted_daemon_exports_the_pool_it_found_open() {
    use common::daemon::{scrape_until, start_daemon};
    const POOL: u64 = 40;
    const RESTART_PORT: u16 = 5434;
    let ns = Netns::new();
    let to = format!("127.0.0.1:{RESTART_PORT}");
    let server = ns.serve(&["--listen", &to, "--hold"]);
    let mut first = start_daemon(&[]);
    let pool = ns.client_holding(&["--to", &to, "--count", &POOL.to_string()]);
    assert_eq!(pool.report.connected, POOL);
    assert!(first.terminate(std::time::Duration::from_secs(10)).is_some_and(|s| s.success()));
    drop(first);

    let daemon = start_daemon(&[]);
    let port = RESTART_PORT.to_string();
    let usage = |body: &str, pid: u32, direction: &str| connection_usage(body, pid, direction, RESTART_PORT);
    let body = scrape_until(&daemon, std::time::Duration::from_secs(20), |b| {
        usage(b, pool.pid(), "outbound").is_some() && usage(b, server.pid(), "inbound").is_some()
    });
    let ss = |filter: &str, pid: u32| Some(ns.established(filter, Some(pid)));
    assert_eq!(
        (usage(&body, pool.pid(), "outbound"), usage(&body, server.pid(), "inbound")),
        (ss(&format!("dport = :{port}"), pool.pid()), ss(&format!("sport = :{port}"), server.pid())),
        "{body}"
    );
    assert_eq!(usage(&body, pool.pid(), "outbound"), Some(POOL));
    assert!(daemon.log().contains("established before observer started"), "{}", daemon.log());
}

/// A namespace that blocks the start-up pass (a failpoint holds its read
/// past the pass's 5 s) costs only itself and those read after it: the
/// pools held before the start in a namespace read before it count open,
/// equal to `ss`; the blocked one's are left out, the log says how many
/// namespaces were read, and its ledger, short by its pool, is never
/// checked against its ESTABLISHED sockets (checked, it would count the
/// pool's two ends as unseen), while the namespace read still is.
#[test]
fn a_namespace_the_start_up_pass_cannot_read_in_time_leaves_out_only_itself_and_those_after_it() {
    let _alone = ledger_check_alone();
    use common::daemon::{scrape_until, start_daemon_with_env};
    use observer_testing::http::sample;
    const POOL: u64 = 30;
    const BLOCKED_PORT: u16 = 5437;
    let mut namespaces = [Netns::new(), Netns::new()];
    namespaces.sort_by_key(netns_inode);
    let [read, blocked] = &namespaces;
    let to = format!("127.0.0.1:{BLOCKED_PORT}");
    let pools: Vec<_> = namespaces
        .iter()
        .map(|ns| {
            let server = ns.serve(&["--listen", &to, "--hold"]);
            let pool = ns.client_holding(&["--to", &to, "--count", &POOL.to_string()]);
            assert_eq!(pool.report.connected, POOL, "{:?}", pool.report);
            (server, pool)
        })
        .collect();
    let ((read_server, read_pool), (_, blocked_pool)) = (&pools[0], &pools[1]);
    let failpoint = format!("older-pass-blocks=return({})", netns_inode(blocked));
    let daemon = start_daemon_with_env(&[], &[("FAILPOINTS", &failpoint), ("RUST_LOG", "observer=debug")]);
    let port = BLOCKED_PORT.to_string();
    let usage = |body: &str, pid: u32, direction: &str| connection_usage(body, pid, direction, BLOCKED_PORT);
    let body = scrape_until(&daemon, std::time::Duration::from_secs(30), |b| {
        usage(b, read_pool.pid(), "outbound").is_some() && usage(b, read_server.pid(), "inbound").is_some()
    });
    let ss = |ns: &Netns, filter: &str, pid: u32| Some(ns.established(filter, Some(pid)));
    assert_eq!(
        (usage(&body, read_pool.pid(), "outbound"), usage(&body, read_server.pid(), "inbound")),
        (
            ss(read, &format!("dport = :{port}"), read_pool.pid()),
            ss(read, &format!("sport = :{port}"), read_server.pid())
        ),
        "the namespace read before the blocked one: {body}"
    );
    assert_eq!(usage(&body, read_pool.pid(), "outbound"), Some(POOL));
    assert_eq!(ss(blocked, &format!("dport = :{port}"), blocked_pool.pid()), Some(POOL), "ss");
    assert!(usage(&body, blocked_pool.pid(), "outbound").unwrap_or(0) == 0, "the blocked pool counted: {body}");
    let log = daemon.log();
    assert!(
        log.contains("the start-up pass read the connections older than observer in") && log.contains("not within 5s"),
        "{log}"
    );

    // Each namespace changes (a refused connect()), is dumped, then found
    // quiet (the debug log says so of each): the one read is checked,
    // exact; the blocked one is not.
    let unseen = |b: &str| sample(b, "observer_kernel_unseen_events_total", &["observer_event=\"connection\""]);
    let said_after = |from: usize, what: &str| daemon.log().lines().skip(from).any(|l| l.contains(what));
    let from = daemon.log().lines().count();
    for ns in [read, blocked] {
        let refused = ns.client(&["--to", "127.0.0.1:5999", "--count", "1"]);
        assert_eq!(refused.errors("ECONNREFUSED"), 1, "{refused:?}");
    }
    let checked = format!("ledger of open connections checked netns={} established={}", netns_inode(read), 2 * POOL);
    let not_checked =
        format!("not checked: the start-up pass did not read the namespace netns={}", netns_inode(blocked));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !(said_after(from, &checked) && said_after(from, &not_checked)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let log = daemon.log();
    assert!(said_after(from, &checked), "the namespace read never checked quiet: {log}");
    assert!(said_after(from, &not_checked), "the blocked namespace never found quiet: {log}");
    assert_eq!(unseen(&daemon.scrape()), Some(0), "{log}");
}
