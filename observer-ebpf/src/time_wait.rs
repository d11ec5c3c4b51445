//! TIME_WAIT entries. Counted in softirq as often as in process context, so
//! the socket's owner comes from `SOCK_OWNERS` (filled in process context at
//! connect/accept/listen).
//!
//! Primary and backup: the kernel does not run a program that fires while
//! the same program is already running on that CPU (a softirq interrupting
//! a process-context run; it counts these in `recursion_misses`). Under a
//! connection storm that lost ~1 in 10^4 entries. So each way of counting
//! has a second, identical program attached right after the primary: both
//! see every event, in order, unless one was nested into. The primary
//! counts and notes the socket in a per-CPU list (`TIME_WAIT_RECENT`); the
//! backup counts only a socket that is not there (the primary never saw it)
//! and otherwise takes it off. Nesting into the backup instead leaves the
//! primary to count; one level of nesting per CPU is all interrupts allow.
//! Kprobes need no backup: they share one busy flag, which a backup would
//! trip over just the same.
use aya_ebpf::{
    macros::{btf_tracepoint, fentry, kprobe},
    programs::{BtfTracePointContext, FEntryContext, ProbeContext},
};
use observer_common::{Actor, RecentlyCounted, tcp_state::*};

use crate::{
    counters::{ProcCounter, bump_proc},
    kernel::{IPPROTO_TCP, sock_err, sock_family, sock_protocol},
    maps::{SOCK_OWNERS, TIME_WAIT_RECENT},
};

/// void tcp_time_wait(struct sock *sk, int state, int timeo): the socket is
/// handed to a timewait socket (substate TIME_WAIT or FIN_WAIT2).
#[fentry(function = "tcp_time_wait")]
pub fn tcp_time_wait_fentry(ctx: FEntryContext) -> u32 {
    count_as_primary(ctx.arg(0));
    0
}

/// Attached after `tcp_time_wait_fentry`; counts what it missed.
#[fentry(function = "tcp_time_wait")]
pub fn tcp_time_wait_fentry_backup(ctx: FEntryContext) -> u32 {
    count_as_backup(ctx.arg(0));
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

/// Fallback where neither fentry nor kprobes exist, on inet_sock_set_state
/// (TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)):
/// `sock_state` is the primary (see `is_time_wait_entry`); this program,
/// attached after it, is its backup.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn time_wait_backup(ctx: BtfTracePointContext) -> i32 {
    let old: i32 = ctx.arg(1);
    let new: i32 = ctx.arg(2);
    if new != CLOSE || (old != FIN_WAIT2 && old != CLOSING) {
        return 0;
    }
    let sk: u64 = ctx.arg(0);
    if is_time_wait_entry(sk, old, new) {
        count_as_backup(sk);
    }
    0
}

/// A socket handed to TIME_WAIT goes FIN_WAIT2/CLOSING -> CLOSE with no
/// error (a reset sets `sk_err` and leaves no timewait socket).
#[inline(always)]
pub fn is_time_wait_entry(sk: u64, old: i32, new: i32) -> bool {
    new == CLOSE && (old == FIN_WAIT2 || old == CLOSING) && sock_protocol(sk) == IPPROTO_TCP && sock_err(sk) == 0
}

/// Count, and note the socket for the backup program.
#[inline(always)]
pub fn count_as_primary(sk: u64) {
    count_time_wait(sk);
    if let Some(recent) = TIME_WAIT_RECENT.get_ptr_mut(0) {
        // SAFETY: this CPU's copy; only interrupts can interleave, and they
        // never run this program (the kernel skips a nested run).
        let recent = unsafe { &mut *recent };
        recent.socks[(recent.next as usize) % RecentlyCounted::SLOTS] = sk;
        recent.next = recent.next.wrapping_add(1);
    }
}

/// Count unless the primary did; forget the socket either way.
#[inline(always)]
pub fn count_as_backup(sk: u64) {
    if let Some(recent) = TIME_WAIT_RECENT.get_ptr_mut(0) {
        // SAFETY: as above.
        let recent = unsafe { &mut *recent };
        for slot in recent.socks.iter_mut() {
            if *slot == sk {
                *slot = 0;
                return;
            }
        }
    }
    count_time_wait(sk);
}

/// Charge one TIME_WAIT entry to the socket's owner; a socket opened before
/// observer started has no known owner and is charged to tgid 0.
#[inline(always)]
pub fn count_time_wait(sk: u64) {
    let owner = unsafe { SOCK_OWNERS.get(&sk) }.copied().unwrap_or(Actor::default());
    bump_proc(&owner, sock_family(sk), ProcCounter::TimeWaitEntries);
}
