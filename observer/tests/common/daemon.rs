//! `observer run` as a user starts it: the binary, its Prometheus endpoint
//! and its log, for the tests of the daemon and of its exports.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use observer_testing::http::{free_port, rounds_completed, scrape};

pub const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

pub struct Daemon {
    pub child: Child,
    pub port: u16,
    log: PathBuf,
    /// Released after `drop` has seen the daemon exit (its programs
    /// detached); none for `start_daemon_beside`'s.
    _alone: Option<super::loads::OwnLoad>,
}

impl Daemon {
    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn scrape(&self) -> String {
        scrape(self.port).expect("scrape")
    }

    /// Send SIGTERM and wait (at most `limit`) for the exit status.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGTERM)
            .unwrap();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("observer's log:\n{}", self.log());
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

pub fn start_daemon(extra: &[&str]) -> Daemon {
    start_daemon_with_env(extra, &[])
}

pub fn start_daemon_with_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
    start_daemon_at(free_port(), extra, env)
}

/// A daemon serving on `port` of 127.0.0.1.
pub fn start_daemon_at(port: u16, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
    start(port, "200ms", extra, env)
}

/// A daemon that does not wait its turn (`loads`): it attaches and
/// detaches while another test's load counts, as a second tool on a node
/// does. For the tests of what that costs the other, only.
pub fn start_daemon_beside(extra: &[&str]) -> Daemon {
    spawn(None, free_port(), "200ms", extra, &[])
}

/// A daemon that waits until it may run alone (`loads`): no other test's
/// load counts while it attaches or detaches, nor attaches or detaches
/// while it counts.
fn start(port: u16, interval: &str, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
    spawn(Some(super::loads::own_load()), port, interval, extra, env)
}

fn spawn(
    alone: Option<super::loads::OwnLoad>,
    port: u16,
    interval: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Daemon {
    let log = std::env::temp_dir().join(format!("observer-test-{}-{port}.log", std::process::id()));
    let child = Command::new(OBSERVER)
        .args(["run", "--interval", interval, "--prometheus-listen", &format!("127.0.0.1:{port}")])
        .args(["--attach-mode", &super::test_mode().to_string()])
        .args(extra)
        // The test's own RUST_LOG would change what the daemon logs; a test
        // that wants its debug log passes RUST_LOG in `env`.
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let mut daemon = Daemon { child, port, log, _alone: alone };
    // A start takes ~0.5 s on the host and 3-7 s in an idle guest under
    // software emulation, but a guest starved by its neighbours (another
    // guest, the host suite, the image build) once logged nothing in 20 s:
    // the deadline is for a daemon that hangs, and one that exits is
    // reported at once.
    let deadline = Instant::now() + Duration::from_secs(90);
    while scrape(port).is_none() {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            panic!("observer exited ({status}) before serving:\n{}", daemon.log());
        }
        assert!(Instant::now() < deadline, "observer did not start serving in 90 s:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    daemon
}

/// A test's hold on a daemon's checks against the kernel's own counts
/// (the `kernel-checks-held` failpoint: while its file exists, rounds do
/// not count toward the next check). Removed with the hold.
pub struct ChecksHold {
    file: PathBuf,
}

impl ChecksHold {
    pub fn new() -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let file = std::env::temp_dir().join(format!("observer-test-checks-held-{}-{n}", std::process::id()));
        Self { file }
    }

    /// The failpoint's part of the daemon's FAILPOINTS.
    pub fn failpoint(&self) -> String {
        format!("kernel-checks-held=return({})", self.file.display())
    }
}

impl Drop for ChecksHold {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// A daemon whose rounds come every 500 ms, with `failpoints` and `hold`'s
/// for `between_checks`.
pub fn start_daemon_for_checks(hold: &ChecksHold, failpoints: &str) -> Daemon {
    let failpoints = format!("{failpoints};{}", hold.failpoint());
    start(free_port(), "500ms", &[], &[("FAILPOINTS", failpoints.as_str())])
}

/// Run `work` between two of the daemon's checks against the kernel's own
/// counts (every `KERNEL_CHECK_EVERY` rounds): from just after one to
/// before the next one's sweep, which a namespace made in `work` has as
/// its first. The checks are held while `work` runs, however long it
/// takes (a guest under load took 9 s for a namespace, a server and a
/// burst); asserted, not assumed, that the hold began before the next
/// check's sweep (a scrape's time, against the 4 s of rounds left).
pub fn between_checks<T>(daemon: &Daemon, hold: &ChecksHold, work: impl FnOnce() -> T) -> T {
    use observer::node::sweep::KERNEL_CHECK_EVERY;
    let body = scrape_until(daemon, Duration::from_secs(30), |b| rounds_completed(b) % KERNEL_CHECK_EVERY == 1);
    let after_check = rounds_completed(&body);
    std::fs::write(&hold.file, b"").unwrap();
    // The next check is round `after_check` + KERNEL_CHECK_EVERY; its sweep
    // starts once the round before it has ended.
    let held_at = rounds_completed(&daemon.scrape());
    assert!(
        held_at + 2 <= after_check + KERNEL_CHECK_EVERY,
        "the hold began too late to defer the next check (rounds {after_check} to {held_at})"
    );
    let out = work();
    std::fs::remove_file(&hold.file).unwrap();
    out
}

/// Scrape until `done` holds for the body (at most `limit`); the last body.
pub fn scrape_until(daemon: &Daemon, limit: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let body = daemon.scrape();
        if done(&body) || Instant::now() > deadline {
            return body;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The instruments a scrape may lack because the only hook counting them
/// could not attach on this kernel, as its `observer_probe_info` says
/// (`observer_probe_mode="none"`): their Prometheus names.
#[allow(dead_code, reason = "not every test binary checks every instrument")]
pub fn said_absent(body: &str) -> Vec<String> {
    observer::export::contract::ONLY_WITH_HOOK
        .iter()
        .filter(|(_, hook)| {
            let labels = [format!("observer_hook=\"{hook}\""), "observer_probe_mode=\"none\"".to_string()];
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            observer_testing::http::sample(body, "observer_probe_info", &labels).is_some()
        })
        .map(|(instrument, _)| instrument.prometheus_name())
        .collect()
}
