//! Process exit: tell userspace which processes ended, so it can retire
//! their series after a grace period and delete their kernel counters.
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};

use crate::maps::EXITED;

/// sched/sched_process_exit: fires for every exiting thread; only the
/// thread-group leader's exit marks the process as gone.
#[tracepoint]
pub fn process_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tgid == pid {
        let _ = EXITED.insert(&tgid, &1, 0);
    }
    0
}
