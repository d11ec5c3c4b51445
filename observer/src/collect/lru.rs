//! How full the LRU maps are, and how many entries the kernel evicted.
//!
//! An LRU map makes room by evicting its least recently used entry without
//! telling anyone; an evicted socket owner means a later TIME_WAIT is
//! charged to no one, an evicted in-flight connect means a lost error. The
//! programs count, per map, the entries they created and removed
//! (`LRU_CHURN`); every entry created is either still there, removed, or
//! evicted, so evictions = created -
//! removed - entries now.
//!
//! The three numbers cannot be read at one instant. Reading `created`
//! first and `removed` last makes the result a lower bound of the true
//! evictions (an entry created meanwhile is not in `created` but may be in
//! the entries or in `removed`; one removed meanwhile is in `removed` and
//! may still have been counted as an entry), exact when the map is quiet.
//! Evictions only grow, so the exported total is the highest bound seen:
//! never more than the kernel evicted, and all of it once traffic calms.
//!
//! Counting a map's entries takes one syscall per key (3-4 ms a round for
//! a few thousand sockets held), so the walk is done only when it can
//! tell something: the kernel's LRU evicts only when its free nodes run
//! out, so while created - removed - evicted stays below the capacity by
//! more than the free nodes its CPUs may hold back, nothing can have been
//! evicted and that difference is the count. The map is walked when it
//! comes near its capacity, and every `WALK_EVERY` rounds anyway, so an
//! entry taken out some way the counts miss (a race of two CPUs on one
//! key) does not linger in the gauge.
use aya::{
    Pod,
    maps::{HashMap as AyaHashMap, MapData, PerCpuArray},
};
use observer_common::{lru, names::maps};

use super::map_err;
use crate::error::Error;

/// One map's fill, for `observer_map_usage`/`_limit`/`_evictions_total`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapFill {
    pub map: &'static str,
    pub entries: u64,
    pub capacity: u64,
    /// LRU maps only: entries evicted so far (a lower bound, see above).
    pub evictions: Option<u64>,
}

/// The LRU maps observer only writes from the kernel side, kept to count
/// their entries (LISTENERS, which the collector also reads, is passed in).
pub struct LruMaps {
    pub sock_owners: AyaHashMap<MapData, u64, observer_common::Actor>,
    pub inflight_connects: AyaHashMap<MapData, u64, observer_common::InflightConnect>,
    pub thread_connects: AyaHashMap<MapData, u64, observer_common::ThreadConnect>,
    pub churn: PerCpuArray<MapData, u64>,
    /// Capacities as loaded (SOCK_OWNERS is set by --max-sockets).
    pub capacities: [u32; lru::MAPS as usize],
}

/// The highest eviction bound seen per map.
#[derive(Default)]
pub struct EvictionTracker {
    evicted: [u64; lru::MAPS as usize],
    /// Rounds since each map's keys were last walked (None: never).
    since_walk: [Option<u32>; lru::MAPS as usize],
}

/// Rounds between two walks of a map far from its capacity.
const WALK_EVERY: u32 = 10;

/// Free nodes the kernel's LRU (kernel/bpf/bpf_lru_list.c) moves from the
/// map's free list to a CPU's own at a time (`LOCAL_FREE_TARGET`): it
/// starts evicting when the shared list holds fewer, while each CPU may
/// still hold that many unused.
const LOCAL_FREE_TARGET: u64 = 128;

/// How far below its capacity a map's count must stay for the kernel not
/// to have evicted from it: the free nodes the CPUs' lists and the shared
/// list's last batch may hold.
fn eviction_margin(cpus: u64) -> u64 {
    LOCAL_FREE_TARGET * (cpus + 1)
}

/// Whether a map with an `estimate` of its entries must be walked this
/// round (`since_walk` rounds after its last walk).
fn must_walk(estimate: u64, capacity: u64, cpus: u64, since_walk: Option<u32>) -> bool {
    since_walk.is_none_or(|n| n + 1 >= WALK_EVERY) || estimate + eviction_margin(cpus) >= capacity
}

impl EvictionTracker {
    /// Read every LRU map's fill; `listeners` is the LISTENERS map.
    /// `walk_all`: walk every map now (a last reading, which must hold
    /// every eviction: between walks entries evicted and entries still
    /// there look alike).
    pub fn read(
        &mut self,
        maps: &LruMaps,
        listeners: &AyaHashMap<MapData, observer_common::ListenerKey, observer_common::Actor>,
        walk_all: bool,
    ) -> Result<Vec<MapFill>, Error> {
        let mut out = Vec::with_capacity(lru::MAPS as usize);
        let cpus = possible_cpus();
        for (which, name) in [
            (lru::SOCK_OWNERS, maps::SOCK_OWNERS),
            (lru::LISTENERS, maps::LISTENERS),
            (lru::INFLIGHT_CONNECTS, maps::INFLIGHT_CONNECTS),
            (lru::THREAD_CONNECTS, maps::THREAD_CONNECTS),
        ] {
            let capacity = maps.capacities[which as usize] as u64;
            let i = which as usize;
            let created = churn(maps, lru::created(which))?;
            // At most the entries there (`evicted` is a lower bound).
            let estimate = created.saturating_sub(churn(maps, lru::removed(which))?).saturating_sub(self.evicted[i]);
            if !walk_all && !must_walk(estimate, capacity, cpus, self.since_walk[i]) {
                self.since_walk[i] = self.since_walk[i].map(|n| n + 1);
                out.push(MapFill { map: name, entries: estimate, capacity, evictions: Some(self.evicted[i]) });
                continue;
            }
            let entries = match which {
                lru::SOCK_OWNERS => count_keys(&maps.sock_owners, capacity),
                lru::LISTENERS => count_keys(listeners, capacity),
                lru::INFLIGHT_CONNECTS => count_keys(&maps.inflight_connects, capacity),
                _ => count_keys(&maps.thread_connects, capacity),
            };
            let removed = churn(maps, lru::removed(which))?;
            // Entries not countable this round (the map changed under the
            // walk too much): keep the previous bound.
            let Some(entries) = entries else { continue };
            self.since_walk[i] = Some(0);
            let bound = created.saturating_sub(removed).saturating_sub(entries);
            let evicted = &mut self.evicted[which as usize];
            *evicted = (*evicted).max(bound);
            out.push(MapFill { map: name, entries, capacity, evictions: Some(*evicted) });
        }
        Ok(out)
    }
}

/// The CPUs a per-CPU list may exist for (at least 1).
fn possible_cpus() -> u64 {
    static CPUS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| aya::util::nr_cpus().map_or(1, |n| n.max(1) as u64))
}

/// Sum over CPUs of one `LRU_CHURN` slot.
fn churn(maps: &LruMaps, slot: u32) -> Result<u64, Error> {
    let values = maps.churn.get(&slot, 0).map_err(map_err(maps::LRU_CHURN))?;
    Ok(values.iter().fold(0u64, |a, v| a.wrapping_add(*v)))
}

/// The keys in `map`, walked with BPF_MAP_GET_NEXT_KEY. When the key the
/// walk stands on is deleted, the kernel restarts from the first key, so
/// under heavy churn a walk could revisit keys without end: it gives up
/// (None) after twice the capacity.
fn count_keys<K: Pod, V: Pod>(map: &AyaHashMap<MapData, K, V>, capacity: u64) -> Option<u64> {
    let mut n = 0u64;
    for key in map.keys() {
        key.ok()?;
        n += 1;
        if n > capacity * 2 {
            return None;
        }
    }
    Some(n.min(capacity))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_is_walked_first_then_every_walk_every_rounds() {
        assert!(must_walk(0, 100_000, 2, None), "never walked");
        assert!(!must_walk(0, 100_000, 2, Some(0)));
        assert!(!must_walk(0, 100_000, 2, Some(WALK_EVERY - 2)));
        assert!(must_walk(0, 100_000, 2, Some(WALK_EVERY - 1)));
    }

    #[test]
    fn a_map_near_its_capacity_is_walked_every_round() {
        // 2 CPUs: up to 3 x 128 free nodes may be held back.
        assert!(!must_walk(100_000 - 385, 100_000, 2, Some(0)));
        assert!(must_walk(100_000 - 384, 100_000, 2, Some(0)));
        // A small map on a big node is always walked.
        assert!(must_walk(0, 4_096, 64, Some(0)));
    }
}
