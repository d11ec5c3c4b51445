//! The network namespaces of the node: found through every process's
//! `ns/net` and every `ip netns` bind mount, entered one after the other
//! from a thread of their own.
use std::{
    collections::BTreeMap,
    fs::File,
    io,
    os::{
        fd::{AsFd, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
};

use nix::{
    fcntl::{OFlag, openat},
    sched::{CloneFlags, setns},
    sys::stat::Mode,
};

/// A namespace's inode: its identity for its whole life (unlike a pid).
pub fn inode(path: &Path) -> Option<u32> {
    std::fs::metadata(path).ok().map(|m| m.ino() as u32)
}

/// Each process's network namespace: pid -> the namespace's inode, from one
/// pass over /proc (each a path walk through /proc/PID/ns/net; doctor
/// asks it three times: for the namespaces, the listeners' owners and the
/// open files). Kernel threads are the host's; a process gone halfway is
/// left out.
pub fn of_processes(proc_root: &Path) -> BTreeMap<u32, u32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else { return BTreeMap::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            Some((pid, inode(&entry.path().join("ns/net"))?))
        })
        .collect()
}

/// Network namespaces of this host: every process's and every `ip netns`
/// bind mount, by inode, each with one path that opens it.
pub fn all(proc_root: &Path) -> BTreeMap<u32, PathBuf> {
    all_of(proc_root, &of_processes(proc_root))
}

/// `all`, the processes' namespaces already read (`of_processes`).
pub fn all_of(proc_root: &Path, processes: &BTreeMap<u32, u32>) -> BTreeMap<u32, PathBuf> {
    let mut found = BTreeMap::new();
    // The lowest pid's path names a namespace of processes.
    for (pid, inode) in processes {
        found.entry(*inode).or_insert_with(|| proc_root.join(pid.to_string()).join("ns/net"));
    }
    // After the processes: a namespace that has both is named by one.
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for entry in entries.flatten() {
            if let Some(inode) = inode(&entry.path()) {
                found.entry(inode).or_insert(entry.path());
            }
        }
    }
    found
}

/// The process whose `ns/net` `path` is (`<proc_root>/<pid>/ns/net`); None
/// for a bind mount (`ip netns`, a CNI's /run/netns/cni-...).
pub fn pid_of(path: &Path) -> Option<u32> {
    if !path.ends_with("ns/net") {
        return None;
    }
    path.parent()?.parent()?.file_name()?.to_str()?.parse().ok()
}

/// The host's namespace is init's; where init is out of reach (a sandbox),
/// the one observer runs in.
pub fn host(proc_root: &Path) -> Option<u32> {
    inode(&proc_root.join("1/ns/net")).or_else(|| inode(Path::new("/proc/self/ns/net")))
}

/// `in_each_namespace`, given at most `limit`: what it returned for the
/// namespaces it entered by then, in order, and whether it went through
/// them all. A namespace path that blocks on open, or a namespace slow to
/// read, costs only itself and those after it; the worker is left behind
/// where it hangs, what it returns later dropped. For work the daemon's
/// start waits on.
pub fn in_each_namespace_within<T: Send + 'static>(
    namespaces: BTreeMap<u32, PathBuf>,
    limit: std::time::Duration,
    f: impl Fn(u32) -> Option<T> + Send + 'static,
) -> (Vec<T>, bool) {
    let deadline = std::time::Instant::now() + limit;
    let (send, receive) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new().name("observer-netns-start".into()).spawn(move || {
        enter_each(namespaces, |inode| {
            if let Some(value) = f(inode) {
                let _ = send.send(value);
            }
        })
    });
    let mut read = Vec::new();
    if worker.is_err() {
        return (read, false);
    }
    loop {
        match receive.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(value) => read.push(value),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return (read, true),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return (read, false),
        }
    }
}

/// Run `f` inside each network namespace (by inode and a path that opens
/// it), collecting what it returns. Runs on a fresh OS thread: setns
/// changes the calling thread's namespace, which must never leak into the
/// tokio runtime's threads. A namespace that vanished is skipped.
pub fn in_each_namespace<T: Send + 'static>(
    namespaces: BTreeMap<u32, PathBuf>,
    f: impl Fn(u32) -> Option<T> + Send + 'static,
) -> Vec<T> {
    let worker = std::thread::Builder::new().name("observer-netns".into()).spawn(move || {
        let mut all = Vec::new();
        enter_each(namespaces, |inode| all.extend(f(inode)));
        all
    });
    match worker {
        Ok(handle) => handle.join().unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// Enter each namespace in turn on the calling thread (which must be one
/// of ours, made for it) and call `each` there; a namespace that vanished
/// is skipped.
fn enter_each(namespaces: BTreeMap<u32, PathBuf>, mut each: impl FnMut(u32)) {
    for (inode, path) in namespaces {
        let Ok(file) = File::open(&path) else { continue };
        if setns(file.as_fd(), CloneFlags::CLONE_NEWNET).is_err() {
            continue;
        }
        each(inode);
    }
}

/// The calling thread's namespace's sysctl directories (/proc/sys/net/ipv4,
/// core, netfilter) and /proc/thread-self/net, opened once, so its files
/// open relative to them. Each namespace has its own entry of each such
/// directory, all alike named under one shared parent, so every path
/// lookup through one compares against every namespace's (the kernel's
/// `proc_sys_compare`): at 110 namespaces, a good part of what opening a
/// namespace's dozen files cost. Files answer for the namespace they were
/// opened in, from any thread.
pub struct Dirs {
    ipv4: OwnedFd,
    core: OwnedFd,
    /// Absent without nf_conntrack.
    netfilter: Option<OwnedFd>,
    proc_net: OwnedFd,
}

impl Dirs {
    pub fn open() -> io::Result<Self> {
        let dir = |path: &str| -> io::Result<OwnedFd> {
            Ok(nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?)
        };
        Ok(Self {
            ipv4: dir("/proc/sys/net/ipv4")?,
            core: dir("/proc/sys/net/core")?,
            netfilter: dir("/proc/sys/net/netfilter").ok(),
            proc_net: dir("/proc/thread-self/net")?,
        })
    }

    /// A sysctl file below /proc/sys/net (`ipv4/tcp_fin_timeout`).
    pub fn sysctl(&self, path: &str) -> io::Result<File> {
        let dir = match path.split_once('/') {
            Some(("ipv4", name)) => Some((&self.ipv4, name)),
            Some(("core", name)) => Some((&self.core, name)),
            Some(("netfilter", name)) => self.netfilter.as_ref().map(|fd| (fd, name)),
            _ => None,
        };
        match dir {
            Some((fd, name)) => Self::file(fd, name),
            None => Err(io::Error::new(io::ErrorKind::NotFound, format!("/proc/sys/net/{path}: not opened"))),
        }
    }

    /// A file below /proc/net (`sockstat`).
    pub fn proc_net(&self, name: &str) -> io::Result<File> {
        Self::file(&self.proc_net, name)
    }

    fn file(dir: &OwnedFd, name: &str) -> io::Result<File> {
        Ok(openat(dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())?.into())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn text(mut file: File) -> String {
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn a_file_opened_relative_to_its_directory_is_the_one_its_path_names() {
        let dirs = Dirs::open().unwrap();
        for name in ["ipv4/ip_local_port_range", "core/somaxconn"] {
            let direct = std::fs::read_to_string(format!("/proc/sys/net/{name}")).unwrap();
            assert_eq!(text(dirs.sysctl(name).unwrap()), direct, "{name}");
        }
        let sockstat = text(dirs.proc_net("sockstat").unwrap());
        assert!(sockstat.contains("TCP: inuse"), "{sockstat}");
        let error = dirs.sysctl("unix/max_dgram_qlen").unwrap_err();
        assert!(error.to_string().contains("/proc/sys/net/unix/max_dgram_qlen"), "names the file: {error}");
    }
}
