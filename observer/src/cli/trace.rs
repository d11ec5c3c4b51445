//! `observer trace`: the strace step, for every process at once.
use std::{net::IpAddr, path::PathBuf};

use clap::Args;

use crate::{
    config::MaxSockets,
    probes::AttachMode,
    trace::{Options, event::Kind, filter},
};

/// Print every connect() failure on this node as it happens, one line
/// each: time, pid, executable, pod, destination, errno and its meaning.
/// Like `strace -e trace=connect`, but for every process at once and
/// without ptrace (which slows the traced process down): synchronous
/// failures (EADDRNOTAVAIL: no local port left) and those a non-blocking
/// connect learns later (ECONNREFUSED, ETIMEDOUT) alike. --events adds
/// TIME_WAIT entries, listener overflows, connects and accepts.
///
/// At most --rate lines a second; the events left out are counted in a
/// line each second ("# N events left out"), so a storm stays readable and
/// cheap. Ctrl-C ends it. It loads its own copy of observer's programs:
/// the daemon (`observer run`) needs not run, and pays nothing for it when
/// it does. Needs root, as the daemon.
///
/// Examples: `observer trace --errno EADDRNOTAVAIL`,
/// `observer trace --pod shop/payment-api-7d9f --json`,
/// `observer trace --events connect,time-wait --pid 4242` (one process's
/// connection churn: a new connection per request shows as a connect and
/// a TIME_WAIT each),
/// `kubectl exec -n observer ds/observer -- observer trace --dest 10.0.0.5:27017`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// What to print: connect-error (connect() failed), time-wait (a
    /// socket entered TIME_WAIT, its port held 60 s), overflow (a listener
    /// turned a connection away: accept or SYN queue full), connect
    /// (a SYN sent), accept (accept() returned a connection).
    #[arg(long, value_name = "KIND,...", value_delimiter = ',', value_enum, default_value = "connect-error")]
    pub events: Vec<Kind>,

    /// Only connect errors with these errnos, by name or number (e.g.
    /// EADDRNOTAVAIL,ETIMEDOUT); events of other kinds pass.
    #[arg(long, value_name = "ERRNO,...", value_delimiter = ',', value_parser = filter::parse_errno)]
    pub errno: Vec<u32>,

    /// Only this process.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,

    /// Only the processes of this pod (as kubelet's pod logs name it).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub pod: Option<String>,

    /// Only events whose far end is this address (and port, if given): a
    /// connect's destination, an accepted connection's client, a TIME_WAIT
    /// socket's peer (listener drops have none).
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = filter::parse_dest)]
    pub dest: Option<(IpAddr, Option<u16>)>,

    /// One JSON object per line, for scripts (the counts left out as
    /// {"left_out": N}).
    #[arg(long)]
    pub json: bool,

    /// Lines a second at most (e.g. 200 or 200/s).
    #[arg(long, value_name = "N[/s]", default_value = "200", value_parser = parse_rate)]
    pub rate: u64,

    /// Sockets whose owner the trace remembers (as `observer run
    /// --max-sockets`). Past it the oldest are evicted and their later
    /// events (TIME_WAIT) show pid 0; the trace says how many.
    #[arg(long, value_name = "N", default_value_t = MaxSockets(observer_common::capacity::SOCK_OWNERS))]
    pub max_sockets: MaxSockets,

    /// How to attach (as `observer run --attach-mode`).
    #[arg(long, value_enum, default_value = "auto")]
    pub attach_mode: AttachMode,

    /// The host's /proc [default: /proc].
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// kubelet's pod log directory, to name pods [default: /var/log/pods].
    #[arg(long, value_name = "DIR", default_value = "/var/log/pods")]
    pub pod_logs: PathBuf,
}

fn parse_rate(text: &str) -> Result<u64, String> {
    let n = text.strip_suffix("/s").unwrap_or(text);
    match n.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{text}: a number of lines a second above 0 (e.g. 200 or 200/s)")),
    }
}

impl TraceArgs {
    pub fn options(self) -> Options {
        let mut kinds = self.events;
        kinds.sort_unstable();
        kinds.dedup();
        Options {
            kinds,
            filter: filter::Filter {
                errnos: (!self.errno.is_empty()).then(|| self.errno.into_iter().collect()),
                pid: self.pid,
                pod: self.pod,
                dest: self.dest,
            },
            json: self.json,
            rate: self.rate,
            attach_mode: self.attach_mode,
            max_sockets: self.max_sockets.0,
            proc_root: self.proc_root,
            pod_logs: self.pod_logs,
        }
    }
}
