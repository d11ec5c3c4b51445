//! What the kernel knows about our programs' runs: how often it skipped
//! one because a BPF program was already running on that CPU (recursion
//! protection), and, when `kernel.bpf_stats_enabled` is on, run counts and
//! time.
//!
//! A skipped run is an event we never saw, so it is exported
//! (`observer_kernel_missed_events_total`) rather than hidden. The kernel
//! counts skips of fentry/fexit and tp_btf programs since Linux 5.12, and of
//! kprobe and classic tracepoint programs since 6.7; older kernels skip
//! those silently, so their programs get no series (a zero would claim
//! nothing was skipped) and observer says so at start and in
//! `observer_probe_info{observer_probe_missed_events="uncounted"}`.
//!
//! aya 0.14's `ProgramInfo` does not expose `recursion_misses`, so the info
//! is read with BPF_OBJ_GET_INFO_BY_FD directly.
use std::{
    os::fd::{AsFd, AsRawFd, OwnedFd},
    sync::Arc,
};

use aya::Ebpf;
use aya_obj::generated::bpf_prog_info;

use super::hooks::{Mode, SkippedRuns};

/// One attached program of a hook, kept open to read its info (cheap to
/// clone: the collector thread holds its own).
#[derive(Clone)]
pub struct ProgramHandle {
    pub hook: &'static str,
    pub program: &'static str,
    /// Whether the kernel counts the runs of it that it skips.
    pub skips_counted: bool,
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
    /// A handle on `program` of the loaded object, for `hook`, attached in
    /// `mode` on a kernel of version `kernel` (major, minor).
    pub fn open(
        ebpf: &Ebpf,
        hook: &'static str,
        program: &'static str,
        mode: Mode,
        kernel: (u32, u32),
    ) -> Result<Self, String> {
        let prog = ebpf.program(program).ok_or_else(|| format!("program {program} not in the object"))?;
        let fd = prog.fd().map_err(|e| e.to_string())?;
        let fd = fd.as_fd().try_clone_to_owned().map_err(|e| e.to_string())?;
        let (_, info_len) = prog_info(&fd).map_err(|e| e.to_string())?;
        let skips_counted = skips_counted(mode, kernel, info_len >= RECURSION_MISSES_END);
        Ok(Self { hook, program, skips_counted, fd: Arc::new(fd) })
    }

    pub fn stats(&self) -> std::io::Result<RunStats> {
        let (info, _) = prog_info(&self.fd)?;
        Ok(RunStats { missed: info.recursion_misses, run_count: info.run_cnt, run_time_ns: info.run_time_ns })
    }
}

/// Where `recursion_misses` ends in bpf_prog_info: a kernel whose info is
/// shorter (before 5.12) has no such count.
const RECURSION_MISSES_END: usize = std::mem::offset_of!(bpf_prog_info, recursion_misses) + std::mem::size_of::<u64>();

/// Since when kernels count skipped runs, as said to whoever reads a
/// warning that this one does not (`skips_counted` is the rule).
pub const SKIPS_COUNTED_SINCE: &str = "fentry/fexit and tp_btf: Linux 5.12+; kprobe and tracepoint: 6.7+";

/// Whether a kernel of version `kernel` whose program info has the
/// `recursion_misses` field (`has_field`) counts the skipped runs of a
/// program attached in `mode`: trampolines (fentry/fexit) and tp_btf count
/// since the field came (5.12), kprobes and classic tracepoints since 6.7.
pub fn skips_counted(mode: Mode, kernel: (u32, u32), has_field: bool) -> bool {
    has_field
        && match mode {
            Mode::Fentry | Mode::Fexit | Mode::BtfTracepoint => true,
            Mode::Kprobe | Mode::Kretprobe | Mode::Tracepoint => kernel >= (6, 7),
            Mode::SockDiag | Mode::Absent => false,
        }
}

/// What a hook's programs tell of their skipped runs.
pub fn skipped_runs(programs: &[&ProgramHandle]) -> SkippedRuns {
    match programs {
        [] => SkippedRuns::NoProgram,
        _ if programs.iter().all(|p| p.skips_counted) => SkippedRuns::Counted,
        _ => SkippedRuns::Uncounted,
    }
}

/// The running kernel's (major, minor), from its release
/// ("5.10.0-46-amd64" -> (5, 10)); (0, 0) if unreadable.
pub fn kernel_version() -> (u32, u32) {
    parse_version(&std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default())
}

fn parse_version(release: &str) -> (u32, u32) {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// BPF_OBJ_GET_INFO_BY_FD on a program fd, and how many bytes of it the
/// kernel knows (it fills at most its own struct's size and says so).
fn prog_info(fd: &OwnedFd) -> std::io::Result<(bpf_prog_info, usize)> {
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
    Ok((info, attr.info_len as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_are_counted_from_5_12_for_trampolines_and_6_7_for_kprobes() {
        assert_eq!(parse_version("5.10.0-46-amd64"), (5, 10));
        assert_eq!(parse_version("6.18.44-fc-v769"), (6, 18));
        assert!(!skips_counted(Mode::Fexit, (5, 10), false), "no recursion_misses field before 5.12");
        assert!(skips_counted(Mode::Fentry, (5, 12), true));
        assert!(skips_counted(Mode::BtfTracepoint, (6, 1), true));
        assert!(!skips_counted(Mode::Kprobe, (6, 1), true), "kprobes skip silently before 6.7");
        assert!(!skips_counted(Mode::Tracepoint, (6, 6), true));
        assert!(skips_counted(Mode::Kretprobe, (6, 7), true));
        assert!(skips_counted(Mode::Tracepoint, (6, 12), true));
    }
}
