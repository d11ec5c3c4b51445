//! A running daemon's Prometheus endpoint, read as a user's scraper does.
use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    sync::atomic::{AtomicU32, Ordering},
};

/// A port of 127.0.0.1 nothing is bound to now, below the kernel's
/// ephemeral range (net.ipv4.ip_local_port_range). The kernel's own choice
/// (port 0) comes from that range, where any connect() on the host may take
/// it between this call and the caller's bind: a test daemon once failed to
/// start so ("Address already in use"). Below the range only an explicit
/// bind can; the ports are handed out in turn from a per-process start, so
/// two threads of one test binary do not get the same one.
pub fn free_port() -> u16 {
    const LOWEST: u32 = 10_000;
    static TAKEN: AtomicU32 = AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(LOWEST).max(1);
    let start = std::process::id().wrapping_mul(7_919);
    for _ in 0..span {
        let port = LOWEST + start.wrapping_add(TAKEN.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(port).expect("a port below the ephemeral range");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port of 127.0.0.1 between {LOWEST} and the ephemeral range's start ({ephemeral})");
}

/// One `GET /metrics` on 127.0.0.1:`port`: the whole response, if 200.
pub fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.starts_with("HTTP/1.1 200").then_some(body)
}

/// `GET path` on 127.0.0.1:`port`, giving up after `limit` for the
/// connection and again for the answer: the whole response, if 200.
pub fn get_within(port: u16, path: &str, limit: std::time::Duration) -> Option<String> {
    try_get_within(port, path, limit).ok()
}

/// `get_within`, saying what went wrong and after how long.
pub fn try_get_within(port: u16, path: &str, limit: std::time::Duration) -> Result<String, String> {
    let started = std::time::Instant::now();
    let failed = |what: &str, e: std::io::Error| format!("{what} failed after {:?}: {e}", started.elapsed());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, limit).map_err(|e| failed("connect", e))?;
    s.set_read_timeout(Some(limit)).map_err(|e| failed("set_read_timeout", e))?;
    s.set_write_timeout(Some(limit)).map_err(|e| failed("set_write_timeout", e))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").map_err(|e| failed("write", e))?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| failed("read", e))?;
    if body.starts_with("HTTP/1.1 200") {
        Ok(body)
    } else {
        Err(format!("answered after {:?}: {}", started.elapsed(), body.lines().next().unwrap_or("nothing")))
    }
}

/// The value of the first sample of `metric` whose labels include all of
/// `labels` (each `name="value"`).
pub fn sample(body: &str, metric: &str, labels: &[&str]) -> Option<u64> {
    samples(body, metric, labels).next()
}

/// The sum of the samples of `metric` whose labels include all of `labels`.
pub fn sample_sum(body: &str, metric: &str, labels: &[&str]) -> u64 {
    samples(body, metric, labels).sum()
}

/// The collection rounds a daemon completed, from its scrape.
pub fn rounds_completed(body: &str) -> u64 {
    sample_sum(body, "observer_collection_duration_seconds_count", &[])
}

fn samples<'a>(body: &'a str, metric: &'a str, labels: &'a [&str]) -> impl Iterator<Item = u64> + 'a {
    let prefix = format!("{metric}{{");
    body.lines().filter(move |l| l.starts_with(&prefix)).filter_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        labels.iter().all(|want| series.contains(want)).then(|| value.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_picked_by_their_labels() {
        let body = "m{a=\"1\",b=\"x\"} 3\nm{a=\"2\",b=\"x\"} 4\nother{a=\"1\"} 9\n";
        assert_eq!(sample(body, "m", &["a=\"2\""]), Some(4));
        assert_eq!(sample_sum(body, "m", &["b=\"x\""]), 7);
        assert_eq!(sample(body, "m", &["a=\"3\""]), None);
    }
}
