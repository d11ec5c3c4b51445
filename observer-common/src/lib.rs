//! Every key and value that crosses the kernel boundary, declared once.
//!
//! Rules (checked at compile time below): `#[repr(C)]`, no implicit padding
//! (explicit `_pad` fields, `u32` flags instead of `bool`), sizes fixed.
//! The eBPF side uses these types as map keys/values; userspace reads them
//! with aya (`Pod`, behind the `user` feature).
#![no_std]

pub mod names;
mod offsets;
#[cfg(feature = "user")]
mod user;

pub use offsets::KernelOffsets;

/// Length of `task_struct::comm`, including the trailing NUL.
pub const TASK_COMM_LEN: usize = 16;

/// Address families as the kernel stores them in `sock_common::skc_family`.
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// TCP states (include/net/tcp_states.h); stable kernel ABI.
pub mod tcp_state {
    pub const ESTABLISHED: i32 = 1;
    pub const SYN_SENT: i32 = 2;
    pub const SYN_RECV: i32 = 3;
    pub const FIN_WAIT1: i32 = 4;
    pub const FIN_WAIT2: i32 = 5;
    pub const TIME_WAIT: i32 = 6;
    pub const CLOSE: i32 = 7;
    pub const CLOSE_WAIT: i32 = 8;
    pub const LAST_ACK: i32 = 9;
    pub const LISTEN: i32 = 10;
    pub const CLOSING: i32 = 11;
    /// A request minisocket (SYN received, no full socket yet).
    pub const NEW_SYN_RECV: i32 = 12;
}

/// The process an event is charged to: the thread group, the cgroup v2 it
/// ran in, and the thread-group leader's `comm` (what /proc/PID/status calls
/// `Name`; never the command line, which can hold secrets).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Actor {
    pub tgid: u32,
    /// 0 in every key that embeds the actor; in a `SOCK_OWNERS` value,
    /// `owner_flags` about the socket.
    pub owner_flags: u32,
    pub cgroup_id: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

/// Key of the per-process counters: who, and over which address family.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcKey {
    pub actor: Actor,
    pub family: u16,
    pub _pad: [u16; 3],
}

/// Per-process counters, one copy per CPU (summed by userspace).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcCounters {
    /// Active opens: a SYN was sent (counted at the return of the connect
    /// call that took the socket to SYN_SENT).
    pub connects: u64,
    /// Connections handed to the process by accept().
    pub accepts: u64,
    /// Sockets of this process that went to TIME_WAIT (FIN_WAIT2/CLOSING ->
    /// CLOSE without error, as `tcp_time_wait` hands them on).
    pub time_wait_entries: u64,
}

/// Key of the connect-error counters: who failed, toward where, with which
/// errno (positive, e.g. 99 for EADDRNOTAVAIL). Addresses are in network
/// byte order; IPv4 uses the first 4 bytes. The port is in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectErrorKey {
    pub actor: Actor,
    pub family: u16,
    pub dport: u16,
    pub errno: u32,
    pub daddr: [u8; 16],
}

/// A listening socket as userspace finds it again through sock_diag:
/// network namespace inode, local port (host order), address family.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerKey {
    pub netns: u32,
    pub port: u16,
    pub family: u16,
}

/// Key of the listener drop counters: the listener (namespace, local
/// port in host order, family), its owner, the process that called
/// listen() (tgid 0 with the socket's cgroup when observer did not see it),
/// and why the connection was dropped or answered differently
/// (`listener_drop`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerDropKey {
    pub owner: Actor,
    pub listener: ListenerKey,
    pub reason: u32,
    pub _pad: u32,
}

/// `ListenerDropKey.reason`: where the kernel counted the event, by the
/// name of its own counter.
pub mod listener_drop {
    /// The accept queue was full (TcpExtListenOverflows).
    pub const OVERFLOW: u32 = 0;
    /// The SYN queue was full (or syncookies=2) and a SYN cookie answered
    /// the SYN instead of a queued request (TcpExtTCPReqQFullDoCookies).
    pub const SYN_COOKIE: u32 = 1;
    /// The SYN queue was full with syncookies off: the SYN was dropped
    /// (TcpExtTCPReqQFullDrop).
    pub const SYN_DROP: u32 = 2;
}

/// A listener's last drop count, taken as it closed (LISTEN -> CLOSE), for
/// the mode where the sweep reads drop counts: drops after the sweep's last
/// reading would otherwise vanish with the socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClosedListener {
    /// The socket cookie, as sock_diag reports it (0: never asked, so the
    /// sweep never read this listener).
    pub cookie: u64,
    pub listener: ListenerKey,
    /// `sk_drops` at the close.
    pub drops: u32,
    pub _pad: u32,
    pub owner: Actor,
}

/// Who connects where: a connect() whose socket entered SYN_SENT. Kept per
/// socket (`INFLIGHT_CONNECTS`) while its outcome is still to come after the
/// connect() call returned (non-blocking, or interrupted), so an asynchronous
/// failure is charged to the caller and destination.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InflightConnect {
    pub actor: Actor,
    pub daddr: [u8; 16],
    pub family: u16,
    pub dport: u16,
    pub _pad: u32,
}

/// A thread inside connect() (key: pid_tgid): the call's arguments, read
/// only if it fails before the socket reaches SYN_SENT, and the socket with
/// its connection once it does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadConnect {
    /// The socket: a file descriptor if `from_syscall`, else the
    /// `struct socket *` inet_stream_connect() was given.
    pub socket: u64,
    /// The sockaddr: the caller's (user memory) if `from_syscall`, else
    /// the kernel's copy.
    pub addr: u64,
    /// The `struct sock *` that went CLOSE -> SYN_SENT in this call, else 0.
    pub sk: u64,
    /// Set with `sk`.
    pub connect: InflightConnect,
    /// 1: noted by the connect() syscall tracepoint.
    pub from_syscall: u32,
    pub _pad: u32,
}

/// Key of the connection counters: who holds the connection, which way
/// it goes, and its far end: outbound (`direction::OUTBOUND`), the server's
/// address (network byte order, IPv4 in the first 4 bytes) and port (host
/// order); inbound, the listener's port, with the address left zero. The
/// socket's network namespace (its inode) finds an inbound connection's
/// listener again (userspace names an owner the programs did not see).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionKey {
    pub actor: Actor,
    pub addr: [u8; 16],
    pub family: u16,
    pub port: u16,
    pub direction: u32,
    pub netns: u32,
    pub _pad: u32,
}

/// Which way a connection goes, as `ConnectionKey::direction`.
pub mod direction {
    /// This host connected (the socket went SYN_SENT -> ESTABLISHED).
    pub const OUTBOUND: u32 = 0;
    /// A listener of this host accepted it (SYN_RECV -> ESTABLISHED).
    pub const INBOUND: u32 = 1;
}

/// How long connections stayed established, in log2 buckets: bucket `i`
/// counts lifetimes of at most 2^i ms (1 ms .. 2^20 ms, 17.5 min) and above
/// the one before; the last bucket, those longer.
pub mod lifetime {
    pub const BUCKETS: usize = 22;
    /// The upper bound of bucket `i` (< BUCKETS - 1), in nanoseconds.
    pub const fn bound_ns(i: usize) -> u64 {
        (1u64 << i) * 1_000_000
    }
}

/// How long handshakes took (SYN sent to ESTABLISHED), in the same log2
/// buckets as `lifetime`, fewer: 1 ms .. 2^14 ms (16 s: a SYN lost four
/// times), and longer.
pub mod handshake {
    pub const BUCKETS: usize = 16;
}

/// Counts of one `ConnectionKey` in one interval. Not per CPU (a value
/// this size times every CPU would be large): the programs add atomically.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Connections that reached ESTABLISHED.
    pub established: u64,
    /// Connections that left ESTABLISHED (a FIN sent or received, a
    /// reset), by how long they had been established (`lifetime`).
    pub closed: [u64; lifetime::BUCKETS],
    /// Outbound connections that reached ESTABLISHED, by how long their
    /// handshake took (`handshake`); those whose SYN observer saw.
    pub handshakes: [u64; handshake::BUCKETS],
    /// Handshake packets sent again, counted when the handshake ended
    /// (established, or failed): SYNs of outbound connections, SYN-ACKs of
    /// a listener's (`tcp_sock.total_retrans` then, which the kernel
    /// raises with TcpExtTCPSynRetrans).
    pub handshake_retransmits: u64,
    /// Connections established before observer started that left
    /// ESTABLISHED: their start is counted by userspace from the socket
    /// iterator at start (`OpenConnection::OLDER`), their lifetime unknown,
    /// so they end here rather than in `closed`.
    pub closed_older: u64,
    /// Of the ends in `closed` and `closed_older`, those the far end began
    /// (its FIN came first: ESTABLISHED -> CLOSE_WAIT). A server that
    /// closes every new connection at once past a limit shows as
    /// connections closed by the peer within milliseconds.
    pub closed_by_peer: u64,
}

/// A connection being followed (key: `struct sock *`): the key its counts
/// go to, and since when (bpf_ktime_get_ns): its SYN, while `handshaking`
/// (an outbound connection from SYN_SENT on), else its ESTABLISHED.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenConnection {
    pub key: ConnectionKey,
    pub since: u64,
    /// `HANDSHAKING`, `OLDER`, or 0 (established while observer ran).
    pub handshaking: u32,
    pub _pad: u32,
}

impl OpenConnection {
    /// From SYN_SENT to ESTABLISHED: the handshake's time runs.
    pub const HANDSHAKING: u32 = 1;
    /// Established before observer started, entered by userspace from the
    /// start-up socket iterator (`IteratedSocket`): its end counts in
    /// `ConnectionCounts::closed_older`, its lifetime unknown.
    pub const OLDER: u32 = 2;
}

/// A connection's end that found its interval's `CONNECTIONS` map full
/// (`QUEUED_ENDS`): queued for userspace, which counts it in the round
/// that reads it, so the connection does not stay open for ever.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueuedEnd {
    pub key: ConnectionKey,
    /// Its lifetime's bucket (`lifetime`), or `QueuedEnd::OLDER`.
    pub bucket: u32,
    /// 1 if the far end closed first (`ConnectionCounts::closed_by_peer`).
    pub by_peer: u32,
}

impl QueuedEnd {
    /// Established before observer started: no lifetime (`closed_older`).
    pub const OLDER: u32 = u32::MAX;
}

/// One full TCP socket (any state but the timewait and request
/// minisockets) as the start-up iterator (`iter/tcp`, run in each network
/// namespace) saw it: the listeners, to tell inbound connections from
/// outbound; the established connections that the programs did not follow
/// (no `OPEN_CONNECTIONS` entry: older than observer); and every socket a
/// process may hold, whose owner `SOCK_OWNERS` needs for its TIME_WAIT.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IteratedSocket {
    /// The `struct sock *`, the key of `OPEN_CONNECTIONS`.
    pub sk: u64,
    /// The socket's inode (as /proc/PID/fd shows it); 0 for a listener's
    /// child no accept() took yet.
    pub inode: u64,
    /// The socket's cgroup (`sock_cgroup_id`).
    pub cgroup_id: u64,
    /// The far end (IPv4 in the first 4 bytes); 0 for a listener.
    pub remote_addr: [u8; 16],
    pub family: u16,
    pub local_port: u16,
    pub remote_port: u16,
    /// Its `tcp_state`.
    pub state: u16,
    /// 1: established and followed by the programs (an `OPEN_CONNECTIONS`
    /// entry of theirs): not older than observer.
    pub followed: u16,
    pub _pad: [u16; 3],
}

/// Which fallbacks the loader chose; written by userspace into the `CONFIG`
/// array before the shared tracepoint programs are attached.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Which of the two buffers of counter maps the programs count into
    /// now (0 or 1); userspace reads and empties the other (see `buffers`).
    pub buffer: u32,
    /// 1: no overflow hook attached; the sweep reads the listeners' drop
    /// counters, and `sock_state` queues a closing listener's last one.
    pub listen_drops_from_sweep: u32,
    /// 1: no program on `tcp_syn_flood_action` (a kernel that inlined it):
    /// the overflow program at `tcp_conn_request` counts SYNs meeting a
    /// full SYN queue, repeating the kernel's test.
    pub syn_queue_from_conn_request: u32,
    /// 1: this kernel's SYN queue is full when it holds `backlog` requests
    /// (`inet_csk_reqsk_queue_is_full` with `>=`, before the 2024 fix);
    /// 0: above `backlog` (`>`). Userspace asks the kernel which.
    pub syn_queue_full_at_backlog: u32,
}

/// One event queued for `observer trace` (`TRACE_EVENTS`, a ring buffer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// One of the `trace_event` bits.
    pub kind: u32,
    /// Connect errors: the errno; listener drops: the reason
    /// (`listener_drop::*`); 0 otherwise.
    pub detail: u32,
    /// When, in CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns).
    pub time_ns: u64,
    /// Who: the caller (connects, accepts, connect errors), the socket's
    /// owner (TIME_WAIT) or the listener's (listener drops).
    pub actor: Actor,
    /// The far end (IPv4 in the first 4 bytes): the destination of a
    /// connect, the client of an accepted connection, the peer of a
    /// socket entering TIME_WAIT; zero for a listener drop.
    pub daddr: [u8; 16],
    pub family: u16,
    /// The far end's port, host order.
    pub dport: u16,
    /// The local port, host order (the listener's for a listener drop; 0
    /// where none is known, e.g. a connect that failed before binding).
    pub lport: u16,
    pub _pad: u16,
}

/// `TraceEvent::kind` and the eBPF object's `TRACE_KINDS` global: one bit
/// per kind.
pub mod trace_event {
    /// A connect() that failed: the errno the caller saw, or the outcome
    /// of a non-blocking connect when its socket left SYN_SENT.
    pub const CONNECT_ERROR: u32 = 1;
    /// A socket entered TIME_WAIT (its local port held for 60 s).
    pub const TIME_WAIT: u32 = 1 << 1;
    /// A listener turned a connection away: accept queue full, or SYN
    /// queue full (cookie or drop).
    pub const LISTENER_DROP: u32 = 1 << 2;
    /// A connect() sent its SYN.
    pub const CONNECT: u32 = 1 << 3;
    /// accept() handed a connection to its process.
    pub const ACCEPT: u32 = 1 << 4;
}

/// The counter maps come in two buffers, so they hold recent activity, not
/// every key ever seen: the programs count into the buffer `Config::buffer`
/// names; each round userspace switches it, waits until no program can
/// still be counting into the old one (an RCU grace period: every program
/// runs inside an RCU read-side section), then reads the old one whole and
/// empties it. Each count is read exactly once, and a map holds only the
/// keys of one interval. Within an interval, one process may create at
/// most `KEYS_PER_PROCESS` keys in a map; beyond, its counts go to a
/// coarser key (connect errors: the destination folded, `FOLDED_DADDR`;
/// process counters: the name left out), so its totals stay exact and no
/// process can fill a map for the others.
pub mod buffers {
    pub const COUNT: u32 = 2;
    /// A sixteenth of each map (16,384 entries by default).
    pub const KEYS_PER_PROCESS: u64 = 1024;
    /// The destination of a connect-error key whose process met more than
    /// `KEYS_PER_PROCESS` destinations in one interval: no IPv4 key has
    /// bytes 4..16 set, no IPv6 connect goes to ffff:...:ffff.
    pub const FOLDED_DADDR: [u8; 16] = [0xff; 16];
}

/// Keys one process created in a buffer's counter maps (key: tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeysCreated {
    pub proc_counters: u64,
    pub connect_errors: u64,
    pub connections: u64,
}

/// Bits of `Actor::owner_flags` in a `SOCK_OWNERS` value.
pub mod owner_flags {
    /// The socket sent the first FIN (it entered FIN_WAIT1, in its
    /// closing process's context): its CLOSE is a TIME_WAIT entry unless
    /// an error ended it (see time_wait.rs in the eBPF crate).
    pub const CLOSED_FIRST: u32 = 1;
}

/// Indexes of the `LOST` per-CPU array: updates the kernel side could not
/// make (a full map). Userspace exports them; they should stay 0.
pub mod lost {
    pub const PROC_COUNTERS_FULL: u32 = 0;
    pub const CONNECT_ERRORS_FULL: u32 = 1;
    pub const INFLIGHT_FULL: u32 = 2;
    pub const TIME_WAIT_BY_NETNS_FULL: u32 = 3;
    pub const LISTEN_OVERFLOWS_FULL: u32 = 4;
    pub const CLOSED_LISTENERS_FULL: u32 = 5;
    /// A connection reached ESTABLISHED with `OPEN_CONNECTIONS` full: it is
    /// not followed (neither its opening nor its end counts).
    pub const OPEN_CONNECTIONS_FULL: u32 = 6;
    /// A connection count with the buffer's `CONNECTIONS` map full (an
    /// end, only if `QUEUED_ENDS` was full too).
    pub const CONNECTIONS_FULL: u32 = 7;
    /// A connection's end found both `CONNECTIONS` and `QUEUED_ENDS` full:
    /// that connection stays counted open.
    pub const QUEUED_ENDS_FULL: u32 = 8;
    pub const SLOTS: u32 = 9;
}

/// The LRU maps (entries the kernel evicts to make room when full) and the
/// indexes of the `LRU_CHURN` per-CPU array, which counts per map the
/// entries the programs created and removed. An LRU map evicts silently,
/// so userspace derives evictions: created - removed - entries now.
pub mod lru {
    pub const SOCK_OWNERS: u32 = 0;
    pub const LISTENERS: u32 = 1;
    pub const INFLIGHT_CONNECTS: u32 = 2;
    pub const THREAD_CONNECTS: u32 = 3;
    pub const MAPS: u32 = 4;
    /// Slot of `map`'s count of created entries.
    pub const fn created(map: u32) -> u32 {
        map * 2
    }
    /// Slot of `map`'s count of removed entries.
    pub const fn removed(map: u32) -> u32 {
        map * 2 + 1
    }
    pub const SLOTS: u32 = MAPS * 2;
}

/// Map capacities, shared so userspace can report how full each map is.
/// `SOCK_OWNERS` is the default; `observer run --max-sockets` sets it.
pub mod capacity {
    pub const PROC_COUNTERS: u32 = 16_384;
    pub const CONNECT_ERRORS: u32 = 16_384;
    pub const SOCK_OWNERS: u32 = 65_536;
    pub const LISTENERS: u32 = 16_384;
    pub const INFLIGHT_CONNECTS: u32 = 16_384;
    pub const THREAD_CONNECTS: u32 = 16_384;
    pub const EXITED: u32 = 16_384;
    /// Network namespaces whose TIME_WAIT entries are counted apart (to
    /// check against the kernel's own count); gone ones are removed.
    pub const TIME_WAIT_BY_NETNS: u32 = 4_096;
    /// Listeners with overflows (or a full SYN queue, a key per reason)
    /// in one interval (a buffer of its own).
    pub const LISTEN_OVERFLOWS: u32 = 16_384;
    /// Listeners closed within one interval, in the sweep's mode.
    pub const CLOSED_LISTENERS: u32 = 4_096;
    /// Connection counts per key (owner, direction, far end) within one
    /// interval: fewer than the other counter maps, as each value is 336
    /// bytes (a process's share, `KEYS_PER_PROCESS`, is an eighth).
    pub const CONNECTIONS: u32 = 8_192;
    /// Established connections followed at once: the default; `observer
    /// run --max-sockets` sets it with `SOCK_OWNERS`.
    pub const OPEN_CONNECTIONS: u32 = 65_536;
    /// Connection ends queued within one interval because `CONNECTIONS`
    /// was full (72 bytes each).
    pub const QUEUED_ENDS: u32 = 16_384;
}

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Actor>() == 32);
    assert!(size_of::<ProcKey>() == 40);
    assert!(size_of::<ProcCounters>() == 24);
    assert!(size_of::<ConnectErrorKey>() == 56);
    assert!(size_of::<ListenerKey>() == 8);
    assert!(size_of::<ListenerDropKey>() == 48);
    assert!(size_of::<ClosedListener>() == 56);
    assert!(size_of::<InflightConnect>() == 56);
    assert!(size_of::<ThreadConnect>() == 88);
    assert!(size_of::<Config>() == 16);
    assert!(size_of::<TraceEvent>() == 72);
    assert!(size_of::<KeysCreated>() == 24);
    assert!(size_of::<ConnectionKey>() == 64);
    assert!(size_of::<ConnectionCounts>() == 336);
    assert!(size_of::<IteratedSocket>() == 56);
    assert!(size_of::<QueuedEnd>() == 72);
    assert!(size_of::<OpenConnection>() == 80);
};
