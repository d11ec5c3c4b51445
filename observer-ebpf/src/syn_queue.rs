//! A listener's SYN queue full: counted where the kernel counts it, in
//! `tcp_syn_flood_action`, which `tcp_conn_request` calls when a SYN meets
//! a full SYN queue (or `net.ipv4.tcp_syncookies` is 2) and decides there
//! whether a SYN cookie answers it (TcpExtTCPReqQFullDoCookies) or it is
//! dropped (TcpExtTCPReqQFullDrop), by that same sysctl. It also counts
//! the kernel's other caller (`tcp_get_syncookie_mss`, for BPF programs
//! making cookies), as the kernel does.
//!
//! The function is static: a kernel that inlined it (Debian's 5.10 and
//! 6.1) has no place to attach. There the overflow program at
//! `tcp_conn_request` repeats the kernel's test (overflow.rs, `Config`);
//! where that is not attached either, no tracepoint sees the event (the
//! SYN is consumed, not freed with a drop reason), and the hook is reported
//! absent (`observer_probe_info`) rather than counted some other way.
use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};
use observer_common::listener_drop;

use crate::{
    kernel::{ProbedSock, Sock, TypedSock, read_at},
    maps::offset,
    overflow::count_listener_drop,
};

/// static bool tcp_syn_flood_action(const struct sock *sk, const char *proto)
#[fentry(function = "tcp_syn_flood_action")]
pub fn syn_queue_full_fentry(ctx: FEntryContext) -> u32 {
    on_syn_queue_full(TypedSock(ctx.arg(0)));
    0
}

#[kprobe]
pub fn syn_queue_full_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(sk) = ctx.arg::<u64>(0) {
        on_syn_queue_full(ProbedSock(sk));
    }
    0
}

/// The kernel's own choice: a cookie whenever the namespace's
/// `tcp_syncookies` is not 0 (a kernel built without CONFIG_SYN_COOKIES
/// drops instead; Debian's and every major distribution's have it).
#[inline(always)]
fn on_syn_queue_full(sk: impl Sock) {
    // An unreadable namespace (never seen) is taken at the sysctl's
    // default, 1, as overflow.rs does: the event still counts.
    let net: u64 = unsafe { sk.sock_field(offset!(skc_net)) }.unwrap_or(0);
    let syncookies: u8 = if net == 0 { 1 } else { unsafe { read_at(net, offset!(net_tcp_syncookies)) }.unwrap_or(1) };
    let reason = if syncookies != 0 { listener_drop::SYN_COOKIE } else { listener_drop::SYN_DROP };
    count_listener_drop(sk, reason);
}
