//! TIME_WAIT entries. Counted in softirq, so the socket's owner comes from
//! `SOCK_OWNERS` (filled in process context at connect/accept/listen).
use aya_ebpf::{
    macros::{btf_tracepoint, fentry, kprobe},
    programs::{BtfTracePointContext, FEntryContext, ProbeContext},
};
use observer_common::{Actor, tcp_state::*};

use crate::{
    counters::{ProcCounter, bump_proc},
    kernel::{IPPROTO_TCP, sock_err, sock_family, sock_protocol},
    maps::SOCK_OWNERS,
};

/// void tcp_time_wait(struct sock *sk, int state, int timeo): the socket is
/// handed to a timewait socket (substate TIME_WAIT or FIN_WAIT2).
#[fentry(function = "tcp_time_wait")]
pub fn tcp_time_wait_fentry(ctx: FEntryContext) -> u32 {
    count_time_wait(ctx.arg(0));
    0
}

/// Same as `tcp_time_wait_fentry`, for kernels where fentry is unavailable.
#[kprobe]
pub fn tcp_time_wait_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(sk) = ctx.arg::<u64>(0) {
        count_time_wait(sk);
    }
    0
}

/// Charge one TIME_WAIT entry to the socket's owner; a socket opened before
/// observer started has no known owner and is charged to tgid 0.
#[inline(always)]
pub fn count_time_wait(sk: u64) {
    let owner = unsafe { SOCK_OWNERS.get(&sk) }.copied().unwrap_or(Actor::default());
    bump_proc(&owner, sock_family(sk), ProcCounter::TimeWaitEntries);
}

/// Fallback where neither fentry nor kprobes exist: on inet_sock_set_state
/// (TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)),
/// a socket handed to TIME_WAIT goes FIN_WAIT2/CLOSING -> CLOSE with no
/// error (a reset sets `sk_err` and leaves no timewait socket).
///
/// Its own program, not a branch of `sock_state`: the kernel skips a
/// tracing program that fires while the same program is already running on
/// that CPU (a softirq interrupting it), and these transitions happen in
/// softirq. Sharing `sock_state`, which also runs in process context,
/// lost about 1 in 1000 entries at full speed; alone, and attached before
/// `sock_state` (so it reads the owner before `sock_state` forgets it), it
/// runs only briefly and in softirq.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn time_wait_state(ctx: BtfTracePointContext) -> i32 {
    let old: i32 = ctx.arg(1);
    let new: i32 = ctx.arg(2);
    if new != CLOSE || (old != FIN_WAIT2 && old != CLOSING) {
        return 0;
    }
    let sk: u64 = ctx.arg(0);
    if sock_protocol(sk) == IPPROTO_TCP && sock_err(sk) == 0 {
        count_time_wait(sk);
    }
    0
}
