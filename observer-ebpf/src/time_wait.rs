//! TIME_WAIT entries. Counted in softirq as often as in process context, so
//! the socket's owner comes from `SOCK_OWNERS` (filled in process context at
//! connect/accept/listen).
//!
//! Counted by a pair of programs: the kernel does not run a program that
//! fires while the same program is already running on that CPU (a softirq
//! interrupting a process-context run; it counts these in
//! `recursion_misses`). Under a connection storm that lost ~1 in 10^4
//! entries. So each way of counting has two programs on the same hook, and
//! both see every event unless one of them was nested into; interrupts nest
//! one level per CPU, so at least one runs. The first to run counts and
//! notes the socket in a per-CPU list (`TIME_WAIT_RECENT`), the second
//! finds the note and takes it off (`count_once_per_pair`). Which of the
//! two runs first does not matter for the count (an fentry trampoline runs
//! the newest program first on some kernels, tracepoints the oldest), but
//! `sock_state`, which forgets the socket's owner at CLOSE, must run second:
//! a note left behind by a skipped twin makes the next socket at that
//! address count on the twin that runs second, which must still find the
//! owner. So `time_wait_twin` is attached before `sock_state`, and the
//! kprobe fires before tcp_done() reaches the tracepoint.
//! The twin of the kprobe is `sock_state` (tp_btf): kprobes share one
//! busy flag, which a second kprobe would trip over just the same. The two
//! see the same events: every tcp_time_wait() call ends in tcp_done(), the
//! FIN_WAIT2/CLOSING -> CLOSE change `sock_state` counts, on the same CPU.
use aya_ebpf::{
    macros::{btf_tracepoint, fentry, kprobe},
    programs::{BtfTracePointContext, FEntryContext, ProbeContext},
};
use observer_common::{RecentlyCounted, tcp_state::*, trace_event};

use crate::{
    counters::{ProcCounter, bump_netns_time_wait, bump_proc},
    kernel::{IPPROTO_TCP, ProbedSock, Sock, TypedSock, sock_err, sock_family, sock_netns, sock_owner, sock_protocol},
    maps::TIME_WAIT_RECENT,
    trace,
};

/// void tcp_time_wait(struct sock *sk, int state, int timeo): the socket is
/// handed to a timewait socket (substate TIME_WAIT or FIN_WAIT2).
#[fentry(function = "tcp_time_wait")]
pub fn tcp_time_wait_fentry(ctx: FEntryContext) -> u32 {
    count_once_per_pair(TypedSock(ctx.arg(0)));
    0
}

/// The other program of the pair (see the module comment).
#[fentry(function = "tcp_time_wait")]
pub fn tcp_time_wait_fentry_twin(ctx: FEntryContext) -> u32 {
    count_once_per_pair(TypedSock(ctx.arg(0)));
    0
}

/// Same as `tcp_time_wait_fentry`, for kernels where fentry is unavailable.
/// Its twin is `sock_state` (tp_btf): kprobes share one per-CPU busy flag
/// with the tracepoint programs, so a second kprobe would be skipped
/// together with this one, while a tp_btf program is not.
#[kprobe]
pub fn tcp_time_wait_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(sk) = ctx.arg::<u64>(0) {
        count_once_per_pair(ProbedSock(sk));
    }
    0
}

/// Fallback where neither fentry nor kprobes exist, on inet_sock_set_state
/// (TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)):
/// `sock_state` is one program of the pair (see `is_time_wait_entry`), this
/// one, attached before it, the other.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn time_wait_twin(ctx: BtfTracePointContext) -> i32 {
    let old: i32 = ctx.arg(1);
    let new: i32 = ctx.arg(2);
    if new != CLOSE || (old != FIN_WAIT2 && old != CLOSING) {
        return 0;
    }
    let sk = TypedSock(ctx.arg(0));
    if is_time_wait_entry(sk, old, new) {
        count_once_per_pair(sk);
    }
    0
}

/// A socket handed to TIME_WAIT goes FIN_WAIT2/CLOSING -> CLOSE with no
/// error (a reset sets `sk_err` and leaves no timewait socket).
#[inline(always)]
pub fn is_time_wait_entry(sk: impl Sock, old: i32, new: i32) -> bool {
    new == CLOSE && (old == FIN_WAIT2 || old == CLOSING) && sock_protocol(sk) == IPPROTO_TCP && sock_err(sk) == 0
}

/// Count the entry unless the other program of the pair already did for
/// this event; each program of the pair calls this once per event.
///
/// A note is left behind only when the other program's run was skipped;
/// the next event of a socket at that address then finds it and is still
/// counted exactly once (by the second program of that pair).
#[inline(always)]
pub fn count_once_per_pair(sk: impl Sock) {
    let Some(recent) = TIME_WAIT_RECENT.get_ptr_mut(0) else {
        return count_time_wait(sk);
    };
    // SAFETY: this CPU's copy. Only an interrupt can run in between, and
    // it runs a program of the pair only if that one is not running here.
    let recent = unsafe { &mut *recent };
    for slot in recent.socks.iter_mut() {
        if *slot == sk.addr() {
            *slot = 0;
            return;
        }
    }
    count_time_wait(sk);
    // A free slot first: a note still waiting for its pair (an interrupted
    // run) must not be overwritten by the events of the interrupt.
    match recent.socks.iter_mut().find(|slot| **slot == 0) {
        Some(slot) => *slot = sk.addr(),
        None => {
            recent.socks[(recent.next as usize) % RecentlyCounted::SLOTS] = sk.addr();
            recent.next = recent.next.wrapping_add(1);
        }
    }
}

/// Charge one TIME_WAIT entry to the socket's owner (`sock_owner`).
#[inline(always)]
pub fn count_time_wait(sk: impl Sock) {
    let owner = sock_owner(sk);
    bump_proc(&owner, sock_family(sk), ProcCounter::TimeWaitEntries);
    bump_netns_time_wait(sock_netns(sk));
    trace::socket_event(trace_event::TIME_WAIT, 0, &owner, sk);
}
