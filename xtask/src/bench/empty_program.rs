//! The cheapest program a tracer can put on a tracepoint: `r0 = 0; exit`,
//! loaded as a raw tracepoint program and attached to one tracepoint.
//! observer's `sock_state` is a tp_btf program on `inet_sock_set_state`,
//! which the kernel runs by the same path (`__bpf_trace_run`), so an empty
//! program there is the fixed cost every state change pays before any
//! work: the floor of a tracer that follows connections through their
//! states. bpftrace cannot say it: Debian's (0.17) has no raw tracepoints,
//! and its `tracepoint:` probes fill a perf buffer per event first.
use std::os::fd::{FromRawFd as _, OwnedFd};

use anyhow::{Result, bail};

const BPF_PROG_LOAD: i64 = 5;
const BPF_RAW_TRACEPOINT_OPEN: i64 = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
/// The bpf(2) syscall's number.
const SYS_BPF: i64 = if cfg!(target_arch = "aarch64") { 280 } else { 321 };

unsafe extern "C" {
    fn syscall(number: i64, ...) -> i64;
}

/// An empty program attached; detached when dropped.
pub struct Attached {
    _program: OwnedFd,
    _link: OwnedFd,
}

/// Attach an empty program to the raw tracepoint `tracepoint`
/// (`inet_sock_set_state`).
pub fn attach(tracepoint: &str) -> Result<Attached> {
    // BPF_ALU64|BPF_MOV|BPF_K to r0 with 0, then BPF_JMP|BPF_EXIT.
    let instructions: [u64; 2] = [0xb7, 0x95];
    let license = c"GPL";
    // union bpf_attr, BPF_PROG_LOAD's part: prog_type, insn_cnt, insns,
    // license, ..., prog_name at 48. The rest stays zero.
    let mut load = [0u8; 128];
    load[0..4].copy_from_slice(&BPF_PROG_TYPE_RAW_TRACEPOINT.to_ne_bytes());
    load[4..8].copy_from_slice(&(instructions.len() as u32).to_ne_bytes());
    load[8..16].copy_from_slice(&(instructions.as_ptr() as u64).to_ne_bytes());
    load[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    load[48..59].copy_from_slice(b"bench_empty");
    let program = bpf(BPF_PROG_LOAD, &mut load, "loading an empty program")?;
    // BPF_RAW_TRACEPOINT_OPEN's part: the tracepoint's name, the program.
    let name = std::ffi::CString::new(tracepoint)?;
    let mut open = [0u8; 128];
    open[0..8].copy_from_slice(&(name.as_ptr() as u64).to_ne_bytes());
    open[8..12].copy_from_slice(&(std::os::fd::AsRawFd::as_raw_fd(&program) as u32).to_ne_bytes());
    let link = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut open, &format!("attaching it to the raw tracepoint {tracepoint}"))?;
    Ok(Attached { _program: program, _link: link })
}

fn bpf(command: i64, attr: &mut [u8; 128], what: &str) -> Result<OwnedFd> {
    // SAFETY: `attr` is a zeroed bpf_attr of the size passed, its pointers
    // valid for the call. Every variadic argument is passed as a full
    // register's width, as syscall(2) reads them.
    let fd = unsafe { syscall(SYS_BPF, command, attr.as_mut_ptr(), attr.len() as i64) };
    if fd < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
