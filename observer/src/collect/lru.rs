//! How full the LRU maps are, and how many entries the kernel evicted.
//!
//! An LRU map makes room by evicting its least recently used entry without
//! telling anyone; an evicted socket owner means a later TIME_WAIT is
//! charged to no one, an evicted in-flight connect means a lost error. The
//! programs count, per map, the entries they created and removed
//! (`LRU_CHURN`), userspace those it entered at start; every entry created
//! is either still there, removed, or evicted, so evictions = created -
//! removed - entries now.
//!
//! The three numbers cannot be read at one instant. Reading `created`
//! first and `removed` last makes the result a lower bound of the true
//! evictions (an entry created meanwhile is not in `created` but may be in
//! the entries or in `removed`; one removed meanwhile is in `removed` and
//! may still have been counted as an entry), exact when the map is quiet.
//! Evictions only grow, so the exported total is the highest bound seen:
//! never more than the kernel evicted, and all of it once traffic calms.
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
    /// Entries userspace wrote (the owners of sockets older than observer,
    /// `probes::older`), which `LRU_CHURN` does not count as created.
    pub entered: [u64; lru::MAPS as usize],
}

/// The highest eviction bound seen per map.
#[derive(Default)]
pub struct EvictionTracker {
    evicted: [u64; lru::MAPS as usize],
}

impl EvictionTracker {
    /// Read every LRU map's fill; `listeners` is the LISTENERS map.
    pub fn read(
        &mut self,
        maps: &LruMaps,
        listeners: &AyaHashMap<MapData, observer_common::ListenerKey, observer_common::Actor>,
    ) -> Result<Vec<MapFill>, Error> {
        let mut out = Vec::with_capacity(lru::MAPS as usize);
        for (which, name) in [
            (lru::SOCK_OWNERS, maps::SOCK_OWNERS),
            (lru::LISTENERS, maps::LISTENERS),
            (lru::INFLIGHT_CONNECTS, maps::INFLIGHT_CONNECTS),
            (lru::THREAD_CONNECTS, maps::THREAD_CONNECTS),
        ] {
            let capacity = maps.capacities[which as usize] as u64;
            let created = churn(maps, lru::created(which))? + maps.entered[which as usize];
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
            let bound = created.saturating_sub(removed).saturating_sub(entries);
            let evicted = &mut self.evicted[which as usize];
            *evicted = (*evicted).max(bound);
            out.push(MapFill { map: name, entries, capacity, evictions: Some(*evicted) });
        }
        Ok(out)
    }
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
