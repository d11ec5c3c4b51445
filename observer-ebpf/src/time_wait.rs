//! TIME_WAIT entries, preferred hooks. The fallback lives in `state.rs`.
//! Counted in softirq, so the socket's owner comes from `SOCK_OWNERS`.
use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};
use observer_common::Actor;

use crate::{
    counters::{bump_proc, ProcCounter},
    kernel::sock_family,
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
