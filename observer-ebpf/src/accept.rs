//! accept(): connections handed to a process. (A TIME_WAIT entry of the
//! accepted socket, the server closing first, is charged to the process
//! that closes it: time_wait.rs.)
use aya_ebpf::{
    macros::{fexit, kretprobe, tracepoint},
    programs::{FExitContext, RetProbeContext, TracePointContext},
};

use observer_common::trace_event;

use crate::{
    counters::{ProcCounter, bump_proc},
    kernel::{ProbedSock, Sock, TypedSock, current_actor, is_tcp, sock_family, sock_of_fd},
    trace,
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
/// (Linux 6.10+). Only the return value is read, from the context, where
/// it follows the arguments: `ctx.ret()` would call bpf_get_func_ret, which
/// Linux 5.17 added. Its place depends on the prototype, so there is one
/// program per prototype, and userspace loads the one this kernel's BTF
/// has (a constant offset each: the verifier refuses a computed one).
#[fexit(function = "inet_csk_accept")]
pub fn inet_csk_accept_fexit(ctx: FExitContext) -> u32 {
    on_accepted(TypedSock(ctx.arg(2)));
    0
}

/// struct sock *inet_csk_accept(struct sock *sk, int flags, int *err,
/// bool kern) (before Linux 6.10): the return value after 4 arguments.
#[fexit(function = "inet_csk_accept")]
pub fn inet_csk_accept_fexit_4(ctx: FExitContext) -> u32 {
    on_accepted(TypedSock(ctx.arg(4)));
    0
}

/// Same as `inet_csk_accept_fexit`, for kernels where fexit is unavailable.
#[kretprobe]
pub fn inet_csk_accept_kretprobe(ctx: RetProbeContext) -> u32 {
    on_accepted(ProbedSock(ctx.ret::<u64>()));
    0
}

#[inline(always)]
fn on_accepted(sk: impl Sock) {
    if !is_tcp(sk) {
        return;
    }
    let actor = current_actor();
    bump_proc(&actor, sock_family(sk), ProcCounter::Accepts);
    trace::socket_event(trace_event::ACCEPT, 0, &actor, sk);
}
