//! The on-call check list (`observer doctor`): ceilings next to usage, per
//! network namespace, from one reading of the node (`node`): ephemeral
//! ports per destination against the port range, TIME_WAIT sockets against
//! tcp_max_tw_buckets, each listener's accept queue against its backlog,
//! each process's open files against RLIMIT_NOFILE, the ports per
//! destination held by TIME_WAIT of connections closed here (no
//! connection reuse: the cause the others are symptoms of); and the
//! settings that bound them, each with a verdict and the next step.
pub mod checks;
pub mod daemon_view;

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use checks::{Check, Finding};
use daemon_view::DaemonView;
use serde::Serialize;

use crate::{
    attribution::{Attributor, Identity},
    error::Error,
    node::{NetnsUsage, files, netns, owners, settings, sock_diag, sweep},
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
    /// One pod (`namespace/name`): its network namespace (the host's for a
    /// hostNetwork pod), and its processes' open files only.
    Pod(String),
}

#[derive(Serialize)]
pub struct NetnsReport {
    /// As findings name it: "host", "pod NAMESPACE/NAME", or the path.
    pub netns: String,
    /// A path that opens it (for --netns).
    pub path: PathBuf,
    pub settings: settings::NetSettings,
    /// None when the namespace was not dumped: it has fewer than the
    /// warning's share of its ceiling (see its finding).
    pub time_wait: Option<u64>,
}

#[derive(Serialize)]
pub struct Report {
    pub namespaces: Vec<NetnsReport>,
    pub findings: Vec<Finding>,
    /// The daemon's endpoint read for what only it knows, if one was.
    pub daemon: Option<String>,
}

impl Report {
    pub fn worst(&self) -> checks::Verdict {
        self.findings.iter().map(|f| f.verdict).max().unwrap_or(checks::Verdict::Ok)
    }
}

/// Run the check list on `scope`, with what a running daemon knows besides
/// (`daemon`).
pub fn examine(
    scope: &Scope,
    proc_root: &Path,
    pod_logs: PathBuf,
    daemon: Option<&DaemonView>,
) -> Result<Report, Error> {
    let host = netns::host(proc_root);
    // Read once: the namespaces, the listeners' owners and the open files
    // each need every process's.
    let processes = netns::of_processes(proc_root);
    let mut identities =
        Identities { attributor: Attributor::new(proc_root, None, pod_logs.clone()), known: HashMap::new() };
    // The pod's processes, for --pod.
    let pod_pids: Option<Vec<u32>> = match scope {
        Scope::Pod(pod) => {
            let pids = pod_processes(&processes, &mut identities, pod);
            if pids.is_empty() {
                return Err(Error::NoPod { pod: pod.clone(), pod_logs });
            }
            Some(pids)
        }
        _ => None,
    };
    let namespaces: BTreeMap<u32, PathBuf> = match scope {
        Scope::All => netns::all_of(proc_root, &processes),
        Scope::Pod(_) => pod_pids
            .iter()
            .flatten()
            .filter_map(|pid| Some((*processes.get(pid)?, proc_root.join(pid.to_string()).join("ns/net"))))
            .collect(),
        Scope::Netns(path) => {
            let inode = netns::inode(path).ok_or_else(|| Error::NoNetns { path: path.clone() })?;
            [(inode, path.clone())].into()
        }
        Scope::Pid(pid) => {
            let path = proc_root.join(pid.to_string()).join("ns/net");
            let inode = netns::inode(&path).ok_or(Error::NoProcess { pid: *pid })?;
            [(inode, path)].into()
        }
    };
    // A pod's namespace by its pod (any of its processes names it).
    let names: BTreeMap<u32, String> = namespaces
        .iter()
        .map(|(inode, path)| {
            let pod = netns::pid_of(path).and_then(|pid| pod_name(&mut identities, pid));
            let name = match pod {
                _ if Some(*inode) == host => "host".to_string(),
                Some(pod) => format!("pod {pod}"),
                None => path.display().to_string(),
            };
            (*inode, name)
        })
        .collect();
    let paths = namespaces.clone();
    // A namespace whose sockets could not give any destination a warning's
    // share of its ports (held at all, or by TIME_WAIT), nor the TIME_WAIT
    // sockets of a missing connection reuse, is not dumped (a dump walks
    // every socket of the node): its one finding says how many sockets
    // hold ports.
    let share = Check::EphemeralPorts.thresholds().0.min(Check::ConnectionReuse.thresholds().0);
    let usages: Vec<(u32, Vec<sock_diag::Listener>, NetnsUsage)> =
        sweep::once(namespaces, share, checks::REUSE_WARNING_TIME_WAIT);
    let inodes = usages.iter().flat_map(|(_, listeners, _)| listeners.iter().map(|l| (l.inode, l.netns))).collect();
    let owners = owners::owners_among(proc_root, &processes, &inodes);
    let mut report = Report { namespaces: Vec::new(), findings: Vec::new(), daemon: daemon.map(|d| d.url.clone()) };
    // Node-wide: the servers this node's connections meet.
    if matches!(scope, Scope::All) {
        for (server, held) in daemon.iter().flat_map(|d| &d.inferred_limits) {
            report.findings.push(Finding::server_limit(server, *held));
        }
    }
    for (inode, listeners, u) in &usages {
        let netns = &names[inode];
        let limit = u64::from(u.settings.ephemeral_ports());
        let tw_limit = u64::from(u.settings.tcp_max_tw_buckets);
        match &u.counts {
            Some(counts) => {
                for d in &counts.destinations {
                    let subject = format!("{} -> {}", d.source, d.destination);
                    report.findings.push(Finding::new(Check::EphemeralPorts, netns, subject, d.used.into(), limit));
                    if d.time_wait > 0 {
                        let subject = reuse_subject(d, limit, daemon);
                        let (time_wait, open) = (d.time_wait.into(), d.established.into());
                        report.findings.push(Finding::reuse(netns, subject, time_wait, open, limit));
                    }
                }
                let subject = "TIME-WAIT sockets".to_string();
                report.findings.push(Finding::new(Check::TimeWait, netns, subject, counts.time_wait, tw_limit));
            }
            // Too few sockets for a finding: the bounds say so.
            None => {
                let subject = format!("any destination (at most {} sockets hold ports)", u.port_holders);
                report.findings.push(Finding::new(Check::EphemeralPorts, netns, subject, u.port_holders, limit));
                let subject = format!("TIME-WAIT sockets (at most {})", u.minisockets);
                report.findings.push(Finding::new(Check::TimeWait, netns, subject, u.minisockets, tw_limit));
            }
        }
        // Only where the namespace tracks connections at all.
        if let Some(table) = u.conntrack.filter(|t| t.entries > 0) {
            let subject = "conntrack table".to_string();
            report.findings.push(Finding::new(Check::Conntrack, netns, subject, table.entries, table.limit));
        }
        for l in listeners {
            let owner = owners
                .get(&l.inode)
                .map(|a| describe(&mut identities, a.tgid, || a.comm_str().to_string()))
                .unwrap_or_else(|| "owner unknown".into());
            let subject = format!("listener {} ({owner})", std::net::SocketAddr::from((l.address, l.port)));
            report.findings.push(Finding::new(Check::AcceptQueue, netns, subject, l.queued.into(), l.backlog.into()));
        }
        report.namespaces.push(NetnsReport {
            netns: netns.clone(),
            path: paths[inode].clone(),
            settings: u.settings.clone(),
            time_wait: u.counts.as_ref().map(|c| c.time_wait),
        });
    }
    let findings = &mut report.findings;
    open_files(scope, pod_pids.as_deref(), proc_root, &processes, &names, &mut identities, findings);
    checks::sort(&mut report.findings);
    Ok(report)
}

/// `127.0.0.1 -> 127.0.0.1:8080: 200 of 200 ports held by TIME_WAIT of
/// connections closed here (~3/s in the last minute), 0 open`: what the
/// summary line says when missing reuse is the worst; with a daemon's
/// view, `...; half lived under 4 ms; opened by curl (200 processes)`.
fn reuse_subject(d: &crate::node::usage::Destination, ports: u64, daemon: Option<&DaemonView>) -> String {
    let mut subject = format!(
        "{} -> {}: {} of {ports} ports held by TIME_WAIT of connections closed here (~{}/s in the last minute), {} open",
        d.source,
        d.destination,
        d.time_wait,
        u64::from(d.time_wait).div_ceil(checks::TIME_WAIT_SECONDS),
        d.established
    );
    let server = d.destination.to_string();
    if let Some(seconds) = daemon.and_then(|v| v.median_lifetime(&server)) {
        subject +=
            &format!("; half lived under {}", humantime::format_duration(std::time::Duration::from_secs_f64(seconds)));
    }
    if let Some(opener) = daemon.and_then(|v| v.opener(&server)) {
        subject += &format!("; opened by {opener}");
    }
    subject
}

/// Who each process is, learnt once per run: a process is named for its
/// namespace, for its listeners and for its open files (each a read of its
/// cgroup and its executable).
struct Identities {
    attributor: Attributor,
    known: HashMap<u32, Identity>,
}

impl Identities {
    fn of(&mut self, pid: u32) -> &Identity {
        self.known.entry(pid).or_insert_with(|| self.attributor.identity(0, pid))
    }
}

/// `namespace/name` of the pod `pid` runs in, when kubelet's pod logs name
/// it.
fn pod_name(identities: &mut Identities, pid: u32) -> Option<String> {
    let pod = identities.of(pid).pod.as_ref()?;
    Some(format!("{}/{}", pod.namespace.as_ref()?, pod.pod_name.as_ref()?))
}

/// The processes of pod `pod` (`namespace/name`), among `processes`
/// (`netns::of_processes`).
fn pod_processes(processes: &BTreeMap<u32, u32>, identities: &mut Identities, pod: &str) -> Vec<u32> {
    processes.keys().copied().filter(|pid| pod_name(identities, *pid).as_deref() == Some(pod)).collect()
}

/// `nginx pid 4711 in shop/web-0` (the pod when there is one), named by
/// its executable (`comm` if that cannot be read).
fn describe(identities: &mut Identities, pid: u32, comm: impl FnOnce() -> String) -> String {
    let identity = identities.of(pid);
    let name = match &identity.executable {
        Some(executable) => executable.clone(),
        None => comm(),
    };
    match &identity.pod {
        Some(pod) => match (&pod.namespace, &pod.pod_name) {
            (Some(ns), Some(p)) => format!("{name} pid {pid} in {ns}/{p}"),
            _ => format!("{name} pid {pid} in pod {}", pod.pod_uid),
        },
        None => format!("{name} pid {pid}"),
    }
}

/// Each process's open files against its soft RLIMIT_NOFILE, for the
/// processes of the namespaces in scope (`names`; each process's from
/// `netns::of_processes`), or the one pid.
fn open_files(
    scope: &Scope,
    pod_pids: Option<&[u32]>,
    proc_root: &Path,
    of_processes: &BTreeMap<u32, u32>,
    names: &BTreeMap<u32, String>,
    identities: &mut Identities,
    findings: &mut Vec<Finding>,
) {
    let Ok(processes) = procfs::process::all_processes_with_root(proc_root) else { return };
    for process in processes.flatten() {
        if let Scope::Pid(pid) = scope
            && process.pid as u32 != *pid
        {
            continue;
        }
        if let Some(pids) = pod_pids
            && !pids.contains(&(process.pid as u32))
        {
            continue;
        }
        let Some(inode) = of_processes.get(&(process.pid as u32)) else { continue };
        let Some(name) = names.get(inode) else { continue };
        // None for kernel threads too: no files of their own.
        let Some(files) = files::of(&process, proc_root) else { continue };
        let subject = describe(identities, process.pid as u32, || process.stat().map(|s| s.comm).unwrap_or_default());
        findings.push(Finding::new(Check::OpenFiles, name, subject, files.open, files.limit));
    }
}
