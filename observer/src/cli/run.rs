//! `observer run`: the daemon.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;

use crate::{
    config::{
        FileConfig, Headers, parse_endpoint, parse_grace, parse_headers, parse_interval, parse_max_sockets,
        parse_otlp_interval, parse_otlp_timeout, parse_series_limit,
    },
    daemon::RunConfig,
    error::Error,
    export::{
        Limits,
        otlp::{OtlpConfig, Protocol, TemporalityChoice},
    },
    probes::AttachMode,
};

/// Attach the probes and serve metrics until SIGINT/SIGTERM.
///
/// Example: `observer run --prometheus-listen 0.0.0.0:9464 --interval 10s`,
/// then `curl localhost:9464/metrics | grep observer_tcp_connect_errors_total`
/// shows who fails to connect, to where, with which errno.
///
/// Every setting comes from, in order: its flag, its environment variable,
/// the configuration file (--config; its keys are the flag names, e.g.
/// `interval = "10s"`), the default. `--dry-run` prints the result.
///
/// OTLP push is on when an endpoint is set (--otlp-endpoint or the standard
/// OTEL_EXPORTER_OTLP_ENDPOINT); the Prometheus endpoint always serves.
/// Example: `observer run --otlp-endpoint http://otel-collector:4317
/// --otlp-protocol grpc`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Configuration file (TOML), checked whole at start: an unknown key or
    /// a bad value is an error naming the key and the line.
    #[arg(long, value_name = "FILE", env = "OBSERVER_CONFIG")]
    pub config: Option<PathBuf>,

    /// Check the configuration, print the settings in effect (as a
    /// configuration file) and exit, without loading anything.
    #[arg(long)]
    pub dry_run: bool,

    /// Address of the Prometheus endpoint (/metrics, /healthz, /readyz)
    /// [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR", env = "OBSERVER_PROMETHEUS_LISTEN")]
    pub prometheus_listen: Option<SocketAddr>,

    /// How often the kernel counters are read, e.g. 500ms, 5s, 1m
    /// [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_interval, env = "OBSERVER_INTERVAL")]
    pub interval: Option<Duration>,

    /// How long a process's series stay after it exits, so a scrape after a
    /// short-lived client still sees its counts [default: 2m].
    #[arg(long, value_name = "DURATION", value_parser = parse_grace, env = "OBSERVER_GRACE")]
    pub grace: Option<Duration>,

    /// Force an attach mode for the hooks that have a choice (auto tries
    /// fentry, then kprobe, then tracepoints) [default: auto].
    #[arg(long, value_enum, env = "OBSERVER_ATTACH_MODE")]
    pub attach_mode: Option<AttachMode>,

    /// Processes that get their own series; more are counted as "other"
    /// [default: 200].
    #[arg(long, value_name = "N", value_parser = parse_series_limit, env = "OBSERVER_MAX_PROCESSES")]
    pub max_processes: Option<u32>,

    /// Destinations (address, port) that get their own series; more are
    /// counted as "other" [default: 100].
    #[arg(long, value_name = "N", value_parser = parse_series_limit, env = "OBSERVER_MAX_DESTINATIONS")]
    pub max_destinations: Option<u32>,

    /// Live TCP sockets whose owning process the kernel side remembers, to
    /// charge their TIME_WAIT to it (~100 bytes of kernel memory each);
    /// beyond that the least recently used are forgotten. Raise it when
    /// observer_map_evictions_total{map="SOCK_OWNERS"} grows [default: 65536].
    #[arg(long, value_name = "N", value_parser = parse_max_sockets, env = "OBSERVER_MAX_SOCKETS")]
    pub max_sockets: Option<u32>,

    /// The host's /proc, to find every network namespace (set it when
    /// running in a container with the host's /proc mounted elsewhere)
    /// [default: /proc].
    #[arg(long, value_name = "DIR", env = "OBSERVER_PROC_ROOT")]
    pub proc_root: Option<PathBuf>,

    /// The running kernel's BTF; point it at a BTFHub file on kernels built
    /// without CONFIG_DEBUG_INFO_BTF [default: /sys/kernel/btf/vmlinux].
    #[arg(long, value_name = "FILE", env = "OBSERVER_KERNEL_BTF")]
    pub kernel_btf: Option<PathBuf>,

    /// The cgroup v2 hierarchy, to name the container and pod of each
    /// process (in a container: where the host's is mounted, e.g.
    /// /host/sys/fs/cgroup) [default: the cgroup2 mount in
    /// /proc/self/mountinfo; /sys/fs/cgroup/unified on hybrid hosts].
    #[arg(long, value_name = "DIR", env = "OBSERVER_CGROUP_ROOT")]
    pub cgroup_root: Option<PathBuf>,

    /// kubelet's pod log directory, where pod names and namespaces come
    /// from (`<namespace>_<pod>_<uid>/<container>/`) [default:
    /// /var/log/pods].
    #[arg(long, value_name = "DIR", env = "OBSERVER_POD_LOGS")]
    pub pod_logs: Option<PathBuf>,

    /// Push metrics with OTLP to this collector: its base URL, e.g.
    /// http://otel-collector:4317 (grpc) or http://otel-collector:4318
    /// (http/protobuf, which sends to <URL>/v1/metrics); https uses TLS with
    /// the system's CA certificates [default: no push].
    #[arg(long, value_name = "URL", value_parser = parse_endpoint, env = "OTEL_EXPORTER_OTLP_ENDPOINT",
          help_heading = "OTLP push")]
    pub otlp_endpoint: Option<url::Url>,

    /// OTLP transport [default: http/protobuf].
    #[arg(long, value_enum, ignore_case = true, env = "OTEL_EXPORTER_OTLP_PROTOCOL", help_heading = "OTLP push")]
    pub otlp_protocol: Option<Protocol>,

    /// Headers sent with every push, e.g. for auth:
    /// `authorization=Bearer%20<token>,x-scope-orgid=team-a` (values
    /// percent-encoded). Never logged; --dry-run hides the values.
    #[arg(long, value_name = "KEY=VALUE,...", value_parser = parse_headers, env = "OTEL_EXPORTER_OTLP_HEADERS",
          help_heading = "OTLP push")]
    pub otlp_headers: Option<Headers>,

    /// How long one push may take; a bare number is milliseconds
    /// [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_otlp_timeout, env = "OTEL_EXPORTER_OTLP_TIMEOUT",
          help_heading = "OTLP push")]
    pub otlp_timeout: Option<Duration>,

    /// How often to push; a bare number is milliseconds [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_otlp_interval, env = "OTEL_METRIC_EXPORT_INTERVAL",
          help_heading = "OTLP push")]
    pub otlp_interval: Option<Duration>,

    /// cumulative: every push carries the totals (a lost push is made good
    /// by the next); delta: each push carries the increase since the last
    /// one sent (unsent ones are kept, up to 30) [default: cumulative].
    #[arg(
        long,
        value_enum,
        ignore_case = true,
        env = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
        help_heading = "OTLP push"
    )]
    pub otlp_temporality: Option<TemporalityChoice>,

    /// A CA certificate (PEM) to trust for an https endpoint, besides the
    /// system's CA certificates (e.g. the collector's private CA).
    #[arg(long, value_name = "FILE", env = "OTEL_EXPORTER_OTLP_CERTIFICATE", help_heading = "OTLP push")]
    pub otlp_certificate: Option<PathBuf>,
}

impl RunArgs {
    /// The settings in effect: flag or environment (clap has already
    /// preferred the flag), else the file, else the default.
    pub fn into_config(self) -> Result<RunConfig, Error> {
        let file = match &self.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let default = RunConfig::default();
        Ok(RunConfig {
            prometheus_listen: self.prometheus_listen.or(file.prometheus_listen).unwrap_or(default.prometheus_listen),
            interval: self.interval.or(file.interval).unwrap_or(default.interval),
            grace: self.grace.or(file.grace).unwrap_or(default.grace),
            attach_mode: self.attach_mode.or(file.attach_mode).unwrap_or(default.attach_mode),
            limits: Limits {
                max_processes: self
                    .max_processes
                    .or(file.max_processes)
                    .map_or(default.limits.max_processes, |n| n as usize),
                max_destinations: self
                    .max_destinations
                    .or(file.max_destinations)
                    .map_or(default.limits.max_destinations, |n| n as usize),
            },
            max_sockets: self.max_sockets.or(file.max_sockets).unwrap_or(default.max_sockets),
            proc_root: self.proc_root.or(file.proc_root).unwrap_or(default.proc_root),
            kernel_btf: self.kernel_btf.or(file.kernel_btf).unwrap_or(default.kernel_btf),
            cgroup_root: self.cgroup_root.or(file.cgroup_root),
            pod_logs: self.pod_logs.or(file.pod_logs).unwrap_or(default.pod_logs),
            otlp: self.otlp_endpoint.or(file.otlp_endpoint).map(|endpoint| OtlpConfig {
                endpoint,
                protocol: self.otlp_protocol.or(file.otlp_protocol).unwrap_or(Protocol::HttpProtobuf),
                headers: self.otlp_headers.or(file.otlp_headers).unwrap_or_default().0,
                timeout: self.otlp_timeout.or(file.otlp_timeout).unwrap_or(Duration::from_secs(10)),
                interval: self.otlp_interval.or(file.otlp_interval).unwrap_or(Duration::from_secs(60)),
                temporality: self.otlp_temporality.or(file.otlp_temporality).unwrap_or(TemporalityChoice::Cumulative),
                certificate: self.otlp_certificate.or(file.otlp_certificate),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<RunArgs, String> {
        let mut argv = vec!["observer", "run"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv) {
            Ok(Cli { command: Command::Run(a) }) => Ok(*a),
            Ok(other) => Err(format!("not `run`: {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let c = parse(&[]).unwrap().into_config().unwrap();
        assert_eq!(c.prometheus_listen, "127.0.0.1:9464".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.attach_mode, AttachMode::Auto);
    }

    #[test]
    fn durations_parse_and_are_bounded() {
        assert_eq!(parse(&["--interval", "500ms"]).unwrap().interval, Some(Duration::from_millis(500)));
        let e = parse(&["--interval", "five"]).unwrap_err();
        assert!(e.contains("not a duration"), "{e}");
        let e = parse(&["--interval", "1ms"]).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn bad_address_and_mode_are_rejected() {
        let e = parse(&["--prometheus-listen", "localhost"]).unwrap_err();
        assert!(e.contains("--prometheus-listen"), "{e}");
        let e = parse(&["--attach-mode", "uprobe"]).unwrap_err();
        assert!(e.contains("possible values"), "{e}");
    }
}
