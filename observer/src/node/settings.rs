//! The per-namespace settings that bound connections, read from
//! /proc/sys/net files opened inside the namespace.
use std::{fs::File, io, os::unix::fs::FileExt as _};

use serde::Serialize;

use super::netns::Dirs;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NetSettings {
    /// net.ipv4.ip_local_port_range (both ends included).
    pub ip_local_port_range: (u16, u16),
    /// net.ipv4.ip_local_reserved_ports, as ranges.
    pub ip_local_reserved_ports: Vec<(u16, u16)>,
    pub tcp_fin_timeout: u32,
    pub tcp_tw_reuse: u32,
    pub somaxconn: u32,
    pub tcp_max_syn_backlog: u32,
    pub tcp_max_tw_buckets: u32,
}

/// The settings' sysctl files, opened in their network namespace: a
/// /proc/sys/net file answers for the namespace of the thread that opened
/// it, so once open they are read from any thread, round after round (a
/// read of an open file costs a fraction of an open).
pub struct SettingsFiles {
    port_range: File,
    reserved_ports: File,
    numbers: [File; 5],
}

/// The settings read as plain numbers, in `NetSettings`' order.
const NUMBERS: [&str; 5] = [
    "ipv4/tcp_fin_timeout",
    "ipv4/tcp_tw_reuse",
    "core/somaxconn",
    "ipv4/tcp_max_syn_backlog",
    "ipv4/tcp_max_tw_buckets",
];

/// A sysctl file's value, read from its start.
fn read(file: &File, name: &str) -> io::Result<String> {
    let mut buf = [0u8; 512];
    let n = file.read_at(&mut buf, 0)?;
    String::from_utf8(buf[..n].to_vec())
        .map(|s| s.trim().to_string())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: not text")))
}

fn number(file: &File, name: &str) -> io::Result<u32> {
    let text = read(file, name)?;
    text.parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: `{text}` is not a number")))
}

impl SettingsFiles {
    /// The settings files of the namespace `dirs` were opened in.
    pub fn open(dirs: &Dirs) -> io::Result<Self> {
        let open = |name: &str| dirs.sysctl(name);
        Ok(Self {
            port_range: open("ipv4/ip_local_port_range")?,
            reserved_ports: open("ipv4/ip_local_reserved_ports")?,
            numbers: [open(NUMBERS[0])?, open(NUMBERS[1])?, open(NUMBERS[2])?, open(NUMBERS[3])?, open(NUMBERS[4])?],
        })
    }

    pub fn read(&self) -> io::Result<NetSettings> {
        let range = read(&self.port_range, "ip_local_port_range")?;
        let ip_local_port_range = parse_range(&range.replace(['\t', ' '], "-").replace("--", "-"))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("ip_local_port_range: `{range}`")))?;
        let [fin_timeout, tw_reuse, somaxconn, max_syn_backlog, max_tw_buckets] = &self.numbers;
        Ok(NetSettings {
            ip_local_port_range,
            ip_local_reserved_ports: parse_port_list(&read(&self.reserved_ports, "ip_local_reserved_ports")?),
            tcp_fin_timeout: number(fin_timeout, NUMBERS[0])?,
            tcp_tw_reuse: number(tw_reuse, NUMBERS[1])?,
            somaxconn: number(somaxconn, NUMBERS[2])?,
            tcp_max_syn_backlog: number(max_syn_backlog, NUMBERS[3])?,
            tcp_max_tw_buckets: number(max_tw_buckets, NUMBERS[4])?,
        })
    }
}

impl NetSettings {
    pub fn is_ephemeral(&self, port: u16) -> bool {
        let (lo, hi) = self.ip_local_port_range;
        (lo..=hi).contains(&port) && !self.ip_local_reserved_ports.iter().any(|(a, b)| (*a..=*b).contains(&port))
    }

    /// Local ports connect() can pick toward one destination: the range
    /// minus the reserved ports in it.
    pub fn ephemeral_ports(&self) -> u32 {
        let (lo, hi) = self.ip_local_port_range;
        let reserved: u32 = self
            .ip_local_reserved_ports
            .iter()
            .map(|(a, b)| {
                let (a, b) = ((*a).max(lo), (*b).min(hi));
                if a <= b { u32::from(b - a) + 1 } else { 0 }
            })
            .sum();
        (u32::from(hi.saturating_sub(lo)) + 1).saturating_sub(reserved)
    }
}

fn parse_range(s: &str) -> Option<(u16, u16)> {
    match s.split_once('-') {
        Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
        None => {
            let p = s.trim().parse().ok()?;
            Some((p, p))
        }
    }
}

/// `1000-1010,2000` (the reserved ports' format); bad items are skipped.
fn parse_port_list(s: &str) -> Vec<(u16, u16)> {
    s.split(',').map(str::trim).filter(|p| !p.is_empty()).filter_map(parse_range).collect()
}

/// Settings for tests: the port range and TIME_WAIT ceiling given, the
/// rest Linux's defaults.
#[cfg(test)]
impl NetSettings {
    pub fn with_range(range: (u16, u16), tcp_max_tw_buckets: u32) -> Self {
        NetSettings {
            ip_local_port_range: range,
            ip_local_reserved_ports: Vec::new(),
            tcp_fin_timeout: 60,
            tcp_tw_reuse: 2,
            somaxconn: 4096,
            tcp_max_syn_backlog: 1024,
            tcp_max_tw_buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(range: (u16, u16), reserved: &str) -> NetSettings {
        NetSettings { ip_local_reserved_ports: parse_port_list(reserved), ..NetSettings::with_range(range, 65536) }
    }

    #[test]
    fn ephemeral_ports_are_the_range_minus_the_reserved_ones_in_it() {
        assert_eq!(settings((32768, 60999), "").ephemeral_ports(), 28232);
        let s = settings((40000, 40009), "40002-40003,40009,50000-50010,1");
        assert_eq!(s.ephemeral_ports(), 7);
        assert!(s.is_ephemeral(40000) && !s.is_ephemeral(40002) && !s.is_ephemeral(40009) && !s.is_ephemeral(39999));
    }

    #[test]
    fn port_lists_parse_and_skip_garbage() {
        assert_eq!(parse_port_list("1000-1010, 2000,,x,3-"), vec![(1000, 1010), (2000, 2000)]);
        assert_eq!(parse_range("32768-60999"), Some((32768, 60999)));
    }
}
