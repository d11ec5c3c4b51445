//! Who holds a socket, found through /proc: for sockets opened before
//! observer started, which the eBPF side never saw being created.
use std::{
    collections::{HashMap, HashSet},
    path::Path,
};

use observer_common::{Actor, TASK_COMM_LEN};
use procfs::process::{FDTarget, all_processes_with_root};

/// For each socket inode of `inodes`, the first process with a file
/// descriptor on it. One scan of every process's fd table for all of them
/// (it stops once all are found): call it rarely, callers cache.
pub fn owners_of_sockets(proc_root: &Path, inodes: &HashSet<u32>) -> HashMap<u32, Actor> {
    let mut found = HashMap::new();
    if inodes.is_empty() {
        return found;
    }
    let Ok(processes) = all_processes_with_root(proc_root) else { return found };
    for process in processes.flatten() {
        let Ok(fds) = process.fd() else { continue };
        for fd in fds.flatten() {
            let FDTarget::Socket(inode) = fd.target else { continue };
            let Ok(inode) = u32::try_from(inode) else { continue };
            if inodes.contains(&inode) && !found.contains_key(&inode) {
                found.insert(inode, actor_of(&process));
                // Each fd is a readlink: a server holding thousands of
                // connections listens on one of its first; stop there.
                if found.len() == inodes.len() {
                    return found;
                }
            }
        }
    }
    found
}

fn actor_of(process: &procfs::process::Process) -> Actor {
    let comm = process.stat().map(|s| s.comm).unwrap_or_default();
    let mut actor = Actor { tgid: process.pid as u32, ..Default::default() };
    let n = comm.len().min(TASK_COMM_LEN - 1);
    actor.comm[..n].copy_from_slice(&comm.as_bytes()[..n]);
    actor
}
