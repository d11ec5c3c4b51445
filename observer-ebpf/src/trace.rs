//! Events queued for `observer trace`, only those of the kinds its own copy
//! of the programs asked for (`TRACE_KINDS`, `trace_event` bits): the
//! daemon's copy has 0 there, known to the verifier, which leaves the
//! trace code out of its programs. Each record is written in place in the ring buffer (no copy
//! on the stack: these sites run inside `sock_state`, close to Linux
//! 5.10's 512-byte stack limit).
use aya_ebpf::{helpers::bpf_ktime_get_ns, maps::ring_buf::RingBufEntry};
use observer_common::{Actor, ConnectErrorKey, TraceEvent, trace_event};

use crate::{
    kernel::{Sock, read_destination_into, sock_family, sock_remote_port, sock_source_port},
    maps::{TRACE_DROPPED, TRACE_EVENTS, TRACE_KINDS},
};

/// Whether `observer trace` asked for events of `kind`: a read-only
/// global, so the verifier knows it, and in the daemon's copy (0) drops
/// the code after this test.
#[inline(always)]
fn wanted(kind: u32) -> bool {
    // SAFETY: a static, read in place; volatile, as userspace sets it
    // before load.
    unsafe { core::ptr::read_volatile(&TRACE_KINDS) & kind != 0 }
}

/// Reserve a record with its kind, detail and time written: the caller
/// writes the rest in place and submits it. A full ring counts the event
/// in `TRACE_DROPPED` instead. (No closure: the compiler keeps one out of
/// line, a second stack frame the 5.10 verifier adds to `sock_state`'s.)
#[inline(always)]
fn reserve(kind: u32, detail: u32) -> Option<RingBufEntry<TraceEvent>> {
    let Some(mut entry) = TRACE_EVENTS.reserve::<TraceEvent>(0) else {
        if let Some(n) = TRACE_DROPPED.get_ptr_mut(0) {
            // SAFETY: this CPU's slot.
            unsafe { *n += 1 };
        }
        return None;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: `e` points at the reserved record, which is ours until
    // submitted.
    unsafe {
        (*e).kind = kind;
        (*e).detail = detail;
        (*e).time_ns = bpf_ktime_get_ns();
        (*e)._pad = 0;
    }
    Some(entry)
}

/// One connect() failure.
#[inline(always)]
pub fn connect_error(key: &ConnectErrorKey) {
    if !wanted(trace_event::CONNECT_ERROR) {
        return;
    }
    let Some(mut entry) = reserve(trace_event::CONNECT_ERROR, key.errno) else { return };
    let e = entry.as_mut_ptr();
    // SAFETY: the reserved record; every field written before submitting.
    unsafe {
        (*e).actor = key.actor;
        (*e).daddr = key.daddr;
        (*e).family = key.family;
        (*e).dport = key.dport;
        (*e).lport = 0;
    }
    entry.submit(0);
}

/// An event of `kind` on socket `sk` (its far end and local port read
/// from it straight into the record), of `actor`.
#[inline(always)]
pub fn socket_event(kind: u32, detail: u32, actor: &Actor, sk: impl Sock) {
    if !wanted(kind) {
        return;
    }
    let Some(mut entry) = reserve(kind, detail) else { return };
    let e = entry.as_mut_ptr();
    // SAFETY: the reserved record; every field written before submitting.
    unsafe {
        let family = sock_family(sk);
        (*e).actor = *actor;
        (*e).family = family;
        read_destination_into(sk, family, &mut (*e).daddr);
        (*e).dport = sock_remote_port(sk);
        (*e).lport = sock_source_port(sk);
    }
    entry.submit(0);
}
