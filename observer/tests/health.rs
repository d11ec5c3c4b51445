//! `/healthz` tells the truth: kubelet restarts observer when its liveness
//! probe fails, so the probe must fail when counting has stopped, and a
//! stuck round must not keep observer from ending on SIGTERM.
mod common;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use common::daemon::{start_daemon, start_daemon_with_env};
use observer_testing::http::get_within;

/// A /proc-like tree whose one process's network namespace is a FIFO:
/// opening it (to enter the namespace) blocks, as a hung filesystem would.
struct HungProc(PathBuf);

impl HungProc {
    fn new() -> Self {
        let root = std::env::temp_dir().join(format!("observer-hung-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("4242/ns")).unwrap();
        nix::unistd::mkfifo(&root.join("4242/ns/net"), nix::sys::stat::Mode::S_IRUSR).unwrap();
        Self(root)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for HungProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `/healthz`: (answered 200, the body).
fn healthz(port: u16) -> (bool, String) {
    try_healthz(port).unwrap()
}

/// `/healthz`, or why it could not be asked (a daemon that stopped serving).
fn try_healthz(port: u16) -> std::io::Result<(bool, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    std::io::Write::write_all(&mut s, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut s, &mut answer)?;
    Ok((answer.starts_with("HTTP/1.1 200"), answer))
}

#[test]
fn a_healthy_daemon_says_so() {
    let daemon = start_daemon(&[]);
    // A few rounds (200 ms each) later, still healthy.
    std::thread::sleep(Duration::from_secs(2));
    let (ok, answer) = healthz(daemon.port);
    assert!(ok && answer.ends_with("ok\n"), "{answer}");
}

#[test]
fn a_stuck_round_fails_healthz_and_sigterm_still_ends_observer() {
    let hung = HungProc::new();
    let mut daemon = start_daemon(&["--proc-root", hung.path().to_str().unwrap()]);
    // The first round is stuck entering the FIFO "namespace": after 3
    // intervals of 200 ms without a round, /healthz fails and says why.
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        let (ok, answer) = healthz(daemon.port);
        if !ok || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("no collection round completed"), "{answer}");
    // The metrics endpoint itself still answers.
    assert!(get_within(daemon.port, "/metrics", Duration::from_secs(1)).is_some());
    // SIGTERM: observer does not wait for the stuck round forever, and
    // says so with a non-zero exit.
    let status = daemon.terminate(Duration::from_secs(15)).expect("observer still running 15 s after SIGTERM");
    assert_eq!(status.code(), Some(1), "{}", daemon.log());
    assert!(daemon.log().contains("did not end within"), "{}", daemon.log());
}

/// A collector thread that dies (a bug, here a panic injected by fail-rs in
/// its 11th round) stops all counting: from then on /healthz never says ok
/// (503, or nothing once the endpoint closed), and observer ends non-zero
/// so the DaemonSet restarts it.
#[test]
fn a_dead_collector_fails_healthz_and_ends_observer_non_zero() {
    let mut daemon = start_daemon_with_env(&[], &[("FAILPOINTS", "collector-round=10*off->panic(injected)")]);
    assert!(healthz(daemon.port).0, "healthy before the fault:\n{}", daemon.log());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "observer still running 20 s after its collector was to panic (built without --features failpoints? \
             `cargo xtask test` enables it):\n{}",
            daemon.log()
        );
        // Logged once the thread is gone (the panic message comes earlier,
        // while it still unwinds).
        let dead = daemon.log().contains("the collector thread has ended");
        if let Ok((ok, answer)) = try_healthz(daemon.port) {
            assert!(!(dead && ok), "/healthz said ok after the collector died: {answer}\n{}", daemon.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1), "{}", daemon.log());
    let log = daemon.log();
    assert!(log.contains("panicked") && log.contains("injected"), "{log}");
    assert!(log.contains("the collector thread has ended"), "{log}");
}
