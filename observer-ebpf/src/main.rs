//! observer's eBPF programs. This file only declares the modules: one per
//! probe family, plus the shared maps and the kernel-struct readers.
//!
//! Every counter lives in a per-CPU hash map: one map update per event, no
//! per-event ring buffer, so counts stay exact at any event rate.
#![no_std]
// One atomic add (counters.rs); the eBPF crate is built with the pinned nightly.
#![feature(asm_experimental_arch)]
#![no_main]

mod accept;
mod connect;
mod connections;
mod counters;
mod exit;
mod kernel;
mod maps;
mod older;
mod overflow;
mod state;
mod syn_queue;
mod time_wait;
mod trace;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects programs that could reach this; it is never run.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
