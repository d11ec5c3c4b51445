//! What the kernel knows about our programs' runs: how often it skipped
//! one because a BPF program was already running on that CPU (recursion
//! protection), and, when `kernel.bpf_stats_enabled` is on, run counts and
//! time.
//!
//! A skipped run is an event we never saw, so it is exported
//! (`observer_kernel_missed_events_total`) rather than hidden. The kernel
//! counts skips of fentry/fexit and tp_btf programs since Linux 5.12, and of
//! kprobe and classic tracepoint programs since 6.7 (older kernels skip
//! those silently).
//!
//! aya 0.14's `ProgramInfo` does not expose `recursion_misses`, so the info
//! is read with BPF_OBJ_GET_INFO_BY_FD directly.
use std::{
    os::fd::{AsFd, AsRawFd, OwnedFd},
    sync::Arc,
};

use aya::Ebpf;
use aya_obj::generated::bpf_prog_info;

/// One attached program of a hook, kept open to read its info (cheap to
/// clone: the collector thread holds its own).
#[derive(Clone)]
pub struct ProgramHandle {
    pub hook: &'static str,
    pub program: &'static str,
    fd: Arc<OwnedFd>,
}

/// A program's run statistics, as of the read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Runs the kernel skipped because of recursion protection.
    pub missed: u64,
    /// Runs and their total time; 0 unless `kernel.bpf_stats_enabled=1`.
    pub run_count: u64,
    pub run_time_ns: u64,
}

impl ProgramHandle {
    /// A handle on `program` of the loaded object, for `hook`.
    pub fn open(ebpf: &Ebpf, hook: &'static str, program: &'static str) -> Result<Self, String> {
        let prog = ebpf.program(program).ok_or_else(|| format!("program {program} not in the object"))?;
        let fd = prog.fd().map_err(|e| e.to_string())?;
        let fd = fd.as_fd().try_clone_to_owned().map_err(|e| e.to_string())?;
        Ok(Self { hook, program, fd: Arc::new(fd) })
    }

    pub fn stats(&self) -> std::io::Result<RunStats> {
        let info = prog_info(&self.fd)?;
        Ok(RunStats { missed: info.recursion_misses, run_count: info.run_cnt, run_time_ns: info.run_time_ns })
    }
}

/// BPF_OBJ_GET_INFO_BY_FD on a program fd. The kernel fills at most
/// `info_len` bytes and zeroes what it does not know, so an older kernel
/// leaves `recursion_misses` at 0.
fn prog_info(fd: &OwnedFd) -> std::io::Result<bpf_prog_info> {
    // The `info` member of union bpf_attr, as the kernel reads it.
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    const BPF_OBJ_GET_INFO_BY_FD: nix::libc::c_long = 15;
    // SAFETY: bpf_prog_info is plain data (integers and pointers the kernel
    // only writes through when their lengths are non-zero; they are 0 here).
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<bpf_prog_info>() as u32,
        info: &mut info as *mut bpf_prog_info as u64,
    };
    // SAFETY: attr and info are valid for the sizes passed, for the call.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info)
}
