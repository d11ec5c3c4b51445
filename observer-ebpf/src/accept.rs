//! accept(): connections handed to a process. Also records the accepted
//! socket's owner, so its later TIME_WAIT (server closes first) is charged to
//! the accepting process.
use aya_ebpf::{
    macros::{fexit, kretprobe, tracepoint},
    programs::{FExitContext, RetProbeContext, TracePointContext},
};

use observer_common::lru;

use crate::{
    counters::{ProcCounter, bump_proc, lru_insert},
    kernel::{current_actor, is_tcp, sock_family, sock_of_fd},
    maps::SOCK_OWNERS,
};

/// Offset of `ret` in syscalls/sys_exit_* records.
const EXIT_RET: usize = 16;

/// syscalls/sys_exit_accept4(long ret): ret is the new file descriptor.
#[tracepoint]
pub fn accept4_exit(ctx: TracePointContext) -> u32 {
    on_accept_syscall_exit(&ctx);
    0
}

/// syscalls/sys_exit_accept(long ret)
#[tracepoint]
pub fn accept_exit(ctx: TracePointContext) -> u32 {
    on_accept_syscall_exit(&ctx);
    0
}

#[inline(always)]
fn on_accept_syscall_exit(ctx: &TracePointContext) {
    let Ok(ret) = (unsafe { ctx.read_at::<i64>(EXIT_RET) }) else { return };
    if ret < 0 {
        return;
    }
    on_accepted(sock_of_fd(ret as u64));
}

/// struct sock *inet_csk_accept(struct sock *sk, struct proto_accept_arg *arg)
/// (6.10+; before: (sk, int flags, int *err, bool kern)). Only the return
/// value is read, so both prototypes work.
#[fexit(function = "inet_csk_accept")]
pub fn inet_csk_accept_fexit(ctx: FExitContext) -> u32 {
    if let Ok(sk) = ctx.ret::<u64>() {
        on_accepted(sk);
    }
    0
}

/// Same as `inet_csk_accept_fexit`, for kernels where fexit is unavailable.
#[kretprobe]
pub fn inet_csk_accept_kretprobe(ctx: RetProbeContext) -> u32 {
    on_accepted(ctx.ret::<u64>());
    0
}

#[inline(always)]
fn on_accepted(sk: u64) {
    if !is_tcp(sk) {
        return;
    }
    let actor = current_actor();
    bump_proc(&actor, sock_family(sk), ProcCounter::Accepts);
    let _ = lru_insert(&SOCK_OWNERS, lru::SOCK_OWNERS, &sk, &actor);
}
