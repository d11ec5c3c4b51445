//! Counter updates shared by all probe families.
//!
//! Values are per CPU, but a softirq can interrupt a program on the same CPU
//! that is updating the same value, so increments are atomic adds (cheap: no
//! other CPU ever touches this copy). The bpf target offers no atomic
//! read-modify-write through `core::sync::atomic`, hence the one line of asm:
//! BPF_ATOMIC | BPF_ADD, which every kernel we support has.
use aya_ebpf::maps::LruHashMap;
use observer_common::{Actor, ConnectErrorKey, ProcCounters, ProcKey, lost, lru};

use crate::maps::{CONNECT_ERRORS, LOST, LRU_CHURN, PROC_COUNTERS};

#[derive(Clone, Copy)]
pub enum ProcCounter {
    Connects,
    Accepts,
    TimeWaitEntries,
}

#[inline(always)]
fn add(slot: *mut u64, n: u64) {
    // SAFETY: `slot` points into this CPU's copy of a map value, valid and
    // 8-byte aligned for the program's lifetime.
    unsafe { core::arch::asm!("lock *(u64 *)({0} + 0) += {1}", in(reg) slot, in(reg) n) };
}

#[inline(always)]
pub fn count_lost(slot: u32) {
    add_to(&LOST, slot);
}

/// Put `key` in the LRU map `which` (an `lru` index), counting the entry
/// when it is new, so userspace can tell how many the kernel evicted.
/// An existing entry is overwritten (a socket address reused, a listener
/// reopened) without counting.
#[inline(always)]
pub fn lru_insert<K, V>(map: &LruHashMap<K, V>, which: u32, key: &K, value: &V) -> Result<(), i32> {
    const BPF_ANY: u64 = 0;
    const BPF_NOEXIST: u64 = 1;
    const EEXIST: i32 = 17;
    match map.insert(key, value, BPF_NOEXIST) {
        Ok(()) => {
            add_to(&LRU_CHURN, lru::created(which));
            Ok(())
        }
        Err(e) if e == -EEXIST => map.insert(key, value, BPF_ANY),
        Err(e) => Err(e),
    }
}

/// Take `key` out of the LRU map `which`, counting it if it was there.
/// True if this call removed it (of two racing callers, only one does).
#[inline(always)]
pub fn lru_remove<K, V>(map: &LruHashMap<K, V>, which: u32, key: &K) -> bool {
    let removed = map.remove(key).is_ok();
    if removed {
        add_to(&LRU_CHURN, lru::removed(which));
    }
    removed
}

#[inline(always)]
fn add_to(array: &aya_ebpf::maps::PerCpuArray<u64>, slot: u32) {
    if let Some(p) = array.get_ptr_mut(slot) {
        add(p, 1);
    }
}

/// Add one to `counter` of (`actor`, `family`), creating the entry if needed.
#[inline(always)]
pub fn bump_proc(actor: &Actor, family: u16, counter: ProcCounter) {
    let key = ProcKey { actor: *actor, family, _pad: [0; 3] };
    let value = match PROC_COUNTERS.get_ptr_mut(&key) {
        Some(v) => v,
        None => {
            // BPF_NOEXIST: if another CPU created the entry meanwhile, the
            // insert fails and the lookup below finds theirs.
            let _ = PROC_COUNTERS.insert(&key, &ProcCounters::default(), 1);
            match PROC_COUNTERS.get_ptr_mut(&key) {
                Some(v) => v,
                None => return count_lost(lost::PROC_COUNTERS_FULL),
            }
        }
    };
    // SAFETY: `value` is this CPU's copy of the entry.
    let slot = unsafe {
        match counter {
            ProcCounter::Connects => &raw mut (*value).connects,
            ProcCounter::Accepts => &raw mut (*value).accepts,
            ProcCounter::TimeWaitEntries => &raw mut (*value).time_wait_entries,
        }
    };
    add(slot, 1);
}

/// Count one connect() failure.
#[inline(always)]
pub fn bump_connect_error(key: &ConnectErrorKey) {
    let value = match CONNECT_ERRORS.get_ptr_mut(key) {
        Some(v) => v,
        None => {
            let _ = CONNECT_ERRORS.insert(key, &0, 1);
            match CONNECT_ERRORS.get_ptr_mut(key) {
                Some(v) => v,
                None => return count_lost(lost::CONNECT_ERRORS_FULL),
            }
        }
    };
    add(value, 1);
}
