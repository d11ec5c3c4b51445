//! Events queued for `observer trace`, only while its own copy of the
//! programs runs with `Config::trace` set: the daemon's copy never
//! reserves a record. Each record is written in place in the ring buffer
//! (no copy on the stack: these sites run inside `sock_state`, close to
//! Linux 5.10's 512-byte stack limit).
use aya_ebpf::helpers::bpf_ktime_get_ns;
use observer_common::{ConnectErrorKey, TraceEvent, trace_event};

use crate::maps::{TRACE_DROPPED, TRACE_EVENTS};

/// Queue one connect() failure.
#[inline(always)]
pub fn connect_error(key: &ConnectErrorKey) {
    let Some(mut entry) = TRACE_EVENTS.reserve::<TraceEvent>(0) else {
        if let Some(n) = TRACE_DROPPED.get_ptr_mut(0) {
            // SAFETY: this CPU's slot.
            unsafe { *n += 1 };
        }
        return;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: `e` points at the reserved record, which is ours until
    // submitted; every field is written before it is.
    unsafe {
        (*e).kind = trace_event::CONNECT_ERROR;
        (*e).errno = key.errno;
        (*e).time_ns = bpf_ktime_get_ns();
        (*e).actor = key.actor;
        (*e).daddr = key.daddr;
        (*e).family = key.family;
        (*e).dport = key.dport;
        (*e)._pad = 0;
    }
    entry.submit(0);
}
