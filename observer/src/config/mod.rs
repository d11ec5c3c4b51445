//! Every setting of `observer run`, defined once (`settings!` below): its
//! flag and environment variable (clap), its key in the configuration file
//! (serde; the flag's name without the dashes), its help, its default.
//!
//! A setting comes from, in order: the flag, its environment variable
//! (clap has already preferred the flag), the configuration file, the
//! default (`Settings::load`). The file is checked whole at start: an
//! unknown key, a value of the wrong type or out of range is one error
//! naming the key, the file and the line. `--dry-run` prints the merged
//! settings as a configuration file (`Settings::to_toml`).
mod run_config;
mod values;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

pub use run_config::RunConfig;
use serde::{Deserialize, Serialize};
pub use values::*;

use crate::{
    error::Error,
    export::otlp::{OtlpConfig, Protocol, TemporalityChoice},
    probes::AttachMode,
    series::Limits,
};

/// A setting's default: a value, or none (then a note says what being
/// unset means).
pub enum Preset<T> {
    Value(T),
    Unset(&'static str),
}

/// Declares `Settings` (every field optional, so each source may leave it
/// out) and, from the same list, its defaults and its merge.
macro_rules! settings {
    ($( $(#[$attr:meta])* $field:ident : $ty:ty = $default:expr ),* $(,)?) => {
        #[derive(Clone, Debug, PartialEq, clap::Args, Deserialize, Serialize)]
        #[serde(deny_unknown_fields, rename_all = "kebab-case")]
        pub struct Settings {
            $( $(#[$attr])* #[serde(default, skip_serializing_if = "Option::is_none")] pub $field: Option<$ty>, )*
        }

        impl Settings {
            /// Nothing set.
            pub fn empty() -> Self {
                Self { $( $field: None, )* }
            }

            /// Each setting from `self`, else from `other`.
            pub fn or(self, other: Self) -> Self {
                Self { $( $field: self.$field.or(other.$field), )* }
            }

            /// The defaults.
            pub fn defaults() -> Self {
                Self { $( $field: match $default { Preset::Value(v) => Some(v), Preset::Unset(_) => None }, )* }
            }

            /// The settings without a default, by key, with what their
            /// absence means.
            fn unset_notes() -> Vec<(String, &'static str)> {
                let mut notes = Vec::new();
                $( if let Preset::<$ty>::Unset(note) = $default { notes.push((stringify!($field).replace('_', "-"), note)); } )*
                notes
            }
        }
    };
}

settings! {
    /// Address of the Prometheus endpoint (/metrics, /healthz, /readyz).
    #[arg(long, value_name = "ADDR", env = "OBSERVER_PROMETHEUS_LISTEN")]
    prometheus_listen: SocketAddr = Preset::Value(SocketAddr::from(([127, 0, 0, 1], 9464))),

    /// How often the kernel counters are read, e.g. 500ms, 5s, 1m.
    #[arg(long, value_name = "DURATION", env = "OBSERVER_INTERVAL")]
    interval: Interval = Preset::Value(Interval(Duration::from_secs(5))),

    /// How long a process's series stay after it exits, so a scrape after a
    /// short-lived client still sees its counts.
    #[arg(long, value_name = "DURATION", env = "OBSERVER_GRACE")]
    grace: Grace = Preset::Value(Grace(Duration::from_secs(120))),

    /// Force an attach mode for the hooks that have a choice (auto tries
    /// fentry, then kprobe, then tracepoints).
    #[arg(long, value_enum, env = "OBSERVER_ATTACH_MODE")]
    attach_mode: AttachMode = Preset::Value(AttachMode::Auto),

    /// Processes that get their own series; more are counted together in
    /// one series without process labels, otel_metric_overflow="true".
    #[arg(long, value_name = "N", env = "OBSERVER_MAX_PROCESSES")]
    max_processes: SeriesLimit = Preset::Value(SeriesLimit(Limits::DEFAULT.max_processes as u32)),

    /// Destinations (address, port) that get their own series; more are
    /// counted without one, otel_metric_overflow="true". One process
    /// takes at most a quarter of them (a scanner leaves the rest to the
    /// others); one that counts nothing for --grace frees its place; an
    /// EADDRNOTAVAIL keeps its destination in a reserve of a quarter more.
    #[arg(long, value_name = "N", env = "OBSERVER_MAX_DESTINATIONS")]
    max_destinations: SeriesLimit = Preset::Value(SeriesLimit(Limits::DEFAULT.max_destinations as u32)),

    /// Listeners of one network namespace whose accept queues get series
    /// of their own, the fullest first; the rest of the namespace's are
    /// summed in one series marked otel_metric_overflow="true".
    #[arg(long, value_name = "N", env = "OBSERVER_MAX_LISTENERS")]
    max_listeners: SeriesLimit = Preset::Value(SeriesLimit(Limits::DEFAULT.max_listeners as u32)),

    /// Series each counter may have (e.g. connect errors by process, errno
    /// and destination); beyond it, new ones are counted in one series
    /// per errno marked otel_metric_overflow="true", and
    /// observer_series_folded_total says how often. Each costs ~300 bytes
    /// and one line per scrape.
    #[arg(long, value_name = "N", env = "OBSERVER_MAX_SERIES")]
    max_series: MaxSeries = Preset::Value(MaxSeries(Limits::DEFAULT.max_series as u32)),

    /// Closing TCP sockets whose closer the kernel side remembers (from the
    /// first FIN to the CLOSE, to charge their TIME_WAIT to it), and
    /// established connections it follows (observer_tcp_connection_usage):
    /// ~250 bytes of kernel memory each. Beyond it the least recently used
    /// closers are forgotten and new connections are left out. Raise it when SOCK_OWNERS evictions
    /// (observer_map_evictions_total) or OPEN_CONNECTIONS lost updates
    /// (observer_kernel_lost_updates_total) grow.
    #[arg(long, value_name = "N", env = "OBSERVER_MAX_SOCKETS")]
    max_sockets: MaxSockets = Preset::Value(MaxSockets(observer_common::capacity::SOCK_OWNERS)),

    /// Network namespaces (pods, the host, `ip netns`) that are read; more
    /// are left out, and observer_network_namespace_usage{observer_reading="unread"} says how
    /// many. Each holds 15 file descriptors of observer's open.
    #[arg(long, value_name = "N", env = "OBSERVER_MAX_NAMESPACES")]
    max_namespaces: MaxNamespaces = Preset::Value(MaxNamespaces(1024)),

    /// The host's /proc, to find every network namespace (set it when
    /// running in a container with the host's /proc mounted elsewhere).
    #[arg(long, value_name = "DIR", env = "OBSERVER_PROC_ROOT")]
    proc_root: PathBuf = Preset::Value(PathBuf::from("/proc")),

    /// The running kernel's BTF; point it at a BTFHub file on kernels built
    /// without CONFIG_DEBUG_INFO_BTF.
    #[arg(long, value_name = "FILE", env = "OBSERVER_KERNEL_BTF")]
    kernel_btf: PathBuf = Preset::Value(PathBuf::from(crate::probes::offsets::VMLINUX_BTF)),

    /// The cgroup v2 hierarchy, to name the container and pod of each
    /// process (in a container: where the host's /sys/fs/cgroup is mounted,
    /// e.g. /host/sys/fs/cgroup; on hybrid hosts its unified/ is taken).
    #[arg(long, value_name = "DIR", env = "OBSERVER_CGROUP_ROOT")]
    cgroup_root: PathBuf = Preset::Unset(
        "the cgroup2 mount in /proc/self/mountinfo (/sys/fs/cgroup/unified on hybrid hosts)",
    ),

    /// kubelet's pod log directory, where pod names and namespaces come
    /// from (`<namespace>_<pod>_<uid>/<container>/`).
    #[arg(long, value_name = "DIR", env = "OBSERVER_POD_LOGS")]
    pod_logs: PathBuf = Preset::Value(PathBuf::from("/var/log/pods")),

    /// Connection limits you know and observer cannot see, exported as
    /// observer_tcp_connection_limit next to the connections held
    /// (ObserverConnectionsNearDeclaredLimit warns at 80%): ADDR:PORT=N for
    /// a server, counted over every client on every node (a database's max
    /// connections: 10.0.0.5:27017=10000), *:PORT=N for this node's
    /// listeners on a port (*:6379=10000); comma-separated.
    #[arg(long, value_name = "ADDR:PORT=N,...", env = "OBSERVER_CONNECTION_LIMITS")]
    connection_limits: ConnectionLimits = Preset::Unset("no declared limits"),

    /// Push metrics with OTLP to this collector: its base URL, e.g.
    /// http://otel-collector:4317 (grpc) or http://otel-collector:4318
    /// (http/protobuf, which sends to <URL>/v1/metrics); https uses TLS with
    /// the system's CA certificates.
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT", help_heading = "OTLP push")]
    otlp_endpoint: Endpoint = Preset::Unset("no OTLP push"),

    /// OTLP transport.
    #[arg(long, value_enum, ignore_case = true, env = "OTEL_EXPORTER_OTLP_PROTOCOL", help_heading = "OTLP push")]
    otlp_protocol: Protocol = Preset::Value(Protocol::HttpProtobuf),

    /// Headers sent with every push, e.g. for auth:
    /// `authorization=Bearer%20<token>,x-scope-orgid=team-a` (values
    /// percent-encoded). Never logged; --dry-run hides the values.
    #[arg(long, value_name = "KEY=VALUE,...", env = "OTEL_EXPORTER_OTLP_HEADERS", hide_env_values = true,
          help_heading = "OTLP push")]
    otlp_headers: Headers = Preset::Unset("no headers"),

    /// How long one push may take; a bare number is milliseconds.
    #[arg(long, value_name = "DURATION", env = "OTEL_EXPORTER_OTLP_TIMEOUT", help_heading = "OTLP push")]
    otlp_timeout: OtlpTimeout = Preset::Value(OtlpTimeout(Duration::from_secs(10))),

    /// How often to push; a bare number is milliseconds.
    #[arg(long, value_name = "DURATION", env = "OTEL_METRIC_EXPORT_INTERVAL", help_heading = "OTLP push")]
    otlp_interval: OtlpInterval = Preset::Value(OtlpInterval(Duration::from_secs(60))),

    /// cumulative: every push carries the totals (a lost push is made good
    /// by the next); delta: each push carries the increase since the last
    /// one sent (unsent ones are kept, up to 30).
    #[arg(long, value_enum, ignore_case = true, env = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
          help_heading = "OTLP push")]
    otlp_temporality: TemporalityChoice = Preset::Value(TemporalityChoice::Cumulative),

    /// A CA certificate (PEM) to trust for an https endpoint, besides the
    /// system's CA certificates (e.g. the collector's private CA).
    #[arg(long, value_name = "FILE", env = "OTEL_EXPORTER_OTLP_CERTIFICATE", help_heading = "OTLP push")]
    otlp_certificate: PathBuf = Preset::Unset("only the system's CA certificates"),
}

impl Settings {
    /// The settings in effect: `flags` (flag, else environment), else the
    /// file at `file`, else the default. Without an OTLP endpoint the OTLP
    /// settings mean nothing and are left out.
    pub fn load(flags: Settings, file: Option<&std::path::Path>) -> Result<Self, Error> {
        let from_file = match file {
            Some(path) => Self::from_file(path)?,
            None => Self::empty(),
        };
        let mut merged = flags.or(from_file).or(Self::defaults());
        if merged.otlp_endpoint.is_none() {
            let Self {
                otlp_protocol,
                otlp_headers,
                otlp_timeout,
                otlp_interval,
                otlp_temporality,
                otlp_certificate,
                ..
            } = &mut merged;
            (*otlp_protocol, *otlp_headers, *otlp_timeout, *otlp_interval, *otlp_temporality, *otlp_certificate) =
                (None, None, None, None, None, None);
        }
        Ok(merged)
    }

    pub fn from_file(path: &std::path::Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config { path: path.to_owned(), message: format!("cannot read it: {e}") })?;
        Self::parse(&text).map_err(|message| Error::Config { path: path.to_owned(), message })
    }

    /// Parse a configuration file's text; the error names the line, the
    /// column and the key (toml's message, with the offending line quoted).
    /// The line is not quoted when it holds the OTLP headers (credentials).
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| {
            let line_of = |at: usize| text[..at.min(text.len())].matches('\n').count();
            let secret = e.span().is_some_and(|span| {
                text.lines().nth(line_of(span.start)).is_some_and(|l| l.trim_start().starts_with("otlp-headers"))
            });
            match e.span() {
                Some(span) if secret => {
                    let line = line_of(span.start) + 1;
                    format!(
                        "TOML parse error at line {line} (otlp-headers, not quoted: it may hold a credential): {}",
                        e.message().trim_end()
                    )
                }
                _ => e.to_string().trim_end().to_string(),
            }
        })
    }

    /// The settings as a configuration file (`observer run --dry-run`),
    /// with a comment for each one left unset; header values hidden.
    pub fn to_toml(&self) -> String {
        let mut text = toml::to_string(self).expect("settings are plain values");
        let set = toml::Table::try_from(self).expect("settings are plain values");
        for (key, note) in Self::unset_notes() {
            if !set.contains_key(&key) {
                text += &format!("# {key}: not set, {note}\n");
            }
        }
        text
    }

    /// The daemon's typed view of the settings, each unset one with its
    /// default.
    pub fn resolve(self) -> RunConfig {
        let s = self.or(Self::defaults());
        let otlp = s.otlp_endpoint.map(|endpoint| OtlpConfig {
            endpoint: endpoint.0,
            protocol: preset(s.otlp_protocol),
            headers: s.otlp_headers.unwrap_or_default().0,
            timeout: preset(s.otlp_timeout).0,
            interval: preset(s.otlp_interval).0,
            temporality: preset(s.otlp_temporality),
            certificate: s.otlp_certificate,
        });
        RunConfig {
            prometheus_listen: preset(s.prometheus_listen),
            interval: preset(s.interval).0,
            grace: preset(s.grace).0,
            attach_mode: preset(s.attach_mode),
            limits: Limits {
                max_processes: preset(s.max_processes).0 as usize,
                max_destinations: preset(s.max_destinations).0 as usize,
                max_series: preset(s.max_series).0 as usize,
                max_listeners: preset(s.max_listeners).0 as usize,
            },
            max_sockets: preset(s.max_sockets).0,
            max_namespaces: preset(s.max_namespaces).0 as usize,
            proc_root: preset(s.proc_root),
            kernel_btf: preset(s.kernel_btf),
            cgroup_root: s.cgroup_root,
            pod_logs: preset(s.pod_logs),
            connection_limits: s.connection_limits.map(|l| l.0).unwrap_or_default(),
            otlp,
        }
    }

    /// `[default: ...]` of each setting with one, by its flag's name, for
    /// `--help` (cli/mod.rs adds them: the defaults are written only here).
    pub fn default_texts() -> Vec<(String, String)> {
        let table = toml::Table::try_from(Self::defaults()).expect("settings are plain values");
        let mut texts: Vec<(String, String)> = table
            .into_iter()
            .map(|(key, value)| (key, value.as_str().map_or_else(|| value.to_string(), str::to_string)))
            .collect();
        texts.extend(Self::unset_notes().into_iter().map(|(key, note)| (key, note.to_string())));
        texts
    }
}

/// A setting that has a `Preset::Value`, once merged with the defaults.
fn preset<T>(value: Option<T>) -> T {
    value.expect("a setting with a default is set once merged with the defaults")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_limits_name_a_server_or_this_nodes_listeners() {
        let parsed: ConnectionLimits = "10.0.0.5:27017=10000, [fd00::5]:5432=500,*:6379=10000".parse().unwrap();
        assert_eq!(
            parsed.0,
            [
                ConnectionLimit { of: LimitOf::Server("10.0.0.5:27017".parse().unwrap()), connections: 10_000 },
                ConnectionLimit { of: LimitOf::Server("[fd00::5]:5432".parse().unwrap()), connections: 500 },
                ConnectionLimit { of: LimitOf::Listeners(6379), connections: 10_000 },
            ]
        );
        assert_eq!(parsed.to_string(), "10.0.0.5:27017=10000,[fd00::5]:5432=500,*:6379=10000", "written back as read");
        for bad in ["db:5432=10", "10.0.0.5:27017", "*:0=5", "*:6379=-1", "10.0.0.5:27017=many"] {
            assert!(bad.parse::<ConnectionLimits>().is_err(), "{bad}");
        }
    }

    #[test]
    fn every_key_parses() {
        let c = Settings::parse(
            r#"
            prometheus-listen = "0.0.0.0:9100"
            interval = "10s"
            grace = "5m"
            attach-mode = "tracepoint"
            max-processes = 50
            max-destinations = 20
            max-series = 5000
            max-sockets = 262144
            proc-root = "/host/proc"
            kernel-btf = "/btf/vmlinux"
            cgroup-root = "/host/sys/fs/cgroup"
            pod-logs = "/host/var/log/pods"
            otlp-endpoint = "https://collector:4317"
            otlp-protocol = "grpc"
            otlp-headers = "authorization=Bearer%20s3cret,x-tenant=a"
            otlp-timeout = "2s"
            otlp-interval = "15000"
            otlp-temporality = "delta"
            otlp-certificate = "/etc/observer/ca.pem"
            "#,
        )
        .unwrap();
        assert_eq!(c.prometheus_listen, Some("0.0.0.0:9100".parse().unwrap()));
        assert_eq!(c.interval, Some(Interval(Duration::from_secs(10))));
        assert_eq!(c.grace, Some(Grace(Duration::from_secs(300))));
        assert_eq!(c.attach_mode, Some(AttachMode::Tracepoint));
        assert_eq!((c.max_processes, c.max_destinations), (Some(SeriesLimit(50)), Some(SeriesLimit(20))));
        assert_eq!(c.max_sockets, Some(MaxSockets(262_144)));
        assert_eq!(c.max_series, Some(MaxSeries(5000)));
        assert_eq!(c.proc_root, Some(PathBuf::from("/host/proc")));
        assert_eq!(c.kernel_btf, Some(PathBuf::from("/btf/vmlinux")));
        assert_eq!(c.cgroup_root, Some(PathBuf::from("/host/sys/fs/cgroup")));
        assert_eq!(c.pod_logs, Some(PathBuf::from("/host/var/log/pods")));
        assert_eq!(c.otlp_endpoint.as_ref().map(|e| e.0.to_string()).as_deref(), Some("https://collector:4317/"));
        assert_eq!(c.otlp_protocol, Some(Protocol::Grpc));
        assert_eq!(
            c.otlp_headers.as_ref().unwrap().0,
            [("authorization".to_string(), "Bearer s3cret".to_string()), ("x-tenant".into(), "a".into())]
        );
        assert_eq!(c.otlp_timeout, Some(OtlpTimeout(Duration::from_secs(2))));
        assert_eq!(c.otlp_interval, Some(OtlpInterval(Duration::from_secs(15))));
        assert_eq!(c.otlp_temporality, Some(TemporalityChoice::Delta));
        assert_eq!(c.otlp_certificate, Some(PathBuf::from("/etc/observer/ca.pem")));
        assert_eq!(Settings::parse("").unwrap(), Settings::empty());
        // What --dry-run prints reads back as the same settings (headers
        // aside: their values are hidden).
        let printed = Settings { otlp_headers: None, ..c.clone() }.to_toml();
        assert_eq!(Settings::parse(&printed).unwrap(), Settings { otlp_headers: None, ..c });
    }

    /// Each error names the line and the key or value at fault.
    #[test]
    fn errors_name_the_line_and_the_key() {
        let cases = [
            ("interval = \"5s\"\nintervall = \"5s\"", "line 2", "unknown field `intervall`"),
            ("\ninterval = \"soon\"", "line 2", "not a duration"),
            ("grace = \"2d\"", "line 1", "out of range"),
            ("\n\nprometheus-listen = \"localhost\"", "line 3", "invalid socket address"),
            ("attach-mode = \"uprobe\"", "line 1", "not an attach mode"),
            ("max-processes = 0", "line 1", "out of range"),
            ("max-destinations = \"many\"", "line 1", "invalid type"),
            ("max-sockets = 100", "line 1", "out of range"),
            ("interval = 5", "line 1", "invalid type"),
            ("interval = \"5s", "line 1", ""),
            ("otlp-endpoint = \"collector:4317\"", "line 1", "not an http(s) URL"),
            ("otlp-endpoint = \"not a url\"", "line 1", "not a URL"),
            ("otlp-protocol = \"http/json\"", "line 1", "not an OTLP protocol"),
            ("otlp-headers = \"authorization\"", "line 1", "not key=value"),
            ("connection-limits = \"10.0.0.5=10\"", "line 1", "ADDR:PORT=N"),
            ("connection-limits = \"10.0.0.5:27017=0\"", "line 1", "N at least 1"),
            ("connection-limits = \"*:6379=5,*:6379=7\"", "line 1", "declared twice"),
            ("otlp-timeout = \"0ms\"", "line 1", "out of range"),
            ("otlp-interval = \"often\"", "line 1", "not a duration"),
            ("otlp-temporality = \"sometimes\"", "line 1", "not a temporality"),
        ];
        for (text, line, what) in cases {
            let e = Settings::parse(text).unwrap_err();
            assert!(e.contains(line) && e.contains(what), "{text:?}: {e}");
        }
    }

    #[test]
    fn every_setting_has_a_default_or_says_what_unset_means() {
        let defaults = Settings::defaults();
        let printed = defaults.to_toml();
        assert!(printed.contains("interval = \"5s\"") && printed.contains("max-sockets = 65536"), "{printed}");
        assert!(printed.contains("# cgroup-root: not set, the cgroup2 mount"), "{printed}");
        let config = Settings::load(Settings::empty(), None).unwrap().resolve();
        assert_eq!(config.limits.max_processes, Limits::DEFAULT.max_processes);
        assert!(config.otlp.is_none());
    }
}
