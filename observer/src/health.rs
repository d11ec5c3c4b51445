//! Whether the daemon is doing its job, for `/healthz` and for the daemon
//! itself: kubelet restarts a pod whose liveness probe fails, so the probe
//! must fail when counting has stopped, not only when the process is gone.
//!
//! Healthy while the collector thread runs and a round completed within
//! the last `ROUNDS_MISSED` intervals (or the daemon started less than that
//! ago). A round stuck on a hung filesystem or failing to read the maps
//! makes it unhealthy; a collector thread that ended (a panic) also ends
//! the daemon, with an error, so the DaemonSet restarts it.
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::snapshot::Published;

/// How many intervals without a completed round make the daemon unhealthy.
pub const ROUNDS_MISSED: u32 = 3;

pub struct Health {
    published: Arc<Published>,
    interval: Duration,
    started: Instant,
    collector_running: AtomicBool,
}

impl Health {
    pub fn new(published: Arc<Published>, interval: Duration) -> Self {
        Self { published, interval, started: Instant::now(), collector_running: AtomicBool::new(true) }
    }

    /// None when healthy, else what is wrong (the `/healthz` answer).
    pub fn problem(&self) -> Option<String> {
        if !self.collector_running.load(Ordering::Relaxed) {
            return Some("the collector thread has ended: nothing is counted".into());
        }
        let allowed = self.interval * ROUNDS_MISSED;
        let last = self.published.latest().rounds.completed_at.unwrap_or(self.started);
        let since = last.elapsed();
        (since > allowed).then(|| {
            format!(
                "no collection round completed for {} (allowed: {ROUNDS_MISSED} intervals of {}); \
                 see observer_collection_failures_total and the log",
                humantime::format_duration(Duration::from_secs(since.as_secs())),
                humantime::format_duration(self.interval)
            )
        })
    }

    /// A guard for the collector thread to hold: when it drops (the thread
    /// ends, by a panic too), the daemon is told through the returned
    /// receiver. (Joining the thread instead would block the runtime's
    /// shutdown on a thread stuck on a hung filesystem.)
    pub fn collector_guard(self: &Arc<Self>) -> (CollectorGuard, tokio::sync::watch::Receiver<CollectorState>) {
        let (ended, watch) = tokio::sync::watch::channel(CollectorState::Running);
        (CollectorGuard { health: self.clone(), ended }, watch)
    }
}

/// What became of the collector thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectorState {
    Running,
    Ended,
    Panicked,
}

pub struct CollectorGuard {
    health: Arc<Health>,
    ended: tokio::sync::watch::Sender<CollectorState>,
}

impl Drop for CollectorGuard {
    fn drop(&mut self) {
        self.health.collector_running.store(false, Ordering::Relaxed);
        let how = if std::thread::panicking() { CollectorState::Panicked } else { CollectorState::Ended };
        self.ended.send_replace(how);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_at_start_then_not_without_rounds_then_again_after_one() {
        let published = Arc::new(Published::default());
        let health = Health::new(published.clone(), Duration::from_millis(20));
        assert_eq!(health.problem(), None, "the first rounds get their intervals");
        std::thread::sleep(Duration::from_millis(80));
        assert!(health.problem().is_some_and(|p| p.contains("no collection round")));
        published.update(|s| s.rounds.completed_at = Some(Instant::now()));
        assert_eq!(health.problem(), None);
    }

    #[test]
    fn a_collector_thread_that_panics_is_seen_gone() {
        let health = Arc::new(Health::new(Arc::new(Published::default()), Duration::from_secs(60)));
        let (guard, watch) = health.collector_guard();
        let thread = std::thread::spawn(move || {
            let _guard = guard;
            panic!("a bug in a round");
        });
        assert!(thread.join().is_err());
        assert_eq!(*watch.borrow(), CollectorState::Panicked, "the daemon is told");
        assert!(health.problem().is_some_and(|p| p.contains("collector thread has ended")));
    }
}
