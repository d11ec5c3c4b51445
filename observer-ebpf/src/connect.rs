//! connect(): attempts and failures by errno and destination.
//!
//! Errors are what the call returned, the ground truth the caller saw:
//! taken where connect() enters and leaves TCP's socket layer
//! (`__inet_stream_connect`, the inside of inet_stream_connect that TCP
//! Fast Open's sendmsg() calls too; fentry/fexit or kprobe/kretprobe),
//! else from the connect() syscall tracepoints, which exist on every
//! kernel but, once enabled, send every syscall of every task through the
//! kernel's slower syscall path (BENCHMARKS.md, "the floor"). While the
//! call runs, its return value is the outcome; a connection still going
//! on when it returns (non-blocking, interrupted) gets an in-flight entry
//! per socket, and its outcome is `sk_err` when the socket leaves SYN_SENT
//! (`state.rs`). So each failure is counted exactly once, whether the
//! connect() was blocking or not.
//!
//! The connection is noted when the socket enters SYN_SENT inside the call
//! (`syn_sent_in_connect`), where the socket, its destination and the
//! caller are at hand: the call's entry only notes the thread and the
//! call's arguments. Connects (SYNs sent) are counted at the call's return,
//! which knows whether the kernel found a local port: no program on
//! `tcp_connect`, one run fewer per connection (BENCHMARKS.md history 23).
//! Finding the socket (an fd-table walk in syscall mode) and reading the
//! sockaddr is left to the rare connect() that fails before SYN_SENT (no
//! route, bad address); done on every call it cost a third of observer's
//! time (BENCHMARKS.md).
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::{fentry, fexit, kprobe, kretprobe, tracepoint},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
};
use observer_common::{
    AF_INET, AF_INET6, ConnectErrorKey, InflightConnect, ThreadConnect, lost, lru, tcp_state::*, trace_event,
};

use crate::{
    counters::{ProcCounter, bump_connect_error, bump_proc, count_lost, lru_insert, lru_remove, lru_remove_if_there},
    kernel::{
        ProbedSock, Sock, current_actor, is_tcp, sock_destination, sock_err, sock_family, sock_of_fd, sock_of_socket,
        sock_tcp_state, tcp_attempted_connect,
    },
    maps::{INFLIGHT_CONNECTS, THREAD_CONNECTS},
    trace,
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
    let (Ok(fd), Ok(uservaddr)) =
        (unsafe { ctx.read_at::<u64>(ENTER_FD) }, unsafe { ctx.read_at::<u64>(ENTER_USERVADDR) })
    else {
        return 0;
    };
    // Every connect(), whatever the socket: telling TCP from the rest would
    // cost the fd-table walk this program exists to avoid.
    call_started(ThreadConnect { socket: fd, addr: uservaddr, from_syscall: 1, ..ThreadConnect::default() });
    0
}

/// int __inet_stream_connect(struct socket *sock, struct sockaddr *uaddr,
///                           int addr_len, int flags, int is_sendmsg)
#[fentry(function = "__inet_stream_connect")]
pub fn connect_call_fentry(ctx: FEntryContext) -> u32 {
    call_started(ThreadConnect { socket: ctx.arg(0), addr: ctx.arg(1), ..ThreadConnect::default() });
    0
}

/// Same as `connect_call_fentry`, for kernels where fentry is unavailable.
#[kprobe]
pub fn connect_call_kprobe(ctx: ProbeContext) -> u32 {
    if let (Some(socket), Some(addr)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) {
        call_started(ThreadConnect { socket, addr, ..ThreadConnect::default() });
    }
    0
}

/// Note the thread as inside connect(); the call's return removes it.
#[inline(always)]
fn call_started(thread: ThreadConnect) {
    let _ = lru_insert(&THREAD_CONNECTS, lru::THREAD_CONNECTS, &bpf_get_current_pid_tgid(), &thread);
}

/// The socket entered SYN_SENT (process context, from state.rs). Inside a
/// connect() call of this thread it is that call's socket: note who
/// connects where, for the call's return to count the connect and its
/// outcome; the note is returned (in the
/// map: no copy on `sock_state`'s stack), so the caller need not read the
/// process and destination again. Outside one (in syscall mode: TCP Fast
/// Open's sendmsg(), io_uring, kernel sockets) no hooked call returns an
/// errno, and nothing is noted.
#[inline(always)]
pub fn syn_sent_in_connect(sk: impl Sock) -> Option<&'static InflightConnect> {
    let thread = THREAD_CONNECTS.get_ptr_mut(&bpf_get_current_pid_tgid())?;
    let actor = current_actor();
    let family = sock_family(sk);
    let (daddr, dport) = sock_destination(sk, family);
    // SAFETY: this thread's entry; only this thread touches it.
    unsafe {
        (*thread).sk = sk.addr();
        (*thread).connect = InflightConnect { actor, daddr, family, dport, _pad: 0 };
    }
    // A new connection on this socket: an entry still here belongs to an
    // earlier socket at this address whose end a skipped run missed, and
    // must not be taken for this connection's outcome (connect_settled).
    lru_remove_if_there(&INFLIGHT_CONNECTS, lru::INFLIGHT_CONNECTS, &sk.addr());
    // SAFETY: the entry stays while this program runs (only this thread
    // removes it, at the call's return).
    Some(unsafe { &(*thread).connect })
}

/// syscalls/sys_exit_connect(long ret)
#[tracepoint]
pub fn connect_exit(ctx: TracePointContext) -> u32 {
    if let Ok(ret) = unsafe { ctx.read_at::<i64>(EXIT_RET) } {
        call_returned(ret);
    }
    0
}

/// __inet_stream_connect's return (argument 5: after the five arguments).
#[fexit(function = "__inet_stream_connect")]
pub fn connect_call_fexit(ctx: FExitContext) -> u32 {
    call_returned(ctx.arg::<i32>(5) as i64);
    0
}

/// Same as `connect_call_fexit`, for kernels where fexit is unavailable.
#[kretprobe]
pub fn connect_call_kretprobe(ctx: RetProbeContext) -> u32 {
    call_returned(ctx.ret::<i32>() as i64);
    0
}

/// connect() returned `ret` (0 or -errno).
#[inline(always)]
fn call_returned(ret: i64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(&thread) = (unsafe { THREAD_CONNECTS.get(&pid_tgid) }) else {
        return;
    };
    lru_remove(&THREAD_CONNECTS, lru::THREAD_CONNECTS, &pid_tgid);
    if thread.sk == 0 {
        // The socket never reached SYN_SENT in this call.
        if is_failure(ret) {
            failed_before_syn_sent(&thread, -ret as u32);
        }
        return;
    }
    let connect = &thread.connect;
    // Kept in a map: a plain number to the verifier.
    let sk = ProbedSock(thread.sk);
    if ret != -EADDRNOTAVAIL {
        // A socket that reached SYN_SENT in this call sent its SYN, except
        // when no local port could be found (EADDRNOTAVAIL: the kernel
        // gives up between SYN_SENT and the SYN).
        bump_proc(&connect.actor, connect.family, ProcCounter::Connects);
        trace::socket_event(trace_event::CONNECT, 0, &connect.actor, sk);
    }
    match -ret {
        0 | EISCONN => {}
        EINPROGRESS | EALREADY | EINTR => still_connecting(sk, connect),
        errno if ERESTART.contains(&errno) => still_connecting(sk, connect),
        errno => count_error(connect, errno as u32),
    }
}

/// connect() returned while the connection may still be going on: its
/// outcome comes when the socket leaves SYN_SENT (`connect_settled`), which
/// may have happened while the call ran (then nobody was waiting for
/// it), or may happen at any moment on another CPU. So the entry goes in
/// first and the state is checked after; whichever side takes the entry
/// out counts the outcome.
#[inline(always)]
fn still_connecting(sk: impl Sock, connect: &InflightConnect) {
    if lru_insert(&INFLIGHT_CONNECTS, lru::INFLIGHT_CONNECTS, &sk.addr(), connect).is_err() {
        return count_lost(lost::INFLIGHT_FULL);
    }
    let state = sock_tcp_state(sk);
    if state != SYN_SENT {
        connect_settled(sk, state == CLOSE);
    }
}

/// The socket of a pending connect left SYN_SENT: connected, or `closed`
/// with `sk_err` (refused, timed out, unreachable). Counted by the caller
/// that takes the entry out of the map (see `still_connecting`).
#[inline(always)]
pub fn connect_settled(sk: impl Sock, closed: bool) {
    let Some(&entry) = (unsafe { INFLIGHT_CONNECTS.get(&sk.addr()) }) else { return };
    if !lru_remove(&INFLIGHT_CONNECTS, lru::INFLIGHT_CONNECTS, &sk.addr()) {
        return;
    }
    let err = if closed { sock_err(sk) } else { 0 };
    if err != 0 {
        count_error(&entry, err as u32);
    }
}

/// A return value that means this connect() failed (rather than succeeded,
/// or left the connection going on).
#[inline(always)]
fn is_failure(ret: i64) -> bool {
    let errno = -ret;
    ret < 0 && !matches!(errno, EINPROGRESS | EALREADY | EISCONN | EINTR) && !ERESTART.contains(&errno)
}

/// connect() failed before its socket entered SYN_SENT (no route, a
/// refused address, ...). Counted when the socket is TCP and never started
/// a connection: on one that did, connect() is reporting the outcome of
/// that earlier attempt (a second connect() after a non-blocking one),
/// counted already when its SYN_SENT ended. The destination comes from the
/// caller's sockaddr.
#[inline(always)]
fn failed_before_syn_sent(thread: &ThreadConnect, errno: u32) {
    let sk = if thread.from_syscall == 1 { sock_of_fd(thread.socket) } else { sock_of_socket(thread.socket) };
    if !is_tcp(sk) || tcp_attempted_connect(sk) {
        return;
    }
    let Some((family, dport, daddr)) = read_sockaddr(thread.addr, thread.from_syscall == 1) else { return };
    bump_connect_error(&ConnectErrorKey { actor: current_actor(), family, dport, errno, daddr });
}

/// (family, port in host order, address) of an AF_INET/AF_INET6 sockaddr in
/// user or kernel memory.
#[inline(always)]
fn read_sockaddr(addr: u64, user: bool) -> Option<(u16, u16, [u8; 16])> {
    fn read<T>(at: u64, user: bool) -> Option<T> {
        unsafe { if user { bpf_probe_read_user(at as *const T) } else { bpf_probe_read_kernel(at as *const T) } }.ok()
    }
    // struct sockaddr_in { u16 family; be16 port; be32 addr; }
    // struct sockaddr_in6 { u16 family; be16 port; u32 flowinfo; u8 addr[16]; }
    let family: u16 = read(addr, user)?;
    let dport = u16::from_be(read(addr + 2, user)?);
    let mut daddr = [0u8; 16];
    match family {
        AF_INET6 => daddr = read(addr + 8, user)?,
        AF_INET => daddr[..4].copy_from_slice(&read::<[u8; 4]>(addr + 4, user)?),
        _ => return None,
    }
    Some((family, dport, daddr))
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
