//! Who holds a socket, found through /proc: for sockets opened before
//! observer started, which the eBPF side never saw being created.
use std::{
    collections::{BTreeMap, HashMap},
    mem::MaybeUninit,
    ops::ControlFlow,
    path::Path,
};

use observer_common::{Actor, TASK_COMM_LEN};
use procfs::process::Process;
use rustix::fs::RawDir;

use super::netns;

/// For each socket of `wanted` (its inode -> its network namespace's), the
/// first process of that namespace with a file descriptor on it. One scan
/// of the fd tables for all of them, of the processes in those namespaces
/// only (each fd is a readlink: a node's other processes hold thousands),
/// each table read only while its namespace has sockets left to find, so a
/// server holding thousands of connections is left once its listener, one
/// of its first files, is found. A socket held only by a process of
/// another namespace (passed over a unix socket) stays unnamed. Call it
/// rarely: callers cache.
pub fn owners_of_sockets(proc_root: &Path, wanted: &HashMap<u32, u32>) -> HashMap<u32, Actor> {
    if wanted.is_empty() {
        return HashMap::new();
    }
    owners_among(proc_root, &netns::of_processes(proc_root), wanted)
}

/// `owners_of_sockets`, each process's namespace already read
/// (`netns::of_processes`).
pub fn owners_among(
    proc_root: &Path,
    processes: &BTreeMap<u32, u32>,
    wanted: &HashMap<u32, u32>,
) -> HashMap<u32, Actor> {
    let mut found = HashMap::new();
    let mut left: HashMap<u32, usize> = HashMap::new();
    for netns in wanted.values() {
        *left.entry(*netns).or_default() += 1;
    }
    for (&pid, netns) in processes {
        if left.get(netns).is_none_or(|n| *n == 0) {
            continue;
        }
        let done = each_socket(&proc_root.join(pid.to_string()).join("fd"), |inode| {
            if wanted.get(&inode) != Some(netns) || found.contains_key(&inode) {
                return ControlFlow::Continue(());
            }
            let Ok(process) = Process::new_with_root(proc_root.join(pid.to_string())) else {
                return ControlFlow::Break(false);
            };
            found.insert(inode, actor_of(&process));
            let n = left.get_mut(netns).expect("counted above");
            *n -= 1;
            match (found.len() == wanted.len(), *n == 0) {
                (true, _) => ControlFlow::Break(true),
                (false, true) => ControlFlow::Break(false),
                (false, false) => ControlFlow::Continue(()),
            }
        });
        if done {
            break;
        }
    }
    found
}

/// Calls `f` with the inode of each socket among the descriptors of a
/// process's /proc/PID/fd (`dir`), in the kernel's order (by number),
/// until `f` breaks, and says what it broke with (false if it never did,
/// or the process is gone). Each descriptor is one readlinkat() relative
/// to the open directory (procfs' iterator opens, reads, stats and closes
/// each: four calls). The listing is read ~40 entries at a time, where
/// libc's readdir asks for 32 KiB (~1,300 entries, each one the kernel
/// looks up to list it): a server's listener is among its first
/// descriptors, and a server holding thousands of connections is left
/// once the first few are read.
fn each_socket(dir: &Path, mut f: impl FnMut(u32) -> ControlFlow<bool>) -> bool {
    let Ok(dir) = std::fs::File::open(dir) else { return false };
    let mut listing = [MaybeUninit::uninit(); 1024];
    let mut entries = RawDir::new(&dir, &mut listing);
    let mut link = [MaybeUninit::uninit(); 64];
    while let Some(Ok(entry)) = entries.next() {
        let name = entry.file_name();
        if name.to_bytes().first().is_none_or(|b| !b.is_ascii_digit()) {
            continue; // `.` and `..`
        }
        // Gone since the listing (closed): the next one.
        let Ok((target, _)) = rustix::fs::readlinkat_raw(&dir, name, &mut link) else { continue };
        let inode =
            std::str::from_utf8(target).ok().and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok());
        if let Some(inode) = inode
            && let ControlFlow::Break(done) = f(inode)
        {
            return done;
        }
    }
    false
}

fn actor_of(process: &procfs::process::Process) -> Actor {
    let comm = process.stat().map(|s| s.comm).unwrap_or_default();
    let mut actor = Actor { tgid: process.pid as u32, ..Default::default() };
    let n = comm.len().min(TASK_COMM_LEN - 1);
    actor.comm[..n].copy_from_slice(&comm.as_bytes()[..n]);
    actor
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    /// /proc/`pid` of a process in network namespace `netns` (a file of
    /// the fake tree: its inode is the namespace's) holding `sockets` as
    /// fds 3, 4, ...
    fn fake(root: &Path, pid: u32, netns: &Path, sockets: &[u32]) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::fs::hard_link(netns, dir.join("ns/net")).unwrap();
        for (i, inode) in sockets.iter().enumerate() {
            std::os::unix::fs::symlink(format!("socket:[{inode}]"), dir.join("fd").join((3 + i).to_string())).unwrap();
        }
    }

    #[test]
    fn a_socket_is_named_by_a_process_of_its_own_namespace_only() {
        let root = std::env::temp_dir().join(format!("observer-owners-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let (a, b) = (root.join("netns-a"), root.join("netns-b"));
        std::fs::write(&a, "").unwrap();
        std::fs::write(&b, "").unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino() as u32;
        // Pid 9, in B, holds A's socket 100 too (passed to it): scanned
        // only for B's socket 200, which it does not hold.
        fake(&root, 9, &b, &[100, 300]);
        fake(&root, 10, &a, &[100, 101]);
        fake(&root, 11, &b, &[200]);
        let wanted = HashMap::from([(100, ino(&a)), (200, ino(&b)), (400, ino(&a))]);
        let found = owners_of_sockets(&root, &wanted);
        let owner = |inode| found.get(&inode).map(|a: &Actor| a.tgid);
        assert_eq!(owner(100), Some(10), "the holder in its namespace, not pid 9 in another");
        assert_eq!(owner(200), Some(11));
        assert_eq!(owner(400), None, "held by no one");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_socket_held_behind_hundreds_of_others_is_found() {
        // The fd directory is read a kilobyte (~40 entries) at a time: the
        // one socket wanted lies far past the first read, in whatever
        // order the filesystem lists them.
        let root = std::env::temp_dir().join(format!("observer-owners-long-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let netns = root.join("netns");
        std::fs::write(&netns, "").unwrap();
        let sockets: Vec<u32> = (5000..5300).collect();
        fake(&root, 12, &netns, &sockets);
        let inode = std::fs::metadata(&netns).unwrap().ino() as u32;
        let wanted = HashMap::from([(5299, inode), (5000, inode)]);
        let found = owners_of_sockets(&root, &wanted);
        assert_eq!(found.len(), 2, "{:?}", found.keys());
        assert!(found.values().all(|a| a.tgid == 12));
        let _ = std::fs::remove_dir_all(&root);
    }
}
