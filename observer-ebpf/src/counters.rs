//! Counter updates shared by all probe families.
//!
//! Values are per CPU, but a softirq can interrupt a program on the same CPU
//! that is updating the same value, so increments are atomic adds (cheap: no
//! other CPU ever touches this copy). The bpf target offers no atomic
//! read-modify-write through `core::sync::atomic`, hence the one line of asm:
//! BPF_ATOMIC | BPF_ADD, which every kernel we support has.
//!
//! The counter maps come in two buffers (observer-common's `buffers`):
//! each update goes to the one `Config::buffer` names when it starts.
use aya_ebpf::maps::{HashMap, LruHashMap, PerCpuHashMap};
use observer_common::{
    Actor, ConnectErrorKey, ConnectionCounts, ConnectionKey, KeysCreated, ListenerDropKey, ProcCounters, ProcKey,
    QueuedEnd, TASK_COMM_LEN,
    buffers::{FOLDED_DADDR, KEYS_PER_PROCESS},
    handshake, lifetime, lost, lru,
};

use crate::maps::{
    CONNECT_ERRORS_0, CONNECT_ERRORS_1, CONNECTIONS_0, CONNECTIONS_1, KEYS_CREATED_0, KEYS_CREATED_1,
    LISTEN_OVERFLOWS_0, LISTEN_OVERFLOWS_1, LOST, LRU_CHURN, PROC_COUNTERS_0, PROC_COUNTERS_1, QUEUED_END_SCRATCH,
    QUEUED_ENDS, TIME_WAIT_BY_NETNS, config,
};

#[derive(Clone, Copy)]
pub enum ProcCounter {
    Connects,
    Accepts,
    TimeWaitEntries,
}

/// The per-process shares of keys (`KeysCreated`), by map.
#[derive(Clone, Copy)]
enum Share {
    ProcCounters,
    ConnectErrors,
    Connections,
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

/// `lru_remove` for a key that is rarely there: a lookup first, which
/// takes no lock, where a delete locks the key's bucket even to find
/// nothing (the in-flight entry of a connect() that had returned before
/// its outcome, looked for at every socket's close).
#[inline(always)]
pub fn lru_remove_if_there<K, V>(map: &LruHashMap<K, V>, which: u32, key: &K) {
    // SAFETY: only whether an entry is there is read.
    if unsafe { map.get(key) }.is_some() {
        lru_remove(map, which, key);
    }
}

#[inline(always)]
fn add_to(array: &aya_ebpf::maps::PerCpuArray<u64>, slot: u32) {
    if let Some(p) = array.get_ptr_mut(slot) {
        add(p, 1);
    }
}

/// The buffer the programs count into now.
#[inline(always)]
fn buffer() -> u32 {
    config().buffer
}

/// Whether the process may create one more key in the buffer's map
/// `share` names, counting it if so. The
/// check and the count are two steps: CPUs racing on one process may each
/// pass at the bound, so a process can exceed it by at most one key per CPU.
#[inline(always)]
fn may_create_key(keys: &HashMap<u32, KeysCreated>, tgid: u32, share: Share) -> bool {
    let created = match keys.get_ptr_mut(&tgid) {
        Some(v) => v,
        None => {
            let _ = keys.insert(&tgid, &KeysCreated::default(), 1);
            match keys.get_ptr_mut(&tgid) {
                Some(v) => v,
                // No room to keep count: let it create (the map's own
                // capacity still bounds it).
                None => return true,
            }
        }
    };
    // SAFETY: `created` points into the map value, valid for the program's run.
    let count = unsafe {
        match share {
            Share::ProcCounters => &raw mut (*created).proc_counters,
            Share::ConnectErrors => &raw mut (*created).connect_errors,
            Share::Connections => &raw mut (*created).connections,
        }
    };
    // SAFETY: as above.
    if unsafe { core::ptr::read_volatile(count) } >= KEYS_PER_PROCESS {
        return false;
    }
    add(count, 1);
    true
}

/// The value of `key` in `map`, created if needed (BPF_NOEXIST: if another
/// CPU created it meanwhile, the insert fails and the lookup finds theirs).
#[inline(always)]
fn value_of<K, V>(map: &PerCpuHashMap<K, V>, key: &K, zero: &V) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    let _ = map.insert(key, zero, 1);
    map.get_ptr_mut(key)
}

/// `value_of` for a map shared by all CPUs.
#[inline(always)]
fn shared_value_of<K, V>(map: &HashMap<K, V>, key: &K, zero: &V) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    let _ = map.insert(key, zero, 1);
    map.get_ptr_mut(key)
}

/// The zero value new connection keys start from: a global rather than
/// the stack, which a 328-byte value would crowd.
static ZERO_CONNECTION_COUNTS: ConnectionCounts = ConnectionCounts {
    established: 0,
    closed: [0; lifetime::BUCKETS],
    handshakes: [0; handshake::BUCKETS],
    handshake_retransmits: 0,
    closed_older: 0,
    closed_by_peer: 0,
};

/// The log2 bucket of a duration (`lifetime`): the first of `buckets` - 1
/// bounds it does not exceed, else the last.
#[inline(always)]
fn log2_bucket(ns: u64, buckets: usize) -> usize {
    for i in 0..buckets - 1 {
        if ns <= lifetime::bound_ns(i) {
            return i;
        }
    }
    buckets - 1
}

/// How a connection's start was counted.
pub enum Counted {
    /// Under its own key.
    AsIs,
    /// Under its key with the destination folded (`FOLDED_DADDR`): the
    /// process was past its share of keys in this interval.
    Folded,
    /// Not at all: the buffer's map is full.
    No,
}

/// The end of a connection's handshake, as counted under its key.
pub enum HandshakeEnd {
    /// It reached ESTABLISHED: how long the handshake took when its SYN
    /// was seen, and the SYNs or SYN-ACKs sent again.
    Established { took_ns: Option<u64>, retransmits: u64 },
    /// It failed (SYN_SENT -> CLOSE) after this many SYNs sent again.
    Failed { retransmits: u64 },
}

/// Count the end of a connection's handshake under `key`, folded first (in
/// place) if its process is past its share of keys.
#[inline(always)]
pub fn bump_handshake_end(key: &mut ConnectionKey, end: HandshakeEnd) -> Counted {
    let (map, keys) = if buffer() == 0 { (&CONNECTIONS_0, &KEYS_CREATED_0) } else { (&CONNECTIONS_1, &KEYS_CREATED_1) };
    let mut counted = Counted::AsIs;
    let value = match map.get_ptr_mut(&*key) {
        Some(v) => Some(v),
        None => {
            if !may_create_key(keys, key.actor.tgid, Share::Connections) {
                key.addr = FOLDED_DADDR;
                key.port = 0;
                counted = Counted::Folded;
            }
            shared_value_of(map, &*key, &ZERO_CONNECTION_COUNTS)
        }
    };
    let Some(value) = value else {
        count_lost(lost::CONNECTIONS_FULL);
        return Counted::No;
    };
    let retransmits = match end {
        HandshakeEnd::Established { took_ns, retransmits } => {
            // SAFETY: `value` points into the map's value, shared by all
            // CPUs: the adds are atomic.
            add(unsafe { &raw mut (*value).established }, 1);
            if let Some(ns) = took_ns {
                // SAFETY: as above; the bucket is < handshake::BUCKETS.
                if let Some(slot) = unsafe { (*value).handshakes.get_mut(log2_bucket(ns, handshake::BUCKETS)) } {
                    add(slot, 1);
                }
            }
            retransmits
        }
        HandshakeEnd::Failed { retransmits } => retransmits,
    };
    if retransmits > 0 {
        // SAFETY: as above.
        add(unsafe { &raw mut (*value).handshake_retransmits }, retransmits);
    }
    counted
}

/// Count the end of a connection established `lived_ns` ago under `key`
/// (the key its start was counted under: never folded again, so a
/// connection's start and end always meet); None: established before
/// observer started, how long ago unknown. `by_peer`: the far end closed
/// first.
#[inline(always)]
pub fn bump_connection_closed(key: &ConnectionKey, lived_ns: Option<u64>, by_peer: bool) {
    let map = if buffer() == 0 { &CONNECTIONS_0 } else { &CONNECTIONS_1 };
    let bucket = lived_ns.map(|ns| log2_bucket(ns, lifetime::BUCKETS));
    let Some(value) = shared_value_of(map, key, &ZERO_CONNECTION_COUNTS) else {
        // Queued: counted by userspace in the round that reads it.
        let queued = QUEUED_END_SCRATCH.get_ptr_mut(0).is_some_and(|end| {
            // SAFETY: this CPU's slot, used only here, start to end.
            unsafe {
                (*end).key = *key;
                (*end).bucket = bucket.map_or(QueuedEnd::OLDER, |b| b as u32);
                (*end).by_peer = u32::from(by_peer);
                QUEUED_ENDS.push(&*end, 0).is_ok()
            }
        });
        if !queued {
            count_lost(lost::QUEUED_ENDS_FULL);
        }
        return;
    };
    // SAFETY: as above; the bucket is < lifetime::BUCKETS.
    let slot = match bucket {
        Some(b) => unsafe { (*value).closed.get_mut(b) },
        None => Some(unsafe { &mut (*value).closed_older }),
    };
    if let Some(slot) = slot {
        add(slot, 1);
    }
    if by_peer {
        // SAFETY: as above.
        add(unsafe { &raw mut (*value).closed_by_peer }, 1);
    }
}

/// Add one to `counter` of (`actor`, `family`), creating the entry if needed.
#[inline(always)]
pub fn bump_proc(actor: &Actor, family: u16, counter: ProcCounter) {
    let (map, keys) =
        if buffer() == 0 { (&PROC_COUNTERS_0, &KEYS_CREATED_0) } else { (&PROC_COUNTERS_1, &KEYS_CREATED_1) };
    let mut key = ProcKey { actor: *actor, family, _pad: [0; 3] };
    let value = match map.get_ptr_mut(&key) {
        Some(v) => Some(v),
        None => {
            // A process over its share (one that renames itself without
            // end) counts under its name-less key.
            if !may_create_key(keys, actor.tgid, Share::ProcCounters) {
                key.actor.comm = [0; TASK_COMM_LEN];
            }
            value_of(map, &key, &ProcCounters::default())
        }
    };
    let Some(value) = value else { return count_lost(lost::PROC_COUNTERS_FULL) };
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

/// Count one TIME_WAIT entry of a socket of namespace `netns`.
#[inline(always)]
pub fn bump_netns_time_wait(netns: u32) {
    match value_of(&TIME_WAIT_BY_NETNS, &netns, &0) {
        Some(v) => add(v, 1),
        None => count_lost(lost::TIME_WAIT_BY_NETNS_FULL),
    }
}

/// Count one connect() failure.
#[inline(always)]
pub fn bump_connect_error(key: &ConnectErrorKey) {
    crate::trace::connect_error(key);
    let (map, keys) =
        if buffer() == 0 { (&CONNECT_ERRORS_0, &KEYS_CREATED_0) } else { (&CONNECT_ERRORS_1, &KEYS_CREATED_1) };
    let value = match map.get_ptr_mut(key) {
        Some(v) => Some(v),
        None => {
            // A process over its share of destinations (a scanner) counts
            // under its folded destination: its totals per errno stay exact.
            let mut key = *key;
            if !may_create_key(keys, key.actor.tgid, Share::ConnectErrors) {
                key.daddr = FOLDED_DADDR;
                key.dport = 0;
            }
            value_of(map, &key, &0)
        }
    };
    match value {
        Some(v) => add(v, 1),
        None => count_lost(lost::CONNECT_ERRORS_FULL),
    }
}

/// Count one listener drop (an overflow, a full SYN queue); false if the
/// buffer's map is full. Keys are listeners (by reason), which the
/// kernel's own limits bound, so there is no per-process share as for the
/// maps above.
#[inline(always)]
pub fn bump_listener_drop(key: &ListenerDropKey) -> bool {
    let map = if buffer() == 0 { &LISTEN_OVERFLOWS_0 } else { &LISTEN_OVERFLOWS_1 };
    match value_of(map, key, &0) {
        Some(v) => {
            add(v, 1);
            true
        }
        None => false,
    }
}
