//! TIME_WAIT entries, in every attach mode: a socket handed on to a
//! timewait socket goes FIN_WAIT2/CLOSING -> CLOSE without error, a state
//! change `sock_state` (state.rs) sees. Charged to the process that closed
//! the connection first: its close() or shutdown() sent the first FIN
//! (-> FIN_WAIT1, in its context), which is what puts a socket in
//! TIME_WAIT, whichever process opened it. The entry itself comes in
//! softirq as often as in process context, so that closer is noted in
//! `SOCK_OWNERS` at the first FIN (`closed_first`): one LRU insert per
//! connection, where noting the owner at connect and at accept took two.
//!
//! The runs the kernel skips: it does not run a program that fires while
//! the same program is already running on that CPU (a softirq interrupting
//! a process-context run of `sock_state`; counted in its recursion misses):
//! hundreds in 100,000 connections at full speed on Linux 6.18. Those are
//! counted by `time_wait_missed`, on `tcp_destroy_sock`, which fires after
//! that CLOSE (in the same call for a socket its process closed, else at
//! its last close()): 2 runs per connection, where a twin of `sock_state`
//! on every state change cost 10 (BENCHMARKS.md). It knows
//! - that `sock_state` missed the socket's CLOSE: that run takes the
//!   socket's `SOCK_OWNERS` entry out, so an entry still there at destroy
//!   is one whose CLOSE it did not see;
//! - that the CLOSE was a TIME_WAIT entry: the socket sent the first FIN
//!   (`owner_flags::CLOSED_FIRST`, set at FIN_WAIT1, in the closing
//!   process's context: never a nested run, so never skipped) and no error
//!   ended it. Missed aborts after the first FIN without an error
//!   (TCP_LINGER2 < 0, a full timewait table) would count as entries:
//!   `sock_state` counts those alike.
//!
//! The two cannot both miss one socket by such a skip: a run is skipped
//! only while the same program runs on that CPU in the context it
//! interrupted, which runs one program at a time. Both do miss a block of
//! sockets while another tool attaches or detaches programs on these
//! tracepoints, with no skip counted: the namespace check counts those
//! as unseen (collect/unseen.rs).
use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use observer_common::{Actor, lru, owner_flags, tcp_state::*, trace_event};

use crate::{
    counters::{ProcCounter, bump_netns_time_wait, bump_proc, lru_insert, lru_remove},
    kernel::{
        IPPROTO_TCP, Sock, TypedSock, current_actor, sock_err, sock_family, sock_netns, sock_protocol, unknown_owner,
    },
    maps::SOCK_OWNERS,
    trace,
};

/// TP_PROTO(struct sock *sk): the socket is freed (it is in CLOSE). See
/// the module comment.
#[btf_tracepoint(function = "tcp_destroy_sock")]
pub fn time_wait_missed(ctx: BtfTracePointContext) -> i32 {
    let sk = TypedSock(ctx.arg(0));
    if let Some(owner) = take_owner(sk)
        && owner.owner_flags & owner_flags::CLOSED_FIRST != 0
        && sock_protocol(sk) == IPPROTO_TCP
        && sock_err(sk) == 0
    {
        count_time_wait(sk, Some(owner));
    }
    0
}

/// A socket handed to TIME_WAIT goes FIN_WAIT2/CLOSING -> CLOSE with no
/// error (a reset sets `sk_err` and leaves no timewait socket).
#[inline(always)]
pub fn is_time_wait_entry(sk: impl Sock, old: i32, new: i32) -> bool {
    new == CLOSE && (old == FIN_WAIT2 || old == CLOSING) && sock_protocol(sk) == IPPROTO_TCP && sock_err(sk) == 0
}

/// The socket sends the first FIN (-> FIN_WAIT1, in the context of the
/// process closing it): enter that process as its owner, marked (over an
/// entry an earlier socket at this address left, if any).
#[inline(always)]
pub fn closed_first(sk: impl Sock) {
    let closer = Actor { owner_flags: owner_flags::CLOSED_FIRST, ..current_actor() };
    let _ = lru_insert(&SOCK_OWNERS, lru::SOCK_OWNERS, &sk.addr(), &closer);
}

/// Take the socket's owner entry out (its CLOSE; flags kept), if any.
#[inline(always)]
pub fn take_owner(sk: impl Sock) -> Option<Actor> {
    // SAFETY: copied out before the entry is removed.
    let owner = *unsafe { SOCK_OWNERS.get(&sk.addr()) }?;
    lru_remove(&SOCK_OWNERS, lru::SOCK_OWNERS, &sk.addr());
    Some(owner)
}

/// Charge one TIME_WAIT entry to the socket's `owner` (as taken out at
/// its CLOSE; none recorded: tgid 0 in the socket's cgroup).
#[inline(always)]
pub fn count_time_wait(sk: impl Sock, owner: Option<Actor>) {
    let owner = match owner {
        Some(owner) => Actor { owner_flags: 0, ..owner },
        None => unknown_owner(sk),
    };
    bump_proc(&owner, sock_family(sk), ProcCounter::TimeWaitEntries);
    bump_netns_time_wait(sock_netns(sk));
    trace::socket_event(trace_event::TIME_WAIT, 0, &owner, sk);
}
