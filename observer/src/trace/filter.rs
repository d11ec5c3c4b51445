//! Which events `observer trace` prints: by errno, process, pod and
//! destination, all that are given.
use std::{collections::BTreeSet, net::IpAddr};

use observer_common::{TraceEvent, trace_event};

use super::event::far_end;
use crate::export::errno_name;

#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Connect errors with these errnos only (other kinds have none and
    /// pass).
    pub errnos: Option<BTreeSet<u32>>,
    pub pid: Option<u32>,
    /// `namespace/name`.
    pub pod: Option<String>,
    /// The far end: an address, and a port if given (a listener drop has
    /// no far end: left out when this is given).
    pub dest: Option<(IpAddr, Option<u16>)>,
}

impl Filter {
    /// Whether `e` (of a process in `pod`, if any) is wanted.
    pub fn matches(&self, e: &TraceEvent, pod: Option<&str>) -> bool {
        let errno_ok =
            e.kind != trace_event::CONNECT_ERROR || self.errnos.as_ref().is_none_or(|s| s.contains(&e.detail));
        errno_ok
            && self.pid.is_none_or(|p| p == e.actor.tgid)
            && self.pod.as_deref().is_none_or(|want| pod == Some(want))
            && self
                .dest
                .is_none_or(|(a, p)| far_end(e).is_some_and(|far| far.ip() == a && p.is_none_or(|p| p == far.port())))
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

    fn event(kind: u32, pid: u32, errno: u32, port: u16) -> TraceEvent {
        let mut e =
            TraceEvent { kind, detail: errno, family: observer_common::AF_INET, dport: port, ..Default::default() };
        e.daddr[..4].copy_from_slice(&[10, 0, 0, 5]);
        e.actor.tgid = pid;
        e
    }

    #[test]
    fn every_given_condition_must_hold() {
        let error = |pid, errno, port| event(trace_event::CONNECT_ERROR, pid, errno, port);
        let f = Filter {
            errnos: Some([99].into()),
            pid: Some(7),
            dest: Some(parse_dest("10.0.0.5:27017").unwrap()),
            ..Filter::default()
        };
        assert!(f.matches(&error(7, 99, 27017), None));
        assert!(!f.matches(&error(8, 99, 27017), None), "another pid");
        assert!(!f.matches(&error(7, 111, 27017), None), "another errno");
        assert!(!f.matches(&error(7, 99, 80), None), "another port");
        assert!(f.matches(&event(trace_event::CONNECT, 7, 0, 27017), None), "a connect has no errno to hold");
        assert!(
            !f.matches(&event(trace_event::LISTENER_DROP, 7, 0, 27017), None),
            "a listener drop has no destination"
        );
        assert!(Filter::default().matches(&error(1, 1, 1), Some("a/b")), "no condition: everything");
        let pod = Filter { pod: Some("shop/api-1".into()), ..Filter::default() };
        assert!(pod.matches(&error(1, 1, 1), Some("shop/api-1")) && !pod.matches(&error(1, 1, 1), None));
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
