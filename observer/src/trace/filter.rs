//! Which events `observer trace` prints: by errno, process, pod and
//! destination, all that are given.
use std::{collections::BTreeSet, net::IpAddr};

use crate::export::errno_name;

#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub errnos: Option<BTreeSet<u32>>,
    pub pid: Option<u32>,
    /// `namespace/name`.
    pub pod: Option<String>,
    /// An address, and a port if given.
    pub dest: Option<(IpAddr, Option<u16>)>,
}

impl Filter {
    /// Whether an event of `pid` (in `pod`, if any) with `errno` toward
    /// `addr`:`port` is wanted.
    pub fn matches(&self, pid: u32, pod: Option<&str>, errno: u32, addr: IpAddr, port: u16) -> bool {
        self.errnos.as_ref().is_none_or(|e| e.contains(&errno))
            && self.pid.is_none_or(|p| p == pid)
            && self.pod.as_deref().is_none_or(|want| pod == Some(want))
            && self.dest.is_none_or(|(a, p)| a == addr && p.is_none_or(|p| p == port))
    }
}

/// An errno given by name (EADDRNOTAVAIL, case-insensitive) or number.
pub fn parse_errno(text: &str) -> Result<u32, String> {
    if let Ok(n) = text.parse::<u32>() {
        return Ok(n);
    }
    let want = text.to_ascii_uppercase();
    (1..=200)
        .find(|n| errno_name(*n) == want)
        .ok_or_else(|| format!("{text}: not an errno name (e.g. EADDRNOTAVAIL, ECONNREFUSED, ETIMEDOUT) or number"))
}

/// `ADDR`, `ADDR:PORT` or `[IPv6]:PORT`.
pub fn parse_dest(text: &str) -> Result<(IpAddr, Option<u16>), String> {
    if let Ok(addr) = text.parse::<IpAddr>() {
        return Ok((addr, None));
    }
    text.parse::<std::net::SocketAddr>()
        .map(|s| (s.ip(), Some(s.port())))
        .map_err(|_| format!("{text}: not ADDR, ADDR:PORT or [IPv6]:PORT"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_given_condition_must_hold() {
        let addr: IpAddr = "10.0.0.5".parse().unwrap();
        let f = Filter {
            errnos: Some([99].into()),
            pid: Some(7),
            dest: Some(parse_dest("10.0.0.5:27017").unwrap()),
            ..Filter::default()
        };
        assert!(f.matches(7, None, 99, addr, 27017));
        assert!(!f.matches(8, None, 99, addr, 27017), "another pid");
        assert!(!f.matches(7, None, 111, addr, 27017), "another errno");
        assert!(!f.matches(7, None, 99, addr, 80), "another port");
        assert!(Filter::default().matches(1, Some("a/b"), 1, addr, 1), "no condition: everything");
        let pod = Filter { pod: Some("shop/api-1".into()), ..Filter::default() };
        assert!(pod.matches(1, Some("shop/api-1"), 1, addr, 1) && !pod.matches(1, None, 1, addr, 1));
    }

    #[test]
    fn errnos_by_name_or_number_and_destinations_with_or_without_port() {
        assert_eq!(parse_errno("EADDRNOTAVAIL"), Ok(99));
        assert_eq!(parse_errno("econnrefused"), Ok(111));
        assert_eq!(parse_errno("110"), Ok(110));
        assert!(parse_errno("ENOPE").unwrap_err().contains("not an errno"));
        assert_eq!(parse_dest("::1").unwrap().1, None);
        assert_eq!(parse_dest("[::1]:443").unwrap().1, Some(443));
        assert!(parse_dest("example:80").is_err());
    }
}
