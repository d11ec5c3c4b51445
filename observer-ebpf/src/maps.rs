//! All maps and globals, in one place so their bounds are easy to audit.
//! Every map has a fixed capacity; maps whose keys churn (sockets, threads)
//! are LRU so stale entries make room on their own.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, Queue, RingBuf},
};
use observer_common::{
    Actor, ClosedListener, Config, ConnectErrorKey, ConnectionCounts, ConnectionKey, InflightConnect, KernelOffsets,
    KeysCreated, ListenerDropKey, ListenerKey, OpenConnection, ProcCounters, ProcKey, QueuedEnd, ThreadConnect,
    capacity, lost, lru,
};

/// Field offsets of this kernel, filled in by userspace from BTF at load.
#[unsafe(no_mangle)]
pub static OFFSETS: KernelOffsets = KernelOffsets {
    task_group_leader: 0,
    task_comm: 0,
    task_files: 0,
    files_fdt: 0,
    fdtable_max_fds: 0,
    fdtable_fd: 0,
    file_private_data: 0,
    socket_sk: 0,
    sock_protocol: 0,
    sock_err: 0,
    skc_family: 0,
    skc_state: 0,
    skc_num: 0,
    skc_dport: 0,
    skc_daddr: 0,
    skc_v6_daddr: 0,
    tcp_write_seq: 0,
    tcp_total_retrans: 0,
    skc_net: 0,
    net_ns_inum: 0,
    sock_cgroup: 0,
    cgroup_kn: 0,
    kernfs_node_id: 0,
    sock_ack_backlog: 0,
    sock_max_ack_backlog: 0,
    sock_drops: 0,
    skc_cookie: 0,
    icsk_syn_queue_len: 0,
    skb_protocol: 0,
    skb_tcp_tw_isn: 0,
    net_tcp_syncookies: 0,
    inet_sport: 0,
    sock_socket: 0,
    socket_inode_ino: 0,
};

/// The events `observer trace` asked its own copy of the programs to queue
/// in `TRACE_EVENTS` (`trace_event` bits), set by userspace before load
/// (`TRACE_KINDS`); 0, never changed, in the daemon's.
#[unsafe(no_mangle)]
pub static TRACE_KINDS: u32 = 0;

/// One field of the offsets, read through a volatile load: the compiler
/// must not fold the zeros above into the code, since userspace rewrites
/// them before load. One field at a time: a volatile read of the whole
/// struct copies all of it onto the stack (128 bytes of Linux 5.10's 512
/// at every use).
macro_rules! offset {
    ($field:ident) => {{
        // SAFETY: a field of a static, read in place.
        #[allow(unused_unsafe, reason = "used inside unsafe blocks and out")]
        let value = unsafe { core::ptr::read_volatile(core::ptr::addr_of!($crate::maps::OFFSETS.$field)) };
        value
    }};
}
pub(crate) use offset;

/// Which fallbacks are active (index 0); written by userspace after it knows
/// which preferred hooks attached.
#[map]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn config() -> Config {
    CONFIG.get(0).copied().unwrap_or_default()
}

/// connects, accepts, TIME_WAIT entries per process and family; two
/// buffers (observer-common's `buffers`).
#[map]
pub static PROC_COUNTERS_0: PerCpuHashMap<ProcKey, ProcCounters> =
    PerCpuHashMap::with_max_entries(capacity::PROC_COUNTERS, 0);
#[map]
pub static PROC_COUNTERS_1: PerCpuHashMap<ProcKey, ProcCounters> =
    PerCpuHashMap::with_max_entries(capacity::PROC_COUNTERS, 0);

/// connect() failures per process, destination and errno; two buffers.
#[map]
pub static CONNECT_ERRORS_0: PerCpuHashMap<ConnectErrorKey, u64> =
    PerCpuHashMap::with_max_entries(capacity::CONNECT_ERRORS, 0);
#[map]
pub static CONNECT_ERRORS_1: PerCpuHashMap<ConnectErrorKey, u64> =
    PerCpuHashMap::with_max_entries(capacity::CONNECT_ERRORS, 0);

/// Keys each process created in the buffer's counter maps (key: tgid), for
/// `buffers::KEYS_PER_PROCESS`; two buffers, emptied with the counters.
#[map]
pub static KEYS_CREATED_0: HashMap<u32, KeysCreated> = HashMap::with_max_entries(capacity::CONNECT_ERRORS, 0);
#[map]
pub static KEYS_CREATED_1: HashMap<u32, KeysCreated> = HashMap::with_max_entries(capacity::CONNECT_ERRORS, 0);

/// Listen-queue overflows (overflow.rs) and SYNs meeting a full SYN queue
/// (syn_queue.rs) per listener, owner and reason; two buffers, like the
/// counters above.
#[map]
pub static LISTEN_OVERFLOWS_0: PerCpuHashMap<ListenerDropKey, u64> =
    PerCpuHashMap::with_max_entries(capacity::LISTEN_OVERFLOWS, 0);
#[map]
pub static LISTEN_OVERFLOWS_1: PerCpuHashMap<ListenerDropKey, u64> =
    PerCpuHashMap::with_max_entries(capacity::LISTEN_OVERFLOWS, 0);

/// Connections established and closed per owner, direction and far end
/// (connections.rs); two buffers. Plain hash maps with atomic adds: a
/// per-CPU copy of a 184-byte value would cost too much memory.
#[map]
pub static CONNECTIONS_0: HashMap<ConnectionKey, ConnectionCounts> =
    HashMap::with_max_entries(capacity::CONNECTIONS, 0);
#[map]
pub static CONNECTIONS_1: HashMap<ConnectionKey, ConnectionCounts> =
    HashMap::with_max_entries(capacity::CONNECTIONS, 0);

/// Established connections being followed (key: `struct sock *`), so the
/// end of each is charged where its start was. Not LRU: an entry evicted
/// would leave a connection counted open for ever; a full map instead
/// leaves the new connection out, counted in `LOST`.
#[map]
pub static OPEN_CONNECTIONS: HashMap<u64, OpenConnection> = HashMap::with_max_entries(capacity::OPEN_CONNECTIONS, 0);

/// Connection ends that found their interval's `CONNECTIONS` full, for
/// userspace to count (a lost end would leave the connection open for
/// ever).
#[map]
pub static QUEUED_ENDS: Queue<QueuedEnd> = Queue::with_max_entries(capacity::QUEUED_ENDS, 0);

/// Where a `QueuedEnd` is built before it is pushed: `sock_state`'s stack
/// (480 of 512 bytes) has no room for its 72.
#[map]
pub static QUEUED_END_SCRATCH: PerCpuArray<QueuedEnd> = PerCpuArray::with_max_entries(1, 0);

/// Listeners that closed, with their last drop count, for the sweep to
/// settle (only where no overflow hook is attached, `Config`).
#[map]
pub static CLOSED_LISTENERS: Queue<ClosedListener> = Queue::with_max_entries(capacity::CLOSED_LISTENERS, 0);

/// Who owns a socket (key: `struct sock *`), recorded in process context
/// (connect, accept, listen) so softirq-time events can be attributed;
/// `owner_flags` in the value say more of the socket (time_wait.rs).
#[map]
pub static SOCK_OWNERS: LruHashMap<u64, Actor> = LruHashMap::with_max_entries(capacity::SOCK_OWNERS, 0);

/// Owner of each listening socket, looked up by userspace when it charges
/// the listener's drop counter (read through sock_diag) to a process.
#[map]
pub static LISTENERS: LruHashMap<ListenerKey, Actor> = LruHashMap::with_max_entries(capacity::LISTENERS, 0);

/// connect() calls in progress, keyed by `struct sock *`.
#[map]
pub static INFLIGHT_CONNECTS: LruHashMap<u64, InflightConnect> =
    LruHashMap::with_max_entries(capacity::INFLIGHT_CONNECTS, 0);

/// Threads inside connect() (key: pid_tgid), so the socket's CLOSE ->
/// SYN_SENT knows it happens in a connect() call, and connect()'s exit finds
/// the in-flight entry.
#[map]
pub static THREAD_CONNECTS: LruHashMap<u64, ThreadConnect> = LruHashMap::with_max_entries(capacity::THREAD_CONNECTS, 0);

/// Processes that exited (tgid -> 1); userspace retires their series after
/// a grace period and deletes their counters.
#[map]
pub static EXITED: HashMap<u32, u32> = HashMap::with_max_entries(capacity::EXITED, 0);

/// TIME_WAIT entries per network namespace (its inode), cumulative: the
/// same events as the process counters, kept apart so userspace can check
/// them against each namespace's own TcpExtTW + TcpExtTWKilled.
#[map]
pub static TIME_WAIT_BY_NETNS: PerCpuHashMap<u32, u64> =
    PerCpuHashMap::with_max_entries(capacity::TIME_WAIT_BY_NETNS, 0);

/// Updates that could not be made because a map was full (see `lost`).
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(lost::SLOTS, 0);

/// Entries the programs created and removed in each LRU map (see `lru`).
#[map]
pub static LRU_CHURN: PerCpuArray<u64> = PerCpuArray::with_max_entries(lru::SLOTS, 0);

/// Events for `observer trace`, written only where `TRACE_KINDS` is set
/// (the trace command's own copy of the programs). One page here; the
/// trace command's loader sizes it (`trace::RING_BYTES`), the daemon's
/// leaves it at this.
#[map]
pub static TRACE_EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Events `TRACE_EVENTS` had no room for (the reader fell behind).
#[map]
pub static TRACE_DROPPED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
