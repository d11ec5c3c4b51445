//! The names of the eBPF object's maps and programs, as userspace (the
//! loader, the collector, `cargo xtask bench`) refers to them. The eBPF
//! side declares them as its statics' and functions' identifiers, which a
//! macro attribute cannot take from a constant; a name that drifts fails
//! at load (`take_maps`, the hook table), in every kernel test.

/// Maps, by the name of their `static` in observer-ebpf's `maps.rs`.
pub mod maps {
    pub const CONFIG: &str = "CONFIG";
    /// The counter maps: two buffers each (see `buffers`), exported under
    /// these names.
    pub const PROC_COUNTERS: &str = "PROC_COUNTERS";
    pub const CONNECT_ERRORS: &str = "CONNECT_ERRORS";
    /// Buffer by buffer.
    pub const PROC_COUNTERS_BUFFERS: [&str; 2] = ["PROC_COUNTERS_0", "PROC_COUNTERS_1"];
    pub const CONNECT_ERRORS_BUFFERS: [&str; 2] = ["CONNECT_ERRORS_0", "CONNECT_ERRORS_1"];
    pub const KEYS_CREATED_BUFFERS: [&str; 2] = ["KEYS_CREATED_0", "KEYS_CREATED_1"];
    pub const LISTEN_OVERFLOWS: &str = "LISTEN_OVERFLOWS";
    pub const LISTEN_OVERFLOWS_BUFFERS: [&str; 2] = ["LISTEN_OVERFLOWS_0", "LISTEN_OVERFLOWS_1"];
    pub const CLOSED_LISTENERS: &str = "CLOSED_LISTENERS";
    pub const CONNECTIONS: &str = "CONNECTIONS";
    pub const CONNECTIONS_BUFFERS: [&str; 2] = ["CONNECTIONS_0", "CONNECTIONS_1"];
    pub const OPEN_CONNECTIONS: &str = "OPEN_CONNECTIONS";
    pub const QUEUED_ENDS: &str = "QUEUED_ENDS";
    pub const SOCK_OWNERS: &str = "SOCK_OWNERS";
    pub const LISTENERS: &str = "LISTENERS";
    pub const INFLIGHT_CONNECTS: &str = "INFLIGHT_CONNECTS";
    pub const THREAD_CONNECTS: &str = "THREAD_CONNECTS";
    pub const EXITED: &str = "EXITED";
    pub const LOST: &str = "LOST";
    pub const LRU_CHURN: &str = "LRU_CHURN";
    pub const TIME_WAIT_BY_NETNS: &str = "TIME_WAIT_BY_NETNS";
    /// `observer trace`'s ring buffer, and its count of events it had no
    /// room for.
    pub const TRACE_EVENTS: &str = "TRACE_EVENTS";
    pub const TRACE_DROPPED: &str = "TRACE_DROPPED";
    /// The global with the kernel's struct offsets (not a map of ours,
    /// but set by name the same way).
    pub const OFFSETS: &str = "OFFSETS";
    /// The global with the events `observer trace` asked for
    /// (`trace_event` bits; 0 in the daemon's copy).
    pub const TRACE_KINDS: &str = "TRACE_KINDS";
}

/// Programs, by the name of their function in observer-ebpf.
pub mod programs {
    pub const CONNECT_CALL_FENTRY: &str = "connect_call_fentry";
    pub const CONNECT_CALL_FEXIT: &str = "connect_call_fexit";
    pub const CONNECT_CALL_KPROBE: &str = "connect_call_kprobe";
    pub const CONNECT_CALL_KRETPROBE: &str = "connect_call_kretprobe";
    pub const CONNECT_ENTER: &str = "connect_enter";
    pub const CONNECT_EXIT: &str = "connect_exit";
    pub const INET_CSK_ACCEPT_FEXIT: &str = "inet_csk_accept_fexit";
    pub const INET_CSK_ACCEPT_FEXIT_4: &str = "inet_csk_accept_fexit_4";
    pub const INET_CSK_ACCEPT_KRETPROBE: &str = "inet_csk_accept_kretprobe";
    pub const ACCEPT4_EXIT: &str = "accept4_exit";
    pub const ACCEPT_EXIT: &str = "accept_exit";
    pub const TIME_WAIT_MISSED: &str = "time_wait_missed";
    pub const SOCK_STATE: &str = "sock_state";
    pub const PROCESS_EXIT: &str = "process_exit";
    pub const OVERFLOW_SYN_FENTRY: &str = "overflow_syn_fentry";
    pub const OVERFLOW_ACK_V4_FENTRY: &str = "overflow_ack_v4_fentry";
    pub const OVERFLOW_ACK_V6_FENTRY: &str = "overflow_ack_v6_fentry";
    pub const OVERFLOW_SYN_KPROBE: &str = "overflow_syn_kprobe";
    pub const OVERFLOW_ACK_V4_KPROBE: &str = "overflow_ack_v4_kprobe";
    pub const OVERFLOW_ACK_V6_KPROBE: &str = "overflow_ack_v6_kprobe";
    pub const SYN_QUEUE_FULL_FENTRY: &str = "syn_queue_full_fentry";
    pub const SYN_QUEUE_FULL_KPROBE: &str = "syn_queue_full_kprobe";
    /// The start-up socket iterator (`iter/tcp`, run in each namespace at
    /// start; not in `ALL`, which are the hooks' programs).
    pub const OLDER_CONNECTIONS: &str = "older_connections";

    /// Every program of the object.
    pub const ALL: &[&str] = &[
        CONNECT_CALL_FENTRY,
        CONNECT_CALL_FEXIT,
        CONNECT_CALL_KPROBE,
        CONNECT_CALL_KRETPROBE,
        CONNECT_ENTER,
        CONNECT_EXIT,
        INET_CSK_ACCEPT_FEXIT,
        INET_CSK_ACCEPT_FEXIT_4,
        INET_CSK_ACCEPT_KRETPROBE,
        ACCEPT4_EXIT,
        ACCEPT_EXIT,
        TIME_WAIT_MISSED,
        SOCK_STATE,
        PROCESS_EXIT,
        OVERFLOW_SYN_FENTRY,
        OVERFLOW_ACK_V4_FENTRY,
        OVERFLOW_ACK_V6_FENTRY,
        OVERFLOW_SYN_KPROBE,
        OVERFLOW_ACK_V4_KPROBE,
        OVERFLOW_ACK_V6_KPROBE,
        SYN_QUEUE_FULL_FENTRY,
        SYN_QUEUE_FULL_KPROBE,
    ];
}
