//! The configuration file (`observer run --config observer.toml`).
//!
//! Its keys are the `observer run` flags without the dashes in front
//! (`interval = "10s"`), so there is one vocabulary. Every setting comes
//! from, in order: the flag, its environment variable (`OBSERVER_INTERVAL`),
//! this file, the default. The file is checked whole at start: an unknown
//! key, a value of the wrong type or out of range is one error naming the
//! key, the file and the line.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Deserializer, de::Error as _};

use crate::{
    error::Error,
    export::otlp::{Protocol, TemporalityChoice},
    probes::AttachMode,
};

/// Every key is optional: an absent key falls through to the default.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub prometheus_listen: Option<SocketAddr>,
    #[serde(default, deserialize_with = "interval")]
    pub interval: Option<Duration>,
    #[serde(default, deserialize_with = "grace")]
    pub grace: Option<Duration>,
    #[serde(default, deserialize_with = "attach_mode")]
    pub attach_mode: Option<AttachMode>,
    #[serde(default, deserialize_with = "series_limit")]
    pub max_processes: Option<u32>,
    #[serde(default, deserialize_with = "series_limit")]
    pub max_destinations: Option<u32>,
    #[serde(default, deserialize_with = "max_sockets")]
    pub max_sockets: Option<u32>,
    pub proc_root: Option<PathBuf>,
    pub kernel_btf: Option<PathBuf>,
    pub cgroup_root: Option<PathBuf>,
    pub pod_logs: Option<PathBuf>,
    #[serde(default, deserialize_with = "endpoint")]
    pub otlp_endpoint: Option<url::Url>,
    #[serde(default, deserialize_with = "protocol")]
    pub otlp_protocol: Option<Protocol>,
    #[serde(default, deserialize_with = "headers")]
    pub otlp_headers: Option<Headers>,
    #[serde(default, deserialize_with = "otlp_timeout")]
    pub otlp_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "otlp_interval")]
    pub otlp_interval: Option<Duration>,
    #[serde(default, deserialize_with = "temporality")]
    pub otlp_temporality: Option<TemporalityChoice>,
    pub otlp_certificate: Option<PathBuf>,
}

/// OTLP headers (`key=value,key2=value2`, values percent-encoded, as in
/// OTEL_EXPORTER_OTLP_HEADERS).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Headers(pub Vec<(String, String)>);

impl FileConfig {
    pub fn load(path: &std::path::Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config { path: path.to_owned(), message: format!("cannot read it: {e}") })?;
        Self::parse(&text).map_err(|message| Error::Config { path: path.to_owned(), message })
    }

    /// Parse the file's text; the error names the line, the column and the
    /// key (toml's message, with the offending line quoted).
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }
}

/// Limits shared with the command line (cli/run.rs), so a value means the
/// same wherever it is set.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_duration(s, Duration::from_millis(100), Duration::from_secs(3600))
}

pub fn parse_grace(s: &str) -> Result<Duration, String> {
    parse_duration(s, Duration::ZERO, Duration::from_secs(24 * 3600))
}

/// How many processes or destinations get their own series.
pub fn parse_series_limit(s: &str) -> Result<u32, String> {
    series_limit_in_range(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

fn series_limit_in_range(n: i64) -> Result<u32, String> {
    const RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;
    u32::try_from(n)
        .ok()
        .filter(|n| RANGE.contains(n))
        .ok_or_else(|| format!("{n} is out of range: use {} to {}", RANGE.start(), RANGE.end()))
}

/// How many sockets' owners the kernel side remembers (SOCK_OWNERS).
pub fn parse_max_sockets(s: &str) -> Result<u32, String> {
    max_sockets_in_range(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

fn max_sockets_in_range(n: i64) -> Result<u32, String> {
    // Below 1024 the LRU map's per-CPU free lists would evict from the
    // start; above 4Mi entries the map alone needs ~400 MiB of kernel memory.
    const RANGE: std::ops::RangeInclusive<u32> = 1024..=4 * 1024 * 1024;
    u32::try_from(n)
        .ok()
        .filter(|n| RANGE.contains(n))
        .ok_or_else(|| format!("{n} is out of range: use {} to {}", RANGE.start(), RANGE.end()))
}

/// The collector's URL: http or https, with a host.
pub fn parse_endpoint(s: &str) -> Result<url::Url, String> {
    let example = "write e.g. http://otel-collector:4317 (grpc) or http://otel-collector:4318 (http/protobuf)";
    let url = url::Url::parse(s).map_err(|e| format!("`{s}` is not a URL ({e}); {example}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{s}` is not an http(s) URL with a host; {example}"));
    }
    Ok(url)
}

/// `key=value,key2=value2`, values percent-decoded (the W3C baggage form
/// OTEL_EXPORTER_OTLP_HEADERS uses).
pub fn parse_headers(s: &str) -> Result<Headers, String> {
    let mut out = Vec::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("`{pair}` is not key=value (headers: key=value,key2=value2)"))?;
        let key = key.trim();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(format!("`{key}` is not a header name"));
        }
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|e| format!("header `{key}`: the value is not UTF-8 once percent-decoded ({e})"))?;
        out.push((key.to_string(), value.into_owned()));
    }
    Ok(Headers(out))
}

/// OTLP request timeout. A bare number is milliseconds, as in
/// OTEL_EXPORTER_OTLP_TIMEOUT.
pub fn parse_otlp_timeout(s: &str) -> Result<Duration, String> {
    parse_duration(&millis_if_bare(s), Duration::from_millis(100), Duration::from_secs(300))
}

/// OTLP push interval. A bare number is milliseconds, as in
/// OTEL_METRIC_EXPORT_INTERVAL.
pub fn parse_otlp_interval(s: &str) -> Result<Duration, String> {
    parse_duration(&millis_if_bare(s), Duration::from_millis(100), Duration::from_secs(3600))
}

fn millis_if_bare(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) { format!("{s}ms") } else { s.to_string() }
}

fn parse_duration(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration ({e}); write e.g. 500ms, 5s or 1m"))?;
    if d < min || d > max {
        return Err(format!(
            "{s} is out of range: use between {} and {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

fn interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    parse_interval(&String::deserialize(d)?).map(Some).map_err(D::Error::custom)
}

fn grace<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    parse_grace(&String::deserialize(d)?).map(Some).map_err(D::Error::custom)
}

fn attach_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<AttachMode>, D::Error> {
    use clap::ValueEnum as _;
    let s = String::deserialize(d)?;
    AttachMode::from_str(&s, false)
        .map(Some)
        .map_err(|_| D::Error::custom(format!("`{s}` is not an attach mode: use auto, fentry, kprobe or tracepoint")))
}

fn endpoint<'de, D: Deserializer<'de>>(d: D) -> Result<Option<url::Url>, D::Error> {
    parse_endpoint(&String::deserialize(d)?).map(Some).map_err(D::Error::custom)
}

fn headers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Headers>, D::Error> {
    parse_headers(&String::deserialize(d)?).map(Some).map_err(D::Error::custom)
}

fn otlp_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    parse_otlp_timeout(&String::deserialize(d)?).map(Some).map_err(D::Error::custom)
}

fn otlp_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    parse_otlp_interval(&String::deserialize(d)?).map(Some).map_err(D::Error::custom)
}

fn protocol<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Protocol>, D::Error> {
    use clap::ValueEnum as _;
    let s = String::deserialize(d)?;
    Protocol::from_str(&s, true)
        .map(Some)
        .map_err(|_| D::Error::custom(format!("`{s}` is not an OTLP protocol: use grpc or http/protobuf")))
}

fn temporality<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TemporalityChoice>, D::Error> {
    use clap::ValueEnum as _;
    let s = String::deserialize(d)?;
    TemporalityChoice::from_str(&s, true)
        .map(Some)
        .map_err(|_| D::Error::custom(format!("`{s}` is not a temporality: use cumulative, delta or lowmemory")))
}

fn series_limit<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    series_limit_in_range(i64::deserialize(d)?).map(Some).map_err(D::Error::custom)
}

fn max_sockets<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    max_sockets_in_range(i64::deserialize(d)?).map(Some).map_err(D::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_parses() {
        let c = FileConfig::parse(
            r#"
            prometheus-listen = "0.0.0.0:9100"
            interval = "10s"
            grace = "5m"
            attach-mode = "tracepoint"
            max-processes = 50
            max-destinations = 20
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
        assert_eq!(c.interval, Some(Duration::from_secs(10)));
        assert_eq!(c.grace, Some(Duration::from_secs(300)));
        assert_eq!(c.attach_mode, Some(AttachMode::Tracepoint));
        assert_eq!((c.max_processes, c.max_destinations), (Some(50), Some(20)));
        assert_eq!(c.max_sockets, Some(262_144));
        assert_eq!(c.proc_root, Some(PathBuf::from("/host/proc")));
        assert_eq!(c.kernel_btf, Some(PathBuf::from("/btf/vmlinux")));
        assert_eq!(c.cgroup_root, Some(PathBuf::from("/host/sys/fs/cgroup")));
        assert_eq!(c.pod_logs, Some(PathBuf::from("/host/var/log/pods")));
        assert_eq!(c.otlp_endpoint.map(String::from).as_deref(), Some("https://collector:4317/"));
        assert_eq!(c.otlp_protocol, Some(Protocol::Grpc));
        assert_eq!(
            c.otlp_headers.unwrap().0,
            [("authorization".to_string(), "Bearer s3cret".to_string()), ("x-tenant".into(), "a".into())]
        );
        assert_eq!(c.otlp_timeout, Some(Duration::from_secs(2)));
        assert_eq!(c.otlp_interval, Some(Duration::from_secs(15)));
        assert_eq!(c.otlp_temporality, Some(TemporalityChoice::Delta));
        assert_eq!(c.otlp_certificate, Some(PathBuf::from("/etc/observer/ca.pem")));
        assert_eq!(FileConfig::parse("").unwrap(), FileConfig::default());
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
            ("otlp-timeout = \"0ms\"", "line 1", "out of range"),
            ("otlp-interval = \"often\"", "line 1", "not a duration"),
            ("otlp-temporality = \"sometimes\"", "line 1", "not a temporality"),
        ];
        for (text, line, what) in cases {
            let e = FileConfig::parse(text).unwrap_err();
            assert!(e.contains(line) && e.contains(what), "{text:?}: {e}");
        }
    }
}
