//! The counter maps' two buffers (observer-common's `buffers`): each round
//! switches the buffer the programs count into, waits until no program
//! can still be counting into the old one, reads it whole and empties it.
//! So each count is read exactly once, and a map holds only one
//! interval's keys: a process that met 17,000 destinations last week takes
//! no room today.
use aya::maps::{Array, HashMap as AyaHashMap, MapData, PerCpuHashMap};
use observer_common::{
    Config, ConnectErrorKey, ConnectionCounts, ConnectionKey, KeysCreated, ListenerDropKey, ProcCounters, ProcKey,
    names::maps,
};

use super::map_err;
use crate::error::Error;

/// The counter maps, by buffer.
pub struct Buffers {
    pub config: Array<MapData, Config>,
    pub proc_counters: [PerCpuHashMap<MapData, ProcKey, ProcCounters>; 2],
    pub connect_errors: [PerCpuHashMap<MapData, ConnectErrorKey, u64>; 2],
    pub keys_created: [AyaHashMap<MapData, u32, KeysCreated>; 2],
    pub listen_overflows: [PerCpuHashMap<MapData, ListenerDropKey, u64>; 2],
    pub connections: [AyaHashMap<MapData, ConnectionKey, ConnectionCounts>; 2],
}

/// One buffer's contents: the counts of one interval.
#[derive(Default)]
pub struct Interval {
    pub procs: Vec<(ProcKey, ProcCounters)>,
    pub connect_errors: Vec<(ConnectErrorKey, u64)>,
    pub listen_overflows: Vec<(ListenerDropKey, u64)>,
    pub connections: Vec<(ConnectionKey, ConnectionCounts)>,
}

impl Buffers {
    /// Switch the programs to the other buffer, then read and empty the one
    /// they counted into until now.
    pub fn take(&mut self) -> Result<Interval, Error> {
        let mut config = self.config.get(&0, 0).map_err(map_err(maps::CONFIG))?;
        let old = config.buffer as usize & 1;
        config.buffer = 1 - old as u32;
        self.config.set(0, config, 0).map_err(map_err(maps::CONFIG))?;
        wait_for_running_programs();

        let mut interval = Interval::default();
        for item in self.proc_counters[old].iter() {
            let (key, per_cpu) = item.map_err(map_err(maps::PROC_COUNTERS))?;
            let total = per_cpu.iter().fold(ProcCounters::default(), |a, v| ProcCounters {
                connects: a.connects.wrapping_add(v.connects),
                accepts: a.accepts.wrapping_add(v.accepts),
                time_wait_entries: a.time_wait_entries.wrapping_add(v.time_wait_entries),
            });
            interval.procs.push((key, total));
        }
        for item in self.connect_errors[old].iter() {
            let (key, per_cpu) = item.map_err(map_err(maps::CONNECT_ERRORS))?;
            interval.connect_errors.push((key, per_cpu.iter().fold(0u64, |a, v| a.wrapping_add(*v))));
        }
        for item in self.listen_overflows[old].iter() {
            let (key, per_cpu) = item.map_err(map_err(maps::LISTEN_OVERFLOWS))?;
            interval.listen_overflows.push((key, per_cpu.iter().fold(0u64, |a, v| a.wrapping_add(*v))));
        }
        for item in self.connections[old].iter() {
            interval.connections.push(item.map_err(map_err(maps::CONNECTIONS))?);
        }
        // Nothing counts into this buffer now: emptying it loses nothing.
        for (key, _) in &interval.procs {
            let _ = self.proc_counters[old].remove(key);
        }
        for (key, _) in &interval.connect_errors {
            let _ = self.connect_errors[old].remove(key);
        }
        for (key, _) in &interval.listen_overflows {
            let _ = self.listen_overflows[old].remove(key);
        }
        for (key, _) in &interval.connections {
            let _ = self.connections[old].remove(key);
        }
        let tgids: Vec<u32> = self.keys_created[old].keys().filter_map(Result::ok).collect();
        for tgid in tgids {
            let _ = self.keys_created[old].remove(&tgid);
        }
        Ok(interval)
    }
}

/// Wait until every BPF program that may have read the old buffer number
/// has finished: tracing programs run inside an RCU read-side section, and
/// membarrier(MEMBARRIER_CMD_GLOBAL) returns after an RCU grace period
/// (synchronize_rcu). Kernels booted with nohz_full refuse that command;
/// there a pause far longer than any program run stands in (logged once).
fn wait_for_running_programs() {
    const MEMBARRIER_CMD_GLOBAL: nix::libc::c_long = 1;
    // SAFETY: membarrier takes two integer arguments and touches no memory
    // of ours.
    let rc = unsafe { nix::libc::syscall(nix::libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if rc != 0 {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "membarrier(MEMBARRIER_CMD_GLOBAL) refused (a nohz_full kernel?): switching counter buffers \
                 with a 50 ms pause instead of an RCU grace period"
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
