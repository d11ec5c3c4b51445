//! The on-call check list as verdicts: each ceiling, its usage, ok /
//! warning / critical, and the concrete next step.
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warning,
    Critical,
}

impl Verdict {
    /// At or above `critical` of the limit: critical; `warning`: warning.
    pub fn of(used: u64, limit: u64, warning: f64, critical: f64) -> Self {
        if limit == 0 {
            return if used > 0 { Verdict::Critical } else { Verdict::Ok };
        }
        let ratio = used as f64 / limit as f64;
        if ratio >= critical {
            Verdict::Critical
        } else if ratio >= warning {
            Verdict::Warning
        } else {
            Verdict::Ok
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warning => "warning",
            Verdict::Critical => "critical",
        }
    }

    /// The exit code of `observer doctor`.
    pub fn exit_code(self) -> u8 {
        self as u8
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    EphemeralPorts,
    TimeWait,
    AcceptQueue,
    OpenFiles,
    Conntrack,
    ConnectionReuse,
    /// A server's connection limit the daemon inferred (doctor `--from`).
    ServerLimit,
}

/// The share of the ports one destination can use held by TIME_WAIT of
/// connections this side closed, at which doctor says the missing reuse
/// is what uses them up (warning), and at which it is what runs them out
/// (critical): the mixin's `connectionReuseTimeWaitShare` is the first.
/// Relative to the port range, so that it names the cause at any range
/// and any rate: 200 ports held by 3 closes a second are exhausted as
/// surely as 28,000 by 470.
pub const REUSE_WARNING_SHARE: f64 = 0.5;
pub const REUSE_CRITICAL_SHARE: f64 = 0.8;

/// New connections per second toward one destination, each closed first by
/// this side within the minute, at which doctor says "no connection reuse"
/// whatever the ports (a wide range is far from running out, but each one
/// costs a handshake and a TIME_WAIT entry): the rate of the mixin's
/// ObserverConnectionReuseMissing (`connectionChurnWarningPerSecond`).
pub const REUSE_WARNING_PER_SECOND: u64 = 50;

/// How long a connection closed first stays in TIME_WAIT (TCP_TIMEWAIT_LEN,
/// fixed in the kernel): TIME_WAIT sockets toward a destination are the
/// connections this side closed in the last minute.
pub const TIME_WAIT_SECONDS: u64 = 60;

/// TIME_WAIT sockets toward one destination at which doctor warns, if more
/// than the connections open toward it (a large pool that recycles its
/// connections closes many and still reuses them).
pub const REUSE_WARNING_TIME_WAIT: u64 = REUSE_WARNING_PER_SECOND * TIME_WAIT_SECONDS;

impl Check {
    pub fn as_str(self) -> &'static str {
        match self {
            Check::EphemeralPorts => "ephemeral-ports",
            Check::TimeWait => "time-wait",
            Check::AcceptQueue => "accept-queue",
            Check::OpenFiles => "open-files",
            Check::Conntrack => "conntrack",
            Check::ConnectionReuse => "connection-reuse",
            Check::ServerLimit => "server-limit",
        }
    }

    /// (warning, critical) fractions of the limit.
    pub fn thresholds(self) -> (f64, f64) {
        match self {
            Check::EphemeralPorts | Check::TimeWait | Check::OpenFiles | Check::Conntrack => (0.7, 0.9),
            // A full queue drops connections; half full means it is not drained.
            Check::AcceptQueue => (0.5, 0.9),
            // Of the ports one destination can use (`Finding::reuse` also
            // warns at a rate, whatever the ports).
            Check::ConnectionReuse => (REUSE_WARNING_SHARE, REUSE_CRITICAL_SHARE),
            // Reached by definition (see `Finding::server_limit`).
            Check::ServerLimit => (1.0, f64::INFINITY),
        }
    }

    /// Whether a finding of this check names a cause that other checks
    /// show the symptoms of: at the same verdict, it comes first (the
    /// ports run out *because* nothing reuses them).
    pub fn is_cause(self) -> bool {
        matches!(self, Check::ConnectionReuse | Check::ServerLimit)
    }

    pub fn next_step(self, verdict: Verdict) -> &'static str {
        if verdict == Verdict::Ok {
            return "-";
        }
        match self {
            Check::EphemeralPorts => {
                "reuse connections (keep-alive, a bounded pool) and back off retries; widen \
                 net.ipv4.ip_local_port_range; net.ipv4.tcp_tw_reuse=1 for TIME-WAIT ports"
            }
            Check::TimeWait => {
                "find who closes first (`ss -tan state time-wait`) and reuse its connections; \
                 raise net.ipv4.tcp_max_tw_buckets only if the ports allow"
            }
            Check::AcceptQueue => {
                "the owner does not accept fast enough: check its CPU and accept loop; raise its \
                 listen() backlog together with net.core.somaxconn"
            }
            Check::OpenFiles => "raise the process's RLIMIT_NOFILE (LimitNOFILE=, ulimit -n) or find its fd leak",
            Check::Conntrack => {
                "find who opens so many connections and reuse them; raise net.netfilter.nf_conntrack_max on \
                 the host (~300 bytes of kernel memory per entry) or shorten nf_conntrack_tcp_timeout_time_wait"
            }
            Check::ConnectionReuse => {
                "no connection reuse toward it: this side opens and closes a connection per request; keep \
                 them alive (a connection pool big enough, HTTP keep-alive or HTTP/2) and bound retries"
            }
            Check::ServerLimit => {
                "find the server's limit (max_connections, maxIncomingConnections, maxclients) and who holds its \
                 connections; bound the clients' pools under it, then declare it with --connection-limits"
            }
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub verdict: Verdict,
    pub check: Check,
    /// The namespace, as a path that opens it (or "host").
    pub netns: String,
    /// What the ceiling is about: a destination, a listener, a process.
    pub subject: String,
    pub used: u64,
    pub limit: u64,
    pub next_step: &'static str,
}

impl Finding {
    pub fn new(check: Check, netns: &str, subject: String, used: u64, limit: u64) -> Self {
        let (warning, critical) = check.thresholds();
        let verdict = Verdict::of(used, limit, warning, critical);
        Self { verdict, check, netns: netns.to_string(), subject, used, limit, next_step: check.next_step(verdict) }
    }

    /// Connection reuse toward one destination: its TIME_WAIT sockets (the
    /// connections this side closed within the minute) against the ports
    /// it can use; also a warning at `REUSE_WARNING_TIME_WAIT` of them when
    /// they outnumber the connections open toward it, however wide the
    /// range.
    pub fn reuse(netns: &str, subject: String, time_wait: u64, open: u64, ports: u64) -> Self {
        let mut finding = Self::new(Check::ConnectionReuse, netns, subject, time_wait, ports);
        if finding.verdict == Verdict::Ok && time_wait >= REUSE_WARNING_TIME_WAIT && time_wait > open {
            finding.verdict = Verdict::Warning;
            finding.next_step = Check::ConnectionReuse.next_step(Verdict::Warning);
        }
        finding
    }

    /// A server that turns new connections away above `held` open, as the
    /// daemon inferred: a warning (the clients' errors are its symptoms).
    pub fn server_limit(server: &str, held: u64) -> Self {
        let subject = format!("{server} closes new connections at once above ~{held} open: a server-side limit");
        let mut finding = Self::new(Check::ServerLimit, "node", subject, held, held);
        finding.verdict = Verdict::Warning;
        finding.next_step = Check::ServerLimit.next_step(Verdict::Warning);
        finding
    }

    fn ratio(&self) -> f64 {
        if self.limit == 0 { f64::INFINITY } else { self.used as f64 / self.limit as f64 }
    }
}

/// Worst first: verdict, then a cause before its symptoms, then how close
/// to the limit.
pub fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.verdict
            .cmp(&a.verdict)
            .then(b.check.is_cause().cmp(&a.check.is_cause()))
            .then(b.ratio().total_cmp(&a.ratio()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_by_fraction_of_the_limit() {
        assert_eq!(Verdict::of(10, 10, 0.7, 0.9), Verdict::Critical);
        assert_eq!(Verdict::of(8, 10, 0.7, 0.9), Verdict::Warning);
        assert_eq!(Verdict::of(6, 10, 0.7, 0.9), Verdict::Ok);
        assert_eq!(Verdict::of(1, 0, 0.7, 0.9), Verdict::Critical);
        assert_eq!(Verdict::of(0, 0, 0.7, 0.9), Verdict::Ok);
        assert_eq!([Verdict::Ok, Verdict::Warning, Verdict::Critical].map(Verdict::exit_code), [0, 1, 2]);
    }

    #[test]
    fn worst_first() {
        let mut f = vec![
            Finding::new(Check::OpenFiles, "host", "a".into(), 1, 10),
            Finding::new(Check::EphemeralPorts, "host", "b".into(), 10, 10),
            Finding::new(Check::AcceptQueue, "host", "c".into(), 3, 5),
            Finding::new(Check::TimeWait, "host", "d".into(), 8, 10),
        ];
        sort(&mut f);
        let order: Vec<&str> = f.iter().map(|f| f.subject.as_str()).collect();
        assert_eq!(order, ["b", "d", "c", "a"]);
        assert_eq!(f[0].next_step, Check::EphemeralPorts.next_step(Verdict::Critical));
        assert_eq!(f[3].next_step, "-");
    }

    #[test]
    fn missing_reuse_is_judged_against_the_ports_and_named_before_the_ports_it_exhausts() {
        let reuse = |time_wait, open, ports| Finding::reuse("host", "d".into(), time_wait, open, ports).verdict;
        // 200 ports, 3 closes a second: the whole range in TIME_WAIT.
        assert_eq!(reuse(200, 0, 200), Verdict::Critical);
        assert_eq!(reuse(100, 0, 200), Verdict::Warning);
        // A pool holding most ports open, closing a few old ones.
        assert_eq!(reuse(20, 150, 200), Verdict::Ok);
        // The default range: 50 closes a second warn, unless a larger pool
        // stays open beside them.
        assert_eq!(reuse(3200, 0, 28232), Verdict::Warning);
        assert_eq!(reuse(3200, 4000, 28232), Verdict::Ok);
        assert_eq!(reuse(2000, 0, 28232), Verdict::Ok);

        let mut f = vec![
            Finding::new(Check::EphemeralPorts, "host", "ports".into(), 200, 200),
            Finding::reuse("host", "reuse".into(), 200, 0, 200),
        ];
        sort(&mut f);
        assert_eq!(f[0].check, Check::ConnectionReuse, "the cause first");
    }
}
