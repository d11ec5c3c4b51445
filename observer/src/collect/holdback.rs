//! Counts whose pod labels are not known yet wait a round: a process's
//! series are created with the labels it will keep, and the collection
//! loop never waits on a pod lookup (see attribution/resolver.rs).
use std::collections::HashSet;

use observer_common::{ConnectErrorKey, ConnectionCounts, ConnectionKey, ProcCounters, ProcKey};

use super::{Deltas, ListenerDrops};
use crate::attribution::{PodKey, pod_key};

#[derive(Default)]
pub struct Held {
    procs: Vec<(ProcKey, ProcCounters)>,
    connect_errors: Vec<(ConnectErrorKey, u64)>,
    listen_drops: Vec<ListenerDrops>,
    connections: Vec<(ConnectionKey, ConnectionCounts)>,
}

impl Held {
    /// Put the counts held earlier in front of this round's (they are
    /// increments: nothing to merge).
    pub fn release_into(&mut self, deltas: &mut Deltas) {
        deltas.procs.splice(0..0, self.procs.drain(..));
        deltas.connect_errors.splice(0..0, self.connect_errors.drain(..));
        deltas.listen_drops.splice(0..0, self.listen_drops.drain(..));
        deltas.connections.splice(0..0, self.connections.drain(..));
    }

    /// The actors whose counts wait.
    pub fn actors(&self) -> impl Iterator<Item = &observer_common::Actor> {
        self.procs
            .iter()
            .map(|(k, _)| &k.actor)
            .chain(self.connect_errors.iter().map(|(k, _)| &k.actor))
            .chain(self.listen_drops.iter().map(|d| &d.owner))
            .chain(self.connections.iter().map(|(k, _)| &k.actor))
    }

    /// Take the counts of actors in `pending` out of `deltas`, except those
    /// of processes retired this round (their series end now).
    pub fn hold(&mut self, deltas: &mut Deltas, pending: &HashSet<PodKey>) {
        if pending.is_empty() {
            return;
        }
        let retired: HashSet<PodKey> = deltas.retired.iter().copied().collect();
        let wait = |actor: &observer_common::Actor| {
            let key = pod_key(actor);
            pending.contains(&key) && !retired.contains(&key)
        };
        let (held, kept): (Vec<_>, Vec<_>) = deltas.procs.drain(..).partition(|(k, _)| wait(&k.actor));
        self.procs.extend(held);
        deltas.procs = kept;
        let (held, kept): (Vec<_>, Vec<_>) = deltas.connect_errors.drain(..).partition(|(k, _)| wait(&k.actor));
        self.connect_errors.extend(held);
        deltas.connect_errors = kept;
        let (held, kept): (Vec<_>, Vec<_>) = deltas.listen_drops.drain(..).partition(|d| wait(&d.owner));
        self.listen_drops.extend(held);
        deltas.listen_drops = kept;
        let (held, kept): (Vec<_>, Vec<_>) = deltas.connections.drain(..).partition(|(k, _)| wait(&k.actor));
        self.connections.extend(held);
        deltas.connections = kept;
    }
}

#[cfg(test)]
mod tests {
    use observer_common::Actor;

    use super::*;

    fn proc(tgid: u32, connects: u64) -> (ProcKey, ProcCounters) {
        let key = ProcKey { actor: Actor { tgid, ..Default::default() }, family: 2, _pad: [0; 3] };
        (key, ProcCounters { connects, ..Default::default() })
    }

    #[test]
    fn pending_counts_wait_a_round_and_come_back_first_and_whole() {
        let mut held = Held::default();
        let mut round1 = Deltas { procs: vec![proc(1, 5), proc(2, 7)], ..Default::default() };
        held.hold(&mut round1, &[(2, 0)].into());
        assert_eq!(round1.procs, vec![proc(1, 5)]);

        let mut round2 = Deltas { procs: vec![proc(2, 1)], ..Default::default() };
        held.release_into(&mut round2);
        assert_eq!(round2.procs, vec![proc(2, 7), proc(2, 1)], "nothing lost, older first");
        held.hold(&mut round2, &HashSet::new());
        assert_eq!(round2.procs.len(), 2);
    }

    #[test]
    fn a_retired_process_is_never_held() {
        let mut held = Held::default();
        let mut round = Deltas { procs: vec![proc(3, 2)], retired: vec![(3, 0)], ..Default::default() };
        held.hold(&mut round, &[(3, 0)].into());
        assert_eq!(round.procs, vec![proc(3, 2)]);
    }
}
