//! connect(): attempts and failures by errno and destination.
//!
//! Errors are taken from the syscall tracepoints in every attach mode: the
//! errno connect() returned is the ground truth the caller saw, and the
//! tracepoints exist on every kernel. An in-flight entry per socket joins the
//! synchronous error (connect()'s return) and the asynchronous one (`sk_err`
//! when the socket leaves SYN_SENT, see `state.rs`) so each failure is
//! counted exactly once, whether the connect() was blocking or not.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::{fentry, kprobe, tracepoint},
    programs::{FEntryContext, ProbeContext, TracePointContext},
};
use observer_common::{AF_INET, AF_INET6, ConnectErrorKey, InflightConnect, lost, lru};

use crate::{
    counters::{ProcCounter, bump_connect_error, bump_proc, count_lost, lru_insert, lru_remove},
    kernel::{current_actor, is_tcp, sock_family, sock_of_fd},
    maps::{INFLIGHT_CONNECTS, SOCK_OWNERS, THREAD_CONNECTS, config},
};

const EADDRNOTAVAIL: i64 = 99;
const EINPROGRESS: i64 = 115;
const EALREADY: i64 = 114;
const EISCONN: i64 = 106;
const EINTR: i64 = 4;
/// ERESTARTSYS..ERESTART_RESTARTBLOCK: kernel-internal codes a signal left
/// in the syscall's return; userspace sees EINTR or a restart, the
/// connection itself goes on.
const ERESTART: core::ops::RangeInclusive<i64> = 512..=516;

// Offsets in the syscalls/sys_{enter,exit}_connect records (stable ABI:
// 8 bytes of common fields, the syscall number, then the 8-byte arguments).
const ENTER_FD: usize = 16;
const ENTER_USERVADDR: usize = 24;
const EXIT_RET: usize = 16;

/// syscalls/sys_enter_connect(int fd, struct sockaddr *uservaddr, int addrlen)
#[tracepoint]
pub fn connect_enter(ctx: TracePointContext) -> u32 {
    if try_connect_enter(&ctx).is_err() {
        // Not tracked (unix, UDP, unreadable arguments): forget any
        // previous connect of this thread, so this connect's exit can never
        // match a stale entry. A tracked connect overwrites the entry.
        lru_remove(&THREAD_CONNECTS, lru::THREAD_CONNECTS, &bpf_get_current_pid_tgid());
    }
    0
}

/// Err: this connect() is not one observer tracks.
fn try_connect_enter(ctx: &TracePointContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let fd: u64 = unsafe { ctx.read_at(ENTER_FD) }?;
    let uaddr: u64 = unsafe { ctx.read_at(ENTER_USERVADDR) }?;
    let family: u16 = unsafe { bpf_probe_read_user(uaddr as *const u16) }?;
    if family != AF_INET && family != AF_INET6 {
        return Err(0);
    }
    let sk = sock_of_fd(fd);
    if !is_tcp(sk) {
        return Err(0);
    }
    // struct sockaddr_in { u16 family; be16 port; be32 addr; }
    // struct sockaddr_in6 { u16 family; be16 port; u32 flowinfo; u8 addr[16]; }
    let dport = u16::from_be(unsafe { bpf_probe_read_user((uaddr + 2) as *const u16) }?);
    let mut daddr = [0u8; 16];
    if family == AF_INET6 {
        daddr = unsafe { bpf_probe_read_user((uaddr + 8) as *const [u8; 16]) }?;
    } else {
        let v4: [u8; 4] = unsafe { bpf_probe_read_user((uaddr + 4) as *const [u8; 4]) }?;
        daddr[..4].copy_from_slice(&v4);
    }
    let actor = current_actor();
    if config().connects_from_syscall == 1 {
        // Otherwise the tcp_connect hook records the owner.
        let _ = lru_insert(&SOCK_OWNERS, lru::SOCK_OWNERS, &sk, &actor);
    }
    match INFLIGHT_CONNECTS.get_ptr_mut(&sk) {
        // A non-blocking connect() asked again (EALREADY): keep the pending
        // entry and its async error, just mark the syscall as running.
        Some(entry) if unsafe { (*entry).actor.tgid == actor.tgid && (*entry).in_syscall == 0 } => unsafe {
            (*entry).in_syscall = 1
        },
        // None, or a stale entry of a freed socket whose address was reused.
        _ => {
            let entry = InflightConnect {
                actor,
                daddr,
                family,
                dport,
                in_syscall: 1,
                syn_sent: 0,
                resolved: 0,
                async_errno: 0,
                _pad: 0,
            };
            if lru_insert(&INFLIGHT_CONNECTS, lru::INFLIGHT_CONNECTS, &sk, &entry).is_err() {
                count_lost(lost::INFLIGHT_FULL);
            }
        }
    }
    let _ = lru_insert(&THREAD_CONNECTS, lru::THREAD_CONNECTS, &pid_tgid, &sk);
    Ok(())
}

/// syscalls/sys_exit_connect(long ret)
#[tracepoint]
pub fn connect_exit(ctx: TracePointContext) -> u32 {
    let _ = try_connect_exit(&ctx);
    0
}

fn try_connect_exit(ctx: &TracePointContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(&sk) = (unsafe { THREAD_CONNECTS.get(&pid_tgid) }) else {
        return Ok(());
    };
    lru_remove(&THREAD_CONNECTS, lru::THREAD_CONNECTS, &pid_tgid);
    let Some(entry) = INFLIGHT_CONNECTS.get_ptr_mut(&sk) else {
        return Ok(());
    };
    let ret: i64 = unsafe { ctx.read_at(EXIT_RET) }?;
    // SAFETY: the entry stays valid until removed below; only this thread's
    // syscall and the SYN_SENT exit of this socket touch it.
    let entry = unsafe { &mut *entry };

    if config().connects_from_syscall == 1 && entry.syn_sent == 1 && ret != -EADDRNOTAVAIL {
        // No tcp_connect hook: a socket that reached SYN_SENT sent its SYN,
        // except when no local port could be found (EADDRNOTAVAIL).
        bump_proc(&entry.actor, entry.family, ProcCounter::Connects);
    }
    entry.syn_sent = 0;

    match -ret {
        0 | EISCONN => {
            lru_remove(&INFLIGHT_CONNECTS, lru::INFLIGHT_CONNECTS, &sk);
        }
        EINPROGRESS | EALREADY | EINTR => pending(entry, sk),
        errno if ERESTART.contains(&errno) => pending(entry, sk),
        errno => {
            count_error(entry, errno as u32);
            lru_remove(&INFLIGHT_CONNECTS, lru::INFLIGHT_CONNECTS, &sk);
        }
    }
    Ok(())
}

/// connect() returned while the connection may still be going on: unless
/// SYN_SENT already ended while the syscall ran (then the outcome is known
/// now), it is counted when SYN_SENT ends (state.rs).
#[inline(always)]
fn pending(entry: &mut InflightConnect, sk: u64) {
    if entry.resolved == 1 {
        if entry.async_errno != 0 {
            count_error(entry, entry.async_errno);
        }
        lru_remove(&INFLIGHT_CONNECTS, lru::INFLIGHT_CONNECTS, &sk);
    } else {
        entry.in_syscall = 0;
    }
}

#[inline(always)]
pub fn count_error(entry: &InflightConnect, errno: u32) {
    bump_connect_error(&ConnectErrorKey {
        actor: entry.actor,
        family: entry.family,
        dport: entry.dport,
        errno,
        daddr: entry.daddr,
    });
}

/// int tcp_connect(struct sock *sk); called once a SYN is about to be sent.
#[fentry(function = "tcp_connect")]
pub fn tcp_connect_fentry(ctx: FEntryContext) -> u32 {
    on_tcp_connect(ctx.arg(0));
    0
}

/// Same as `tcp_connect_fentry`, for kernels where fentry is unavailable.
#[kprobe]
pub fn tcp_connect_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(sk) = ctx.arg::<u64>(0) {
        on_tcp_connect(sk);
    }
    0
}

#[inline(always)]
fn on_tcp_connect(sk: u64) {
    let actor = current_actor();
    bump_proc(&actor, sock_family(sk), ProcCounter::Connects);
    let _ = lru_insert(&SOCK_OWNERS, lru::SOCK_OWNERS, &sk, &actor);
}
