//! Listen-queue overflows, counted where the kernel counts them
//! (LINUX_MIB_LISTENOVERFLOWS, what nstat calls TcpExtListenOverflows),
//! so a listener that overflows and dies before the next sweep is not
//! missed. The kernel bumps that counter, in Linux 5.10 to 6.18 alike:
//! - in `tcp_conn_request` (a SYN): after the SYN-queue test
//!   `if ((syncookies == 2 || inet_csk_reqsk_queue_is_full(sk)) && !isn)`,
//!   which drops the SYN uncounted unless syncookies allow a cookie, comes
//!   `if (sk_acceptq_is_full(sk)) { NET_INC_STATS(..LISTENOVERFLOWS); drop }`;
//! - in `tcp_v4_syn_recv_sock` / `tcp_v6_syn_recv_sock` (the handshake's
//!   last ACK, or a SYN cookie's): their first test is
//!   `if (sk_acceptq_is_full(sk)) goto exit_overflow;` (the v6 one hands a
//!   v4-mapped connection to the v4 one before, which counts it);
//! - in `tcp_get_syncookie_mss`, which serves only BPF programs making SYN
//!   cookies themselves (bpf_tcp_gen_syncookie): not hooked.
//!
//! Each program makes the kernel's test at the function's entry, on the
//! same fields, a few instructions before the kernel does. Only an accept()
//! or a handshake on another CPU landing in between could make the two
//! disagree.
//!
//! Where `tcp_syn_flood_action` cannot be hooked (syn_queue.rs), the SYN
//! program also counts the SYNs meeting a full SYN queue, by the same
//! repeated test (`Config::syn_queue_from_conn_request`).
use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};
use observer_common::{ListenerDropKey, ListenerKey, listener_drop, lost, trace_event};

use crate::{
    counters::{bump_listener_drop, count_lost},
    kernel::{ProbedSock, Sock, TypedSock, read_at, sock_family, sock_local_port, sock_netns, sock_owner},
    maps::{config, offset},
    trace,
};

/// ETH_P_IP as `sk_buff.protocol` holds it (network order, read as u16
/// on a little-endian CPU).
const ETH_P_IP_BE: u16 = 0x0008;

/// int tcp_conn_request(struct request_sock_ops *rsk_ops,
/// const struct tcp_request_sock_ops *af_ops, struct sock *sk, struct sk_buff *skb)
#[fentry(function = "tcp_conn_request")]
pub fn overflow_syn_fentry(ctx: FEntryContext) -> u32 {
    on_syn(TypedSock(ctx.arg(2)), ctx.arg(3));
    0
}

/// struct sock *tcp_v4_syn_recv_sock(const struct sock *sk, struct sk_buff *skb, ...)
#[fentry(function = "tcp_v4_syn_recv_sock")]
pub fn overflow_ack_v4_fentry(ctx: FEntryContext) -> u32 {
    on_last_ack(TypedSock(ctx.arg(0)));
    0
}

/// struct sock *tcp_v6_syn_recv_sock(const struct sock *sk, struct sk_buff *skb, ...)
#[fentry(function = "tcp_v6_syn_recv_sock")]
pub fn overflow_ack_v6_fentry(ctx: FEntryContext) -> u32 {
    on_last_ack_v6(TypedSock(ctx.arg(0)), ctx.arg(1));
    0
}

/// The same three as kprobes, for kernels without trampolines.
#[kprobe]
pub fn overflow_syn_kprobe(ctx: ProbeContext) -> u32 {
    if let (Some(sk), Some(skb)) = (ctx.arg::<u64>(2), ctx.arg::<u64>(3)) {
        on_syn(ProbedSock(sk), skb);
    }
    0
}

#[kprobe]
pub fn overflow_ack_v4_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(sk) = ctx.arg::<u64>(0) {
        on_last_ack(ProbedSock(sk));
    }
    0
}

#[kprobe]
pub fn overflow_ack_v6_kprobe(ctx: ProbeContext) -> u32 {
    if let (Some(sk), Some(skb)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) {
        on_last_ack_v6(ProbedSock(sk), skb);
    }
    0
}

/// `sk_acceptq_is_full`: more connections queued than the backlog.
#[inline(always)]
fn accept_queue_full(sk: impl Sock) -> bool {
    let queued: u32 = unsafe { sk.sock_field(offset!(sock_ack_backlog)) }.unwrap_or(0);
    let backlog: u32 = unsafe { sk.sock_field(offset!(sock_max_ack_backlog)) }.unwrap_or(u32::MAX);
    queued > backlog
}

/// The kernel's order at a SYN: the SYN-queue test first (a SYN it drops,
/// syncookies off, is no overflow; one answered with a cookie goes on),
/// then the accept-queue test. A SYN that matched a TIME_WAIT socket
/// (`tcp_tw_isn` set) skips the SYN-queue test.
#[inline(always)]
fn on_syn(sk: impl Sock, skb: u64) {
    let cfg = config();
    let count_syn_queue = cfg.syn_queue_from_conn_request != 0;
    let overflows = accept_queue_full(sk);
    // The common case, a SYN with room everywhere, reads no more.
    if !overflows && !count_syn_queue {
        return;
    }
    let isn: u32 = unsafe { read_at(skb, offset!(skb_tcp_tw_isn)) }.unwrap_or(0);
    if isn == 0 {
        let net: u64 = unsafe { sk.sock_field(offset!(skc_net)) }.unwrap_or(0);
        let syncookies: u8 =
            if net == 0 { 1 } else { unsafe { read_at(net, offset!(net_tcp_syncookies)) }.unwrap_or(1) };
        // inet_connection_sock's: past struct sock.
        let syn_queue: u32 = unsafe { read_at(sk.addr(), offset!(icsk_syn_queue_len)) }.unwrap_or(0);
        let backlog: u32 = unsafe { sk.sock_field(offset!(sock_max_ack_backlog)) }.unwrap_or(u32::MAX);
        // `inet_csk_reqsk_queue_is_full`: `>=` before the 2024 fix, `>`
        // since (userspace asked this kernel which, `Config`).
        let syn_queue_full =
            if cfg.syn_queue_full_at_backlog != 0 { syn_queue >= backlog } else { syn_queue > backlog };
        if syncookies == 2 || syn_queue_full {
            if count_syn_queue {
                let reason = if syncookies != 0 { listener_drop::SYN_COOKIE } else { listener_drop::SYN_DROP };
                count_listener_drop(sk, reason);
            }
            if syncookies == 0 {
                return;
            }
        }
    }
    if overflows {
        count_overflow(sk);
    }
}

#[inline(always)]
fn on_last_ack(sk: impl Sock) {
    if accept_queue_full(sk) {
        count_overflow(sk);
    }
}

#[inline(always)]
fn on_last_ack_v6(sk: impl Sock, skb: u64) {
    let protocol: u16 = unsafe { read_at(skb, offset!(skb_protocol)) }.unwrap_or(0);
    if protocol != ETH_P_IP_BE {
        on_last_ack(sk);
    }
}

/// Charge one overflow to the listener and its owner.
#[inline(always)]
fn count_overflow(sk: impl Sock) {
    count_listener_drop(sk, listener_drop::OVERFLOW);
}

/// Charge one drop (`reason`, observer-common's `listener_drop`) to the
/// listener and its owner (recorded at listen(); tgid 0 in the socket's
/// cgroup for a listener older than observer, whose owner userspace finds).
#[inline(always)]
pub fn count_listener_drop(sk: impl Sock, reason: u32) {
    let owner = sock_owner(sk);
    let listener = ListenerKey { netns: sock_netns(sk), port: sock_local_port(sk), family: sock_family(sk) };
    if !bump_listener_drop(&ListenerDropKey { owner, listener, reason, _pad: 0 }) {
        count_lost(lost::LISTEN_OVERFLOWS_FULL);
    }
    trace::socket_event(trace_event::LISTENER_DROP, reason, &owner, sk);
}
