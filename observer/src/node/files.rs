//! A process's open files against its RLIMIT_NOFILE: at the limit, accept()
//! and connect()'s socket() fail with EMFILE, another way a connection
//! avalanche ends.
use std::path::Path;

/// Open files of one process, and its soft limit (the one that fails).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    pub open: u64,
    pub limit: u64,
}

/// None: the process is gone, out of reach, or has no limit.
pub fn of_process(proc_root: &Path, pid: u32) -> Option<OpenFiles> {
    let process = procfs::process::Process::new_with_root(proc_root.join(pid.to_string())).ok()?;
    let procfs::process::LimitValue::Value(limit) = process.limits().ok()?.max_open_files.soft_limit else {
        return None;
    };
    // Entries of /proc/PID/fd, as `ls` counts them (cheaper than procfs's
    // fd(), which also reads every link).
    let open = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")).ok()?.count() as u64;
    Some(OpenFiles { open, limit })
}
