//! Pod (and executable) lookups off the collection loop: an `Attributor`
//! on its own thread.
//!
//! A lookup of a new cgroup walks the cgroup tree and lists kubelet's pod
//! logs: quick on a healthy node, but a filesystem can stall, and the
//! collection loop must never wait on it. The collector asks for the
//! labels it does not know, waits a few milliseconds for the answer (enough
//! for the usual case, so new processes' counts go out in the same round),
//! and otherwise holds those counts back a round (see collect.rs) rather
//! than creating their series without labels.
use std::{
    collections::{HashMap, HashSet},
    sync::mpsc,
    time::{Duration, Instant},
};

use super::{Attributor, Identity, PodKey};

/// One lookup: the key, the cgroup id the kernel recorded, the pid.
type Request = (PodKey, u64, u32);
type Answer = (PodKey, Identity);

/// How long the collector waits for answers in one round.
const WAIT: Duration = Duration::from_millis(50);

/// After this long without an answer, counts are let go without labels
/// (the lookup thread is stuck; one warning says so).
pub const GIVE_UP: Duration = Duration::from_secs(30);

pub struct Resolver {
    known: HashMap<PodKey, Identity>,
    asked: HashMap<PodKey, Instant>,
    requests: mpsc::Sender<Vec<Request>>,
    answers: mpsc::Receiver<Vec<Answer>>,
    warned: bool,
}

/// What the collector learns about an actor's labels this round.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Resolved: the pod (None for a host process) and executable.
    Known(Identity),
    /// Asked, no answer yet.
    Pending,
}

impl Resolver {
    /// Start the lookup thread around `attributor`.
    pub fn spawn(mut attributor: Attributor) -> Self {
        Self::with_lookup(move |batch| {
            attributor.next_round();
            batch.into_iter().map(|(key, cgroup, pid)| (key, attributor.identity(cgroup, pid))).collect()
        })
    }

    /// Start the lookup thread around `answer`, which resolves one batch.
    fn with_lookup(mut answer: impl FnMut(Vec<Request>) -> Vec<Answer> + Send + 'static) -> Self {
        let (requests, incoming) = mpsc::channel::<Vec<Request>>();
        let (outgoing, answers) = mpsc::channel::<Vec<Answer>>();
        let spawned = std::thread::Builder::new().name("observer-pods".into()).spawn(move || {
            // Ends when the collector (the sender) is dropped.
            while let Ok(batch) = incoming.recv() {
                if outgoing.send(answer(batch)).is_err() {
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the pod lookup thread: no container or pod labels");
        }
        Self { known: HashMap::new(), asked: HashMap::new(), requests, answers, warned: false }
    }

    /// Resolve `wanted` (key, cgroup id, pid) as far as possible now: known
    /// ones at once, new ones asked for and waited on for at most `WAIT`.
    pub fn resolve(&mut self, wanted: &[Request], now: Instant) -> HashMap<PodKey, Lookup> {
        let new: Vec<Request> = wanted
            .iter()
            .filter(|(key, ..)| !self.known.contains_key(key) && !self.asked.contains_key(key))
            .copied()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if !new.is_empty() {
            for (key, ..) in &new {
                self.asked.insert(*key, now);
            }
            let _ = self.requests.send(new);
        }
        let deadline = Instant::now() + WAIT;
        while !self.asked.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.answers.recv_timeout(left) {
                Ok(batch) => {
                    for (key, identity) in batch {
                        if let Some(asked) = self.asked.remove(&key) {
                            tracing::debug!(?key, ?identity, after = ?asked.elapsed(), "pod lookup answered");
                        }
                        self.known.insert(key, identity);
                    }
                }
                Err(_) => break,
            }
        }
        wanted
            .iter()
            .map(|(key, ..)| {
                let lookup = match (self.known.get(key), self.asked.get(key)) {
                    (Some(identity), _) => Lookup::Known(identity.clone()),
                    (None, Some(since)) if now.duration_since(*since) >= GIVE_UP => {
                        if !self.warned {
                            tracing::warn!("pod lookups take over {GIVE_UP:?}: counting on without pod labels");
                            self.warned = true;
                        }
                        Lookup::Known(Identity::default())
                    }
                    _ => Lookup::Pending,
                };
                (*key, lookup)
            })
            .collect()
    }

    /// Forget a process (or a cgroup's unknown owner) that is gone (its
    /// labels are in its series).
    pub fn forget(&mut self, key: PodKey) {
        self.known.remove(&key);
        self.asked.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::attribution::PodLabels;

    fn labels(uid: &str) -> Identity {
        let pod = PodLabels {
            container_id: "c".into(),
            pod_uid: uid.into(),
            pod_name: None,
            namespace: None,
            container_name: None,
        };
        Identity { pod: Some(Arc::new(pod)), executable: Some("nginx".into()) }
    }

    /// A lookup stuck on the filesystem (here: until the test lets it go)
    /// leaves the collector with "pending", not waiting; its answer is
    /// used once it comes, and a known key is never asked again.
    #[test]
    fn a_stuck_lookup_never_blocks_and_its_answer_is_used_when_it_comes() {
        let (release, gate) = mpsc::channel::<()>();
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = asked.clone();
        let mut resolver = Resolver::with_lookup(move |batch| {
            counted.fetch_add(batch.len(), std::sync::atomic::Ordering::SeqCst);
            let _ = gate.recv();
            batch.into_iter().map(|(key, ..)| (key, labels("u1"))).collect()
        });
        let wanted = [((7, 0), 123, 7)];
        let now = Instant::now();
        assert_eq!(resolver.resolve(&wanted, now)[&(7, 0)], Lookup::Pending);
        assert_eq!(resolver.resolve(&wanted, now)[&(7, 0)], Lookup::Pending, "asked once, still pending");

        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Lookup::Pending;
        while got == Lookup::Pending && Instant::now() < deadline {
            got = resolver.resolve(&wanted, now).remove(&(7, 0)).unwrap();
        }
        assert_eq!(got, Lookup::Known(labels("u1")));
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1, "one question for the key");
    }

    #[test]
    fn no_answer_for_long_means_no_labels_rather_than_waiting_forever() {
        let (_release, gate) = mpsc::channel::<()>();
        let mut resolver = Resolver::with_lookup(move |batch| {
            let _ = gate.recv();
            batch.into_iter().map(|(key, ..)| (key, Identity::default())).collect()
        });
        let wanted = [((8, 0), 1, 8)];
        let asked_at = Instant::now();
        assert_eq!(resolver.resolve(&wanted, asked_at)[&(8, 0)], Lookup::Pending);
        assert_eq!(resolver.resolve(&wanted, asked_at + GIVE_UP)[&(8, 0)], Lookup::Known(Identity::default()));
    }
}
