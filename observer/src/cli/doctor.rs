//! `observer doctor`: the on-call check list, on demand, without the daemon.
use std::path::PathBuf;

use clap::Args;

use crate::{
    ceilings::{
        Report, Scope,
        checks::{Check, Verdict},
        daemon_view::DaemonView,
        examine,
    },
    error::Error,
    probes::privileges,
    top::endpoint::Endpoint,
};

/// Check this node's connection ceilings now: ephemeral ports per
/// destination, TIME_WAIT sockets, accept queues, open files, conntrack
/// tables, and the ports toward a destination held by TIME_WAIT of
/// connections closed here (no connection reuse: named as the cause when
/// it is the worst); worst first, each with its verdict and the next step.
///
/// Exit code: 0 all ok, 1 a warning, 2 a critical finding, 3 the checks
/// could not run, 64 a command line it cannot use. Needs root (it enters
/// every network namespace and reads every process's file descriptors).
/// The daemon is not needed; where one runs (or at --from), what only it
/// knows is added: the servers whose connection limit it inferred, who
/// opens the connections not reused and how long they live.
///
/// Examples: `observer doctor --pid $(pidof payment-api)`,
/// `observer doctor --pod shop/payment-api-7d9f`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Only this network namespace (e.g. /run/netns/NAME or
    /// /proc/PID/ns/net) [default: every namespace of the host].
    #[arg(long, value_name = "PATH", conflicts_with = "pid")]
    pub netns: Option<PathBuf>,

    /// Only this process: its network namespace, and its own open files.
    #[arg(long, value_name = "PID", conflicts_with = "pod")]
    pub pid: Option<u32>,

    /// Only this pod (as kubelet's pod logs name it): its network
    /// namespace, and its processes' open files.
    #[arg(long, value_name = "NAMESPACE/NAME", conflicts_with = "netns", value_parser = pod_name)]
    pub pod: Option<String>,

    /// Machine-readable output: every finding and each namespace's settings.
    #[arg(long)]
    pub json: bool,

    /// List every finding, the ok ones included (default: the warnings and
    /// critical ones, and the 5 closest to their limit otherwise).
    #[arg(long)]
    pub all: bool,

    /// Also print each namespace's settings (port range, tcp_fin_timeout,
    /// tcp_tw_reuse, somaxconn, tcp_max_syn_backlog, tcp_max_tw_buckets).
    #[arg(long, short)]
    pub verbose: bool,

    /// The host's /proc [default: /proc].
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// kubelet's pod log directory, to name pods [default: /var/log/pods].
    #[arg(long, value_name = "DIR", default_value = "/var/log/pods")]
    pub pod_logs: PathBuf,

    /// A running observer's endpoint (its --prometheus-listen address),
    /// read for what only the daemon knows: the servers whose connection
    /// limit it inferred, and who opens the connections not reused and how
    /// long they live. An error when it cannot be read. Without it: the
    /// local daemon at http://127.0.0.1:9464 when it answers, else none.
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
}

impl DoctorArgs {
    /// Print the report; the worst verdict (or an error text).
    pub fn run(self) -> Result<Verdict, Error> {
        let scope = match (&self.netns, self.pid, &self.pod) {
            (Some(path), _, _) => Scope::Netns(path.clone()),
            (None, Some(pid), _) => Scope::Pid(pid),
            (None, None, Some(pod)) => Scope::Pod(pod.clone()),
            (None, None, None) => Scope::All,
        };
        let daemon = daemon_view(self.from.as_deref())?;
        let report = examine(&scope, &self.proc_root, self.pod_logs.clone(), daemon.as_ref())?;
        if report.namespaces.is_empty() {
            let needs: Vec<_> = privileges::CAPABILITIES
                .iter()
                .filter(|n| matches!(n.capability, caps::Capability::CAP_SYS_ADMIN | caps::Capability::CAP_NET_ADMIN))
                .collect();
            return Err(Error::NothingExamined { needs: privileges::describe(&needs) });
        }
        let text = if self.json {
            serde_json::to_string_pretty(&report).expect("a report is plain data") + "\n"
        } else {
            summary(&report) + &table(&report, self.all, self.verbose)
        };
        // A closed pipe (`| head`) is not an error worth a panic.
        let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
        Ok(report.worst())
    }
}

/// The daemon's view: at `from` (an error if it cannot be read), else the
/// local daemon's if one answers.
fn daemon_view(from: Option<&str>) -> Result<Option<DaemonView>, Error> {
    let url = from.map_or_else(crate::top::endpoint::default_url, str::to_string);
    let read = || {
        let endpoint = Endpoint::new(&url)?;
        DaemonView::parse(endpoint.url(), &endpoint.page()?)
    };
    match (read(), from) {
        (Ok(view), _) => Ok(Some(view)),
        (Err(why), Some(_)) => Err(Error::DaemonUnread { url, why }),
        (Err(_), None) => Ok(None),
    }
}

/// One line first, like `ss -s`: how much was examined, how bad, the worst.
fn summary(report: &Report) -> String {
    let count = |v: Verdict| report.findings.iter().filter(|f| f.verdict == v).count();
    let (critical, warnings) = (count(Verdict::Critical), count(Verdict::Warning));
    let namespaces = report.namespaces.len();
    let mut line = format!(
        "{namespaces} network namespace{}, {} findings: ",
        if namespaces == 1 { "" } else { "s" },
        report.findings.len()
    );
    line += &match (critical, warnings) {
        (0, 0) => "all ok".to_string(),
        (c, w) => format!("{c} critical, {w} warning{}", if w == 1 { "" } else { "s" }),
    };
    // Findings are sorted worst first.
    // A cause sorts before its symptoms: said as one.
    match report.findings.first() {
        Some(f) if f.check == Check::ConnectionReuse && f.verdict != Verdict::Ok => {
            line += &format!("; cause: no connection reuse {} in {}", f.subject, f.netns);
        }
        Some(f) if f.check.is_cause() && f.verdict != Verdict::Ok => line += &format!("; cause: {}", f.subject),
        Some(f) => {
            let label = if f.verdict == Verdict::Ok { "closest to its limit" } else { "worst" };
            line += &format!("; {label}: {} {} in {}, {}", f.check.as_str(), f.subject, f.netns, used_of_limit(f));
        }
        None => {}
    }
    line + "\n"
}

/// `10/10 (100%)`.
fn used_of_limit(f: &crate::ceilings::checks::Finding) -> String {
    let pct = if f.limit == 0 { "-".to_string() } else { format!("{:.0}%", 100.0 * f.used as f64 / f.limit as f64) };
    format!("{}/{} ({pct})", f.used, f.limit)
}

fn table(report: &Report, all: bool, verbose: bool) -> String {
    let mut out = String::new();
    for ns in report.namespaces.iter().filter(|_| verbose) {
        let s = &ns.settings;
        out += &format!(
            "netns {}: ip_local_port_range {}-{} ({} ports), tcp_fin_timeout {}, tcp_tw_reuse {}, somaxconn {}, \
             tcp_max_syn_backlog {}, tcp_max_tw_buckets {}\n",
            ns.netns,
            s.ip_local_port_range.0,
            s.ip_local_port_range.1,
            s.ephemeral_ports(),
            s.tcp_fin_timeout,
            s.tcp_tw_reuse,
            s.somaxconn,
            s.tcp_max_syn_backlog,
            s.tcp_max_tw_buckets
        );
    }
    let bad = report.findings.iter().filter(|f| f.verdict != Verdict::Ok).count();
    let shown: Vec<_> =
        if all { report.findings.iter().collect() } else { report.findings.iter().take(bad + 5).collect() };
    let rows: Vec<[String; 6]> = shown
        .iter()
        .map(|f| {
            [
                f.verdict.as_str().to_uppercase(),
                f.check.as_str().to_string(),
                f.netns.clone(),
                f.subject.clone(),
                used_of_limit(f),
                f.next_step.to_string(),
            ]
        })
        .collect();
    let header = ["VERDICT", "CHECK", "NETNS", "WHAT", "USED/LIMIT", "NEXT STEP"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    out.push('\n');
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| if i == 5 { c.clone() } else { format!("{c:w$}") })
            .collect();
        out += cells.join("  ").trim_end();
        out.push('\n');
    }
    let hidden = report.findings.len() - shown.len();
    if hidden > 0 {
        out += &format!("... and {hidden} more, all ok (--all lists them)\n");
    }
    out
}

/// `--pod`: `namespace/name`, both non-empty.
fn pod_name(value: &str) -> Result<String, String> {
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok(value.to_string()),
        _ => Err(format!("`{value}` is not NAMESPACE/NAME (e.g. shop/payment-api-7d9f)")),
    }
}
