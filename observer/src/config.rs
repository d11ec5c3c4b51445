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

use crate::{error::Error, probes::AttachMode};

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
    pub proc_root: Option<PathBuf>,
    pub kernel_btf: Option<PathBuf>,
}

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

fn series_limit<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    series_limit_in_range(i64::deserialize(d)?).map(Some).map_err(D::Error::custom)
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
            proc-root = "/host/proc"
            kernel-btf = "/btf/vmlinux"
            "#,
        )
        .unwrap();
        assert_eq!(c.prometheus_listen, Some("0.0.0.0:9100".parse().unwrap()));
        assert_eq!(c.interval, Some(Duration::from_secs(10)));
        assert_eq!(c.grace, Some(Duration::from_secs(300)));
        assert_eq!(c.attach_mode, Some(AttachMode::Tracepoint));
        assert_eq!((c.max_processes, c.max_destinations), (Some(50), Some(20)));
        assert_eq!(c.proc_root, Some(PathBuf::from("/host/proc")));
        assert_eq!(c.kernel_btf, Some(PathBuf::from("/btf/vmlinux")));
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
            ("interval = 5", "line 1", "invalid type"),
            ("interval = \"5s", "line 1", ""),
        ];
        for (text, line, what) in cases {
            let e = FileConfig::parse(text).unwrap_err();
            assert!(e.contains(line) && e.contains(what), "{text:?}: {e}");
        }
    }
}
