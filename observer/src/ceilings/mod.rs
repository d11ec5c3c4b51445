//! Ceilings next to usage, per network namespace: ephemeral ports per
//! destination against the port range, TIME_WAIT sockets against
//! tcp_max_tw_buckets, each listener's accept queue against its backlog,
//! each process's open files against RLIMIT_NOFILE; and the settings that
//! bound them. `observer doctor` prints them as the on-call check list.
pub mod checks;
pub mod files;
pub mod settings;
pub mod trend;
pub mod usage;

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use checks::{Check, Finding};
use serde::Serialize;
use usage::NetnsUsage;

use crate::{
    attribution::Attributor,
    collect::{proc_owner, sock_diag},
};

/// What to look at.
pub enum Scope {
    /// Every network namespace of the host (host, pods, `ip netns`).
    All,
    /// One namespace, by a path that opens it (/run/netns/NAME,
    /// /proc/PID/ns/net).
    Netns(PathBuf),
    /// One process: its namespace, and its own open files only.
    Pid(u32),
}

#[derive(Serialize)]
pub struct NetnsReport {
    pub netns: String,
    pub settings: settings::NetSettings,
    pub time_wait: u32,
}

#[derive(Serialize)]
pub struct Report {
    pub namespaces: Vec<NetnsReport>,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn worst(&self) -> checks::Verdict {
        self.findings.iter().map(|f| f.verdict).max().unwrap_or(checks::Verdict::Ok)
    }
}

fn netns_inode(path: &Path) -> Option<u32> {
    std::fs::metadata(path).ok().map(|m| m.ino() as u32)
}

/// One network namespace as a sweep found it.
pub struct NetnsSweep {
    /// "host", or the namespace's inode number (stable for its life,
    /// unlike a pid).
    pub name: String,
    /// Every listener, with its accept queue and drops.
    pub listeners: Vec<sock_diag::Listener>,
    /// The ceilings and their usage; None if they could not be read (the
    /// listeners, which the drop counts need, are kept apart for that).
    pub usage: Option<NetnsUsage>,
}

/// Every network namespace of the host, entered once each: its listeners
/// and its usage of the ceilings, what the daemon exports every interval.
/// A namespace whose listeners cannot be dumped is left out.
pub fn sweep(proc_root: &Path) -> Vec<NetnsSweep> {
    let host = host_netns(proc_root);
    sock_diag::in_each_namespace(sock_diag::namespaces(proc_root), move |inode| {
        let name = if Some(inode) == host { "host".to_string() } else { inode.to_string() };
        read_namespace(inode).map(|(listeners, usage)| NetnsSweep { name, listeners, usage })
    })
}

/// The calling thread's namespace (`inode`).
fn read_namespace(inode: u32) -> Option<(Vec<sock_diag::Listener>, Option<NetnsUsage>)> {
    let listeners = sock_diag::dump_listeners(inode).ok()?;
    let usage = usage::read(&listeners).ok();
    Some((listeners, usage))
}

/// The host's namespace is init's; where init is out of reach (a sandbox),
/// the one observer runs in.
fn host_netns(proc_root: &Path) -> Option<u32> {
    netns_inode(&proc_root.join("1/ns/net")).or_else(|| netns_inode(Path::new("/proc/self/ns/net")))
}

/// Run the check list on `scope`.
pub fn examine(scope: &Scope, proc_root: &Path, pod_logs: PathBuf) -> std::io::Result<Report> {
    let host = host_netns(proc_root);
    let namespaces: BTreeMap<u32, PathBuf> = match scope {
        Scope::All => sock_diag::namespaces(proc_root),
        Scope::Netns(path) => {
            let inode = netns_inode(path).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{}: no such network namespace", path.display()),
                )
            })?;
            [(inode, path.clone())].into()
        }
        Scope::Pid(pid) => {
            let path = proc_root.join(pid.to_string()).join("ns/net");
            let inode = netns_inode(&path).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("no process {pid} (or no access to it)"))
            })?;
            [(inode, path)].into()
        }
    };
    let names: BTreeMap<u32, String> = namespaces
        .iter()
        .map(|(inode, path)| {
            let name = if Some(*inode) == host { "host".to_string() } else { path.display().to_string() };
            (*inode, name)
        })
        .collect();
    let usages: Vec<(u32, Vec<sock_diag::Listener>, NetnsUsage)> =
        sock_diag::in_each_namespace(namespaces, |inode| match read_namespace(inode)? {
            (listeners, Some(usage)) => Some((inode, listeners, usage)),
            (_, None) => None,
        });
    let mut attributor = Attributor::new(proc_root, None, pod_logs);
    let inodes = usages.iter().flat_map(|(_, listeners, _)| listeners.iter().map(|l| l.inode)).collect();
    let owners = proc_owner::owners_of_sockets(proc_root, &inodes);
    let mut report = Report { namespaces: Vec::new(), findings: Vec::new() };
    for (inode, listeners, u) in &usages {
        let netns = &names[inode];
        let limit = u64::from(u.settings.ephemeral_ports());
        for d in &u.destinations {
            let subject = format!("{} -> {}", d.source, d.destination);
            report.findings.push(Finding::new(Check::EphemeralPorts, netns, subject, d.used.into(), limit));
        }
        report.findings.push(Finding::new(
            Check::TimeWait,
            netns,
            "TIME-WAIT sockets".into(),
            u.time_wait.into(),
            u.settings.tcp_max_tw_buckets.into(),
        ));
        for l in listeners {
            let owner = owners
                .get(&l.inode)
                .map(|a| describe(&mut attributor, a.tgid, a.comm_str()))
                .unwrap_or_else(|| "owner unknown".into());
            let subject = format!("listener {} ({owner})", std::net::SocketAddr::from((l.address, l.port)));
            report.findings.push(Finding::new(Check::AcceptQueue, netns, subject, l.queued.into(), l.backlog.into()));
        }
        report.namespaces.push(NetnsReport {
            netns: netns.clone(),
            settings: u.settings.clone(),
            time_wait: u.time_wait,
        });
    }
    open_files(scope, proc_root, &names, &mut attributor, &mut report.findings);
    checks::sort(&mut report.findings);
    Ok(report)
}

/// `nginx pid 4711 in shop/web-0` (the pod when there is one).
fn describe(attributor: &mut Attributor, pid: u32, name: &str) -> String {
    match attributor.labels(0, pid) {
        Some(pod) => match (&pod.namespace, &pod.pod_name) {
            (Some(ns), Some(p)) => format!("{name} pid {pid} in {ns}/{p}"),
            _ => format!("{name} pid {pid} in pod {}", pod.pod_uid),
        },
        None => format!("{name} pid {pid}"),
    }
}

/// Each process's open files against its soft RLIMIT_NOFILE, for the
/// processes of the namespaces in scope (or the one pid).
fn open_files(
    scope: &Scope,
    proc_root: &Path,
    names: &BTreeMap<u32, String>,
    attributor: &mut Attributor,
    findings: &mut Vec<Finding>,
) {
    let Ok(processes) = procfs::process::all_processes_with_root(proc_root) else { return };
    for process in processes.flatten() {
        if let Scope::Pid(pid) = scope
            && process.pid as u32 != *pid
        {
            continue;
        }
        let Some(netns) = netns_inode(&proc_root.join(process.pid.to_string()).join("ns/net")) else { continue };
        let Some(name) = names.get(&netns) else { continue };
        let Ok(stat) = process.stat() else { continue };
        // Kernel threads have no files of their own.
        const PF_KTHREAD: u32 = 0x0020_0000;
        if stat.flags & PF_KTHREAD != 0 {
            continue;
        }
        let Some(files) = files::of_process(proc_root, process.pid as u32) else { continue };
        let subject = describe(attributor, process.pid as u32, &stat.comm);
        findings.push(Finding::new(Check::OpenFiles, name, subject, files.open, files.limit));
    }
}
