//! Who holds a socket, found through /proc: for sockets opened before
//! observer started, which the eBPF side never saw being created.
use std::path::Path;

use observer_common::{Actor, TASK_COMM_LEN};
use procfs::process::{FDTarget, all_processes_with_root};

/// The first process with a file descriptor on socket `inode`. Scans every
/// process's fd table: call it rarely (results are cached by the caller).
pub fn owner_of_socket(proc_root: &Path, inode: u32) -> Option<Actor> {
    for process in all_processes_with_root(proc_root).ok()?.flatten() {
        let Ok(fds) = process.fd() else { continue };
        let holds = fds.flatten().any(|fd| matches!(fd.target, FDTarget::Socket(i) if i == inode as u64));
        if holds {
            let comm = process.stat().map(|s| s.comm).unwrap_or_default();
            let mut actor = Actor { tgid: process.pid as u32, ..Default::default() };
            let n = comm.len().min(TASK_COMM_LEN - 1);
            actor.comm[..n].copy_from_slice(&comm.as_bytes()[..n]);
            return Some(actor);
        }
    }
    None
}
