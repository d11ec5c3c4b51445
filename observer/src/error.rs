//! Errors observer reports to its user, from `run` and `doctor` alike. Each
//! message names what is wrong and how to fix it; the cause, where there
//! is one, is kept as the error's source and printed after it on the same
//! line (`report`), never as a backtrace.
use std::{net::SocketAddr, path::PathBuf};

pub type Cause = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "missing privileges: observer needs {missing}; run it as root, or grant the capabilities: \
         `sudo setcap {setcap}+ep $(which observer)` (kernels before 5.8 need CAP_SYS_ADMIN instead of \
         CAP_BPF and CAP_PERFMON)"
    )]
    Privileges { missing: String, setcap: String },

    #[error(
        "no kernel BTF at {path}: observer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y \
         (standard on Debian 11+, Ubuntu 20.10+, RHEL 8.2+, recent COS/Bottlerocket/AL2023)"
    )]
    NoBtf { path: PathBuf },

    #[error("kernel BTF {path}")]
    Btf { path: PathBuf, source: Cause },

    #[error("kernel BTF: {0}")]
    BtfLayout(String),

    #[error(
        "tracefs is not mounted at {path} and mounting it failed ({reason}): the tracepoint \
         hooks need it; mount it with `mount -t tracefs nodev /sys/kernel/tracing` (in a \
         container, mount the host's /sys/kernel/tracing into the container)"
    )]
    NoTracefs { path: PathBuf, reason: String },

    #[error("loading the eBPF object failed")]
    Load(#[source] Cause),

    #[error("hook `{hook}` could not be attached in any mode; tried: {tried}")]
    Attach { hook: &'static str, tried: String },

    #[error("attach mode `{mode}` was requested, but hook `{hook}` cannot run in it: {reason}")]
    ModeUnavailable { mode: String, hook: &'static str, reason: String },

    #[error(
        "cannot listen on {addr} (is another observer or exporter already using it? pick another with \
         --prometheus-listen)"
    )]
    Listen { addr: SocketAddr, source: std::io::Error },

    #[error("map {map}")]
    Map { map: &'static str, source: Cause },

    /// The OpenTelemetry pipeline: building an exporter, encoding a scrape.
    #[error("metrics pipeline: {what}")]
    Export { what: String, source: Cause },

    /// What the daemon needs of the system to run at all: its runtime,
    /// its threads, its signal handlers, its endpoint.
    #[error("cannot {what}")]
    System { what: &'static str, source: std::io::Error },

    #[error("the collector thread ended: nothing was being counted any more (a bug: please report it with the log)")]
    CollectorGone,

    #[error("the last collection round did not end within {waited:?} (stuck reading the node?); its counts are lost")]
    CollectorStuck { waited: std::time::Duration },

    #[error("configuration file {path}: {message}")]
    Config { path: PathBuf, message: String },

    #[error("{path}: no such network namespace")]
    NoNetns { path: PathBuf },

    #[error("no process {pid} (or no access to it)")]
    NoProcess { pid: u32 },

    #[error(
        "no process of pod {pod} found (pods are named from kubelet's pod log directories under {pod_logs}: \
         set --pod-logs if they are elsewhere)"
    )]
    NoPod { pod: String, pod_logs: PathBuf },

    #[error("no network namespace could be examined: run as root, or with {needs}")]
    NothingExamined { needs: String },

    #[error("reading observer's endpoint {url}: {why} (is observer running there? leave out --from to go without)")]
    DaemonUnread { url: String, why: String },

    #[error("observer trace cannot show {what} here: {why}")]
    NotTraceable { what: String, why: String },
}

impl Error {
    /// A cause that is only a text (e.g. "not in the object").
    pub fn because(text: impl Into<String>) -> Cause {
        text.into().into()
    }
}

/// An error and its causes on one line: `what: cause: its cause`.
pub fn report(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_keeps_every_cause() {
        let e = Error::Listen {
            addr: "127.0.0.1:9464".parse().unwrap(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let text = report(&e);
        assert!(text.starts_with("cannot listen on 127.0.0.1:9464 (is another observer"), "{text}");
        assert!(text.ends_with(": address in use"), "{text}");
    }
}
