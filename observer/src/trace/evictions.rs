//! What the trace's LRU maps dropped to make room. An evicted socket owner
//! makes that socket's later events (its TIME_WAIT entry) show pid 0; an
//! evicted connect() in flight loses its failure. The trace counts them as
//! the daemon does (`collect::lru`: created - removed - entries, the
//! highest bound seen), and says so every few seconds and in its last
//! line, naming what to raise.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as AyaHashMap, MapData};
use observer_common::{Actor, ListenerKey, names::maps};

use crate::collect::{EvictionTracker, LruMaps};

pub struct Evictions {
    maps: LruMaps,
    listeners: AyaHashMap<MapData, ListenerKey, Actor>,
    tracker: EvictionTracker,
    /// The evictions already said, per map.
    said: HashMap<&'static str, u64>,
    last_read: Option<Instant>,
}

/// Counting a map's entries walks it, a syscall a key (65,536 for a full
/// socket-owner map): every few seconds, and once more at the end.
const READ_EVERY: Duration = Duration::from_secs(5);

/// Entries one map lost since the last reading.
pub struct Grown {
    pub map: &'static str,
    pub more: u64,
    pub capacity: u64,
}

impl Evictions {
    pub fn new(maps: LruMaps, listeners: AyaHashMap<MapData, ListenerKey, Actor>) -> Self {
        Self { maps, listeners, tracker: EvictionTracker::default(), said: HashMap::new(), last_read: None }
    }

    /// The maps that evicted entries since they were last read (a map that
    /// could not be read this time is read the next), read at most every
    /// `READ_EVERY` unless it is the `last` time.
    pub fn grown(&mut self, now: Instant, last: bool) -> Vec<Grown> {
        if !last && self.last_read.is_some_and(|at| now.duration_since(at) < READ_EVERY) {
            return Vec::new();
        }
        self.last_read = Some(now);
        let Ok(fills) = self.tracker.read(&self.maps, &self.listeners, last) else { return Vec::new() };
        let mut grown = Vec::new();
        for fill in fills {
            let total = fill.evictions.unwrap_or(0);
            let before = self.said.insert(fill.map, total).unwrap_or(0);
            if total > before {
                grown.push(Grown { map: fill.map, more: total - before, capacity: fill.capacity });
            }
        }
        grown
    }

    /// Every eviction said so far.
    pub fn total(&self) -> u64 {
        self.said.values().sum()
    }
}

impl Grown {
    /// The comment line saying it, with what it costs the trace and what to
    /// raise.
    pub fn text_line(&self) -> String {
        let (what, consequence) = match self.map {
            maps::SOCK_OWNERS => {
                ("socket owners", "those sockets' later events (TIME_WAIT) show pid 0; raise --max-sockets")
            }
            maps::LISTENERS => ("listener owners", "those listeners' overflows show pid 0"),
            _ => ("connect() calls in flight", "their failures or connects may be missing"),
        };
        format!("# {} {what} evicted: {} was full at {} entries; {consequence}", self.more, self.map, self.capacity)
    }

    pub fn json_line(&self) -> String {
        format!("{{\"evicted\":{},\"map\":\"{}\",\"capacity\":{}}}", self.more, self.map, self.capacity)
    }
}
