//! The types of the settings' values, each checked by one function
//! wherever it is set (flag, environment, file) and written back by
//! `Display` (`--dry-run`, `--help`).
use std::{fmt, str::FromStr, time::Duration};

use clap::ValueEnum;
use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

use crate::{
    export::otlp::{Protocol, TemporalityChoice},
    probes::AttachMode,
};

/// A setting written as a string (a duration, a URL, headers), checked by
/// the same function wherever it is set; written back by `Display`.
macro_rules! text_setting {
    ($(#[$doc:meta])* $name:ident($inner:ty), parse: $parse:expr, show: $show:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name(pub $inner);

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                ($parse)(s).map(Self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                ($show)(&self.0, f)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(D::Error::custom)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}

fn show_duration(d: &Duration, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "{}", humantime::format_duration(*d))
}

text_setting!(Interval(Duration), parse: |s| parse_duration(s, Duration::from_millis(100), Duration::from_secs(3600)), show: show_duration);
text_setting!(Grace(Duration), parse: |s| parse_duration(s, Duration::ZERO, Duration::from_secs(24 * 3600)), show: show_duration);
text_setting!(
    /// OTLP request timeout. A bare number is milliseconds, as in
    /// OTEL_EXPORTER_OTLP_TIMEOUT.
    OtlpTimeout(Duration),
    parse: |s: &str| parse_duration(&millis_if_bare(s), Duration::from_millis(100), Duration::from_secs(300)),
    show: show_duration
);
text_setting!(
    /// OTLP push interval. A bare number is milliseconds, as in
    /// OTEL_METRIC_EXPORT_INTERVAL.
    OtlpInterval(Duration),
    parse: |s: &str| parse_duration(&millis_if_bare(s), Duration::from_millis(100), Duration::from_secs(3600)),
    show: show_duration
);
text_setting!(
    /// The collector's URL: http or https, with a host.
    Endpoint(url::Url),
    parse: parse_endpoint,
    show: |u: &url::Url, f: &mut fmt::Formatter<'_>| write!(f, "{u}")
);
text_setting!(
    /// Connection limits the user knows and observer cannot see, e.g.
    /// `10.0.0.5:27017=10000,*:6379=10000`.
    ConnectionLimits(Vec<ConnectionLimit>),
    parse: parse_connection_limits,
    show: |limits: &Vec<ConnectionLimit>, f: &mut fmt::Formatter<'_>| {
        f.write_str(&limits.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
    }
);

/// A declared connection limit: of a server, for every client everywhere
/// (a database's max connections), or of this node's listeners on a port
/// (a server's max clients).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimit {
    pub of: LimitOf,
    pub connections: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitOf {
    /// `ADDR:PORT`: the outbound connections to that server.
    Server(std::net::SocketAddr),
    /// `*:PORT`: the inbound connections to this node's listeners on it.
    Listeners(u16),
}

impl fmt::Display for ConnectionLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.of {
            LimitOf::Server(addr) => write!(f, "{addr}={}", self.connections),
            LimitOf::Listeners(port) => write!(f, "*:{port}={}", self.connections),
        }
    }
}

/// `ADDR:PORT=N` or `*:PORT=N`, comma-separated.
fn parse_connection_limits(s: &str) -> Result<Vec<ConnectionLimit>, String> {
    let one = |item: &str| -> Result<ConnectionLimit, String> {
        let wrong = || {
            format!(
                "`{item}`: write ADDR:PORT=N for a server (10.0.0.5:27017=10000, [fd00::5]:5432=500) or *:PORT=N \
                 for this node's listeners on a port (*:6379=10000), N at least 1"
            )
        };
        let (target, n) = item.split_once('=').ok_or_else(wrong)?;
        let connections = n.trim().parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(wrong)?;
        let target = target.trim();
        let of = match target.strip_prefix("*:") {
            Some(port) => LimitOf::Listeners(port.parse().ok().filter(|p| *p > 0).ok_or_else(wrong)?),
            None => LimitOf::Server(target.parse().map_err(|_| wrong())?),
        };
        Ok(ConnectionLimit { of, connections })
    };
    let limits: Vec<ConnectionLimit> =
        s.split(',').map(str::trim).filter(|i| !i.is_empty()).map(one).collect::<Result<_, _>>()?;
    if let Some(twice) = limits.iter().enumerate().find(|(i, l)| limits[..*i].iter().any(|o| o.of == l.of)) {
        return Err(format!("`{}` is declared twice", twice.1));
    }
    Ok(limits)
}

/// OTLP headers (`key=value,key2=value2`, values percent-encoded, as in
/// OTEL_EXPORTER_OTLP_HEADERS). Their values are usually credentials: no
/// output shows them, not `Display` (`--dry-run`), not `Debug`, not an
/// error about a malformed one (clap's would quote the whole value).
#[derive(Clone, Default, PartialEq)]
pub struct Headers(pub Vec<(String, String)>);

impl fmt::Display for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.iter().map(|(k, _)| format!("{k}=<hidden>")).collect::<Vec<_>>().join(","))
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Headers({self})")
    }
}

impl FromStr for Headers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_headers(s).map(Self)
    }
}

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

impl Serialize for Headers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// clap's parser for `--otlp-headers` and OTEL_EXPORTER_OTLP_HEADERS: its
/// error names the flag and what is wrong, never the value.
#[derive(Clone)]
pub struct HeadersParser;

impl clap::builder::ValueParserFactory for Headers {
    type Parser = HeadersParser;
    fn value_parser() -> HeadersParser {
        HeadersParser
    }
}

impl clap::builder::TypedValueParser for HeadersParser {
    type Value = Headers;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Headers, clap::Error> {
        let flag = arg.and_then(|a| a.get_long()).map_or("headers".to_string(), |l| format!("--{l}"));
        let invalid = |what: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for {flag} (not shown: it may hold a credential): {what}\n"),
            )
            .with_cmd(cmd)
        };
        value.to_str().ok_or_else(|| invalid("not UTF-8".into()))?.parse().map_err(invalid)
    }
}

/// A setting written as a number, in a range.
macro_rules! number_setting {
    ($(#[$doc:meta])* $name:ident, $range:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Serialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);

        impl $name {
            fn in_range(n: i64) -> Result<Self, String> {
                const RANGE: std::ops::RangeInclusive<u32> = $range;
                u32::try_from(n)
                    .ok()
                    .filter(|n| RANGE.contains(n))
                    .map(Self)
                    .ok_or_else(|| format!("{n} is out of range: use {} to {}", RANGE.start(), RANGE.end()))
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::in_range(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Self::in_range(i64::deserialize(d)?).map_err(D::Error::custom)
            }
        }
    };
}

number_setting!(
    /// How many processes or destinations get their own series.
    SeriesLimit,
    1..=10_000
);
number_setting!(
    /// How many series each counter may have.
    MaxSeries,
    100..=1_000_000
);
number_setting!(
    /// How many sockets' owners the kernel side remembers (SOCK_OWNERS).
    /// Below 1024 the LRU map's per-CPU free lists would evict from the
    /// start; above 4Mi entries the map alone needs ~400 MiB of kernel
    /// memory.
    MaxSockets,
    1024..=4 * 1024 * 1024
);

/// A setting with a fixed set of values (clap's `ValueEnum`), written as
/// its name in the file too.
macro_rules! choice_setting {
    ($name:ty, $what:literal) => {
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                <$name>::from_str(&s, true).map_err(|_| {
                    let names: Vec<String> = <$name>::value_variants()
                        .iter()
                        .filter_map(|v| Some(v.to_possible_value()?.get_name().to_string()))
                        .collect();
                    D::Error::custom(format!("`{s}` is not {}: use {}", $what, names.join(", ")))
                })
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}

number_setting!(
    /// How many network namespaces are read. Each holds 15 file
    /// descriptors open (node::sweep::FILES_PER_NAMESPACE), so the bound
    /// also bounds observer's files.
    MaxNamespaces,
    1..=65_536
);

choice_setting!(AttachMode, "an attach mode");
choice_setting!(Protocol, "an OTLP protocol");
choice_setting!(TemporalityChoice, "a temporality");

pub fn parse_endpoint(s: &str) -> Result<url::Url, String> {
    let example = "write e.g. http://otel-collector:4317 (grpc) or http://otel-collector:4318 (http/protobuf)";
    let url = url::Url::parse(s).map_err(|e| format!("`{s}` is not a URL ({e}); {example}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{s}` is not an http(s) URL with a host; {example}"));
    }
    Ok(url)
}

/// `key=value,key2=value2`, values percent-decoded (the W3C baggage form
/// OTEL_EXPORTER_OTLP_HEADERS uses). Errors name a header by its place
/// and never quote what was written: it may be a credential.
pub fn parse_headers(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (n, pair) in s.split(',').map(str::trim).filter(|p| !p.is_empty()).enumerate() {
        let place = n + 1;
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("header {place} is not key=value (headers: key=value,key2=value2)"))?;
        let key = key.trim();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(format!("header {place}'s name is not a header name (letters, digits, `-`, `_`, `.`)"));
        }
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|e| format!("header `{key}`: the value is not UTF-8 once percent-decoded ({e})"))?;
        out.push((key.to_string(), value.into_owned()));
    }
    Ok(out)
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
