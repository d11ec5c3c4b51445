//! `observer top` against a running daemon and on its own programs, while
//! a client runs out of ports (EADDRNOTAVAIL on every attempt past its two)
//! and a healthy one connects much faster: the culprit is the first row
//! when sorted by EADDRNOTAVAIL, the healthy one when sorted by connects,
//! in the printed table (`--once`) and in the full-screen view in a real
//! terminal (tmux: keys change the sort, q quits). Without `--from`, top
//! reads the local daemon where one answers, else attaches its own.
mod common;

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::daemon::{OBSERVER, start_daemon, start_daemon_at};
use observer_testing::{Netns, churn};

/// A client started in the background, killed on drop.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The culprit: two ports toward its server, 600 attempts over 60 s, the
/// first two held: ~10 EADDRNOTAVAIL a second. The healthy client: 6,000
/// short connections over 60 s to another namespace's server (~100 a
/// second, no failure). And a listener that never accepts, 5 connection
/// attempts a second overflowing its queue.
struct Scenario {
    _namespaces: [Netns; 3],
    _servers: Vec<observer_testing::Server>,
    culprit: Background,
    healthy: Background,
    _overflowing: Background,
    /// A listener that never accepts (backlog 1), its queue overflowing.
    listener: u32,
}

impl Scenario {
    fn start() -> Self {
        let exhausted = Netns::new();
        exhausted.sysctl("net.ipv4.ip_local_port_range", "43000 43001");
        let holder = exhausted.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
        let culprit = exhausted
            .command(&churn())
            .args(["connect", "--to", "127.0.0.1:8080", "--count", "600", "--hold", "--spread", "60s"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let fine = Netns::new();
        let server = fine.serve(&["--listen", "127.0.0.1:7000"]);
        let healthy = fine
            .command(&churn())
            .args(["connect", "--to", "127.0.0.1:7000", "--count", "6000", "--spread", "60s"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stuck = Netns::new();
        let listener = stuck.serve(&["--listen", "127.0.0.1:8081", "--backlog", "1", "--never-accept"]);
        let overflowing = stuck
            .command(&churn())
            .args(["connect", "--to", "127.0.0.1:8081", "--count", "300", "--nonblocking", "200ms", "--spread", "60s"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Scenario {
            listener: listener.pid(),
            _namespaces: [exhausted, fine, stuck],
            _servers: vec![holder, server, listener],
            culprit: Background(culprit),
            healthy: Background(healthy),
            _overflowing: Background(overflowing),
        }
    }
}

/// The process rows of a table: (pid, the row's numbers), in order.
fn rows(table: &str) -> Vec<(String, Vec<f64>)> {
    table
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("PID"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let numbers = words[words.len() - 6..].iter().map(|w| w.parse().unwrap()).collect();
            (words[0].to_string(), numbers)
        })
        .collect()
}

/// `observer top --once` reading from `source` (`--from URL`, `--own`, or
/// nothing).
fn once(source: &[&str], sort: &str) -> String {
    let out = Command::new(OBSERVER)
        .arg("top")
        .args(source)
        .args(["--once", "--interval", "2s", "--sort", sort])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Until `done` holds of a fresh table (the daemon's first rounds).
fn table_until(source: &[&str], sort: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let table = once(source, sort);
        if done(&table) || Instant::now() > deadline {
            return table;
        }
    }
}

/// The table's rows as the scenario should make them: the culprit first
/// by EADDRNOTAVAIL with its destination, the healthy client failing
/// nothing, the overflowing listener listed; the healthy client first by
/// connects.
fn assert_ranks_the_scenario(source: &[&str], scenario: &Scenario) {
    let (culprit, healthy) = (scenario.culprit.0.id().to_string(), scenario.healthy.0.id().to_string());
    let first = |t: &str| rows(t).first().map(|(pid, _)| pid.clone());

    let table = table_until(source, "eaddrnotavail", |t| first(t).as_deref() == Some(&culprit));
    let rows_by_errors = rows(&table);
    let (pid, numbers) = &rows_by_errors[0];
    assert_eq!(pid, &culprit, "{table}");
    // Columns: EADDRNOTAVAIL, errors, TIME_WAIT, overflows, connects, accepts.
    assert!(numbers[0] > 0.0 && numbers[0] <= numbers[1], "{table}");
    assert!(numbers[0] <= 600.0 / 2.0, "no more than its attempts: {table}");
    let healthy_row = rows_by_errors.iter().find(|(p, _)| p == &healthy);
    assert!(healthy_row.is_none_or(|(_, n)| n[0] == 0.0 && n[1] == 0.0), "the healthy client fails nothing: {table}");
    assert!(table.contains("127.0.0.1:8080"), "the culprit's destination is listed: {table}");
    // The overflowing listener, by its owner and port.
    let listeners: Vec<Vec<&str>> = table
        .lines()
        .skip_while(|l| !l.contains("OVERFLOWS/s") || !l.contains("PORT"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let listener = scenario.listener.to_string();
    assert!(
        listeners.iter().any(|w| w.first() == Some(&listener.as_str()) && w.contains(&"8081")),
        "the overflowing listener is listed: {table}"
    );

    let table = table_until(source, "connects", |t| first(t).as_deref() == Some(&healthy));
    assert_eq!(first(&table).as_deref(), Some(healthy.as_str()), "{table}");
    assert!(table.contains("*CONNECTS/s"), "{table}");
}

#[test]
fn once_prints_the_culprit_first_and_sorts_by_the_column_asked() {
    let daemon = start_daemon(&[]);
    let scenario = Scenario::start();
    let from = format!("http://127.0.0.1:{}", daemon.port);
    assert_ranks_the_scenario(&["--from", &from], &scenario);
}

/// `--own`: top's own programs, attached for each `--once` (no daemon
/// involved), rank the same scenario the same way.
#[test]
fn its_own_programs_rank_the_culprit_first_without_a_daemon() {
    let scenario = Scenario::start();
    let table = once(&["--own"], "eaddrnotavail");
    assert!(table.starts_with("observer top: its own programs ("), "{table}");
    assert_ranks_the_scenario(&["--own"], &scenario);
}

/// Without --from or --own: the daemon at observer run's default address
/// when one answers there (it costs nothing more), else top's own
/// programs. (Takes 127.0.0.1:9464, which no other test of this binary
/// uses.)
#[test]
fn without_from_it_reads_the_local_daemon_else_attaches_its_own() {
    const DEFAULT_PORT: u16 = 9464;
    drop(std::net::TcpListener::bind(("127.0.0.1", DEFAULT_PORT)).unwrap_or_else(|e| {
        panic!(
            "this test needs observer run's default port 127.0.0.1:{DEFAULT_PORT} free (is an observer running?): {e}"
        )
    }));
    let table = once(&[], "eaddrnotavail");
    assert!(table.starts_with("observer top: its own programs ("), "nothing answers: its own programs:\n{table}");
    // Nothing answers and top may not attach (every capability dropped):
    // one error saying both, with what to grant.
    let out = Command::new("setpriv")
        .args(["--inh-caps=-all", "--bounding-set=-all", "--", OBSERVER, "top", "--once"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("no observer answers at http://127.0.0.1:{DEFAULT_PORT}/metrics"))
            && stderr.contains("--from")
            && stderr.contains("CAP_BPF"),
        "{stderr}"
    );

    let _daemon = start_daemon_at(DEFAULT_PORT, &[], &[]);
    let table = once(&[], "eaddrnotavail");
    assert!(
        table.starts_with(&format!("observer top: http://127.0.0.1:{DEFAULT_PORT}/metrics,")),
        "a daemon answers: read it:\n{table}"
    );
}

/// tmux's view of the pane, as text.
fn capture(session: &str) -> String {
    let out = Command::new("tmux").args(["capture-pane", "-p", "-t", session]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tmux(args: &[&str]) -> bool {
    Command::new("tmux").args(args).status().unwrap().success()
}

#[test]
fn the_live_view_ranks_sorts_on_a_key_and_quits_on_q() {
    let daemon = start_daemon(&[]);
    let scenario = Scenario::start();
    let (culprit, healthy) = (scenario.culprit.0.id().to_string(), scenario.healthy.0.id().to_string());
    let session = format!("observer-top-{}", std::process::id());
    let command = format!("{OBSERVER} top --from http://127.0.0.1:{} --interval 1s", daemon.port);
    assert!(tmux(&["new-session", "-d", "-s", &session, "-x", "220", "-y", "40", &command]), "tmux starts");
    let first_row = |screen: &str| rows(screen).first().map(|(pid, _)| pid.clone());
    let until = |want: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = capture(&session);
            if first_row(&screen).as_deref() == Some(want) || Instant::now() > deadline {
                return screen;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    let screen = until(&culprit);
    assert_eq!(first_row(&screen).as_deref(), Some(culprit.as_str()), "sorted by EADDRNOTAVAIL:\n{screen}");
    assert!(screen.contains("*EADDRNOTAVAIL/s"), "{screen}");

    assert!(tmux(&["send-keys", "-t", &session, "c"]));
    let screen = until(&healthy);
    assert_eq!(first_row(&screen).as_deref(), Some(healthy.as_str()), "sorted by connects:\n{screen}");
    assert!(screen.contains("*CONNECTS/s"), "{screen}");

    // A smaller terminal: the view redraws to fit, the ranking kept.
    assert!(tmux(&["resize-window", "-t", &session, "-x", "200", "-y", "20"]));
    std::thread::sleep(Duration::from_millis(1500));
    let screen = capture(&session);
    assert!(screen.lines().count() <= 20 && first_row(&screen).as_deref() == Some(healthy.as_str()), "{screen}");

    assert!(tmux(&["send-keys", "-t", &session, "q"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux(&["has-session", "-t", &session]) {
        assert!(Instant::now() < deadline, "q did not end the view:\n{}", capture(&session));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_endpoint_that_cannot_be_read_is_an_error_naming_it() {
    let port = observer_testing::http::free_port();
    let out =
        Command::new(OBSERVER).args(["top", "--from", &format!("http://127.0.0.1:{port}"), "--once"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("127.0.0.1:{port}/metrics")), "{stderr}");
    let out = Command::new(OBSERVER).args(["top", "--from", "ftp://x"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("http://HOST:PORT"));
}
