//! What a running daemon adds to doctor's check list, which a look at the
//! node's sockets cannot tell: the servers whose connection limit it
//! inferred (`inferred_limits.rs`, over its rounds), and, for a
//! destination whose connections are not reused, who opens them and how
//! long they live. Read from its Prometheus endpoint (the node's
//! DaemonSet, or `--from`), parsed with prometheus-parse.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use prometheus_parse::{Scrape, Value};

/// A server as the daemon's labels name it: `addr:port` (`[addr]:port`
/// for IPv6), as `SocketAddr` displays it.
fn server(labels: &prometheus_parse::Labels) -> Option<String> {
    let (addr, port) = (labels.get("server_address")?, labels.get("server_port")?);
    Some(if addr.contains(':') { format!("[{addr}]:{port}") } else { format!("{addr}:{port}") })
}

/// The outbound connections toward one server, since the daemon started.
#[derive(Default)]
struct Toward {
    /// Established, per executable: how many, by which pids.
    opened: BTreeMap<String, (f64, BTreeSet<String>)>,
    /// Closed, cumulative by lifetime bound in seconds (`+Inf`: all).
    closed: Vec<(f64, f64)>,
}

pub struct DaemonView {
    /// Where it was read.
    pub url: String,
    /// (server, connections it holds before it turns new ones away).
    pub inferred_limits: Vec<(String, u64)>,
    toward: HashMap<String, Toward>,
}

impl DaemonView {
    pub fn parse(url: &str, page: &str) -> Result<Self, String> {
        let scrape = Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))).map_err(|e| e.to_string())?;
        let mut view = DaemonView { url: url.to_string(), inferred_limits: Vec::new(), toward: HashMap::new() };
        let mut from_observer = false;
        for sample in &scrape.samples {
            from_observer |= sample.metric == "observer_probe_info";
            let value = match sample.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => continue,
            };
            let outbound = sample.labels.get("observer_connection_direction") == Some("outbound");
            let Some(server) = server(&sample.labels).filter(|_| outbound) else { continue };
            match sample.metric.as_str() {
                "observer_tcp_connection_limit_inferred" => view.inferred_limits.push((server, value as u64)),
                "observer_tcp_connections_established_total" => {
                    // The folded processes (--max-processes) name nobody.
                    let Some(name) = sample.labels.get("process_executable_name").map(str::to_string) else {
                        continue;
                    };
                    let opened = view.toward.entry(server).or_default().opened.entry(name).or_default();
                    opened.0 += value;
                    opened.1.extend(sample.labels.get("process_pid").map(str::to_string));
                }
                "observer_tcp_connections_closed_total" => {
                    let Some(bound) = sample.labels.get("observer_le").and_then(|b| b.parse::<f64>().ok()) else {
                        continue;
                    };
                    let closed = &mut view.toward.entry(server).or_default().closed;
                    match closed.iter_mut().find(|(b, _)| *b == bound) {
                        Some((_, n)) => *n += value,
                        None => closed.push((bound, value)),
                    }
                }
                _ => {}
            }
        }
        if !from_observer {
            return Err("not an observer's page".to_string());
        }
        view.inferred_limits.sort();
        Ok(view)
    }

    /// Who opened the connections toward `server` (`addr:port`): the
    /// executable with the most, and its pid when it is one process
    /// (`curl (120 processes)`, `client pid 4711`).
    pub fn opener(&self, server: &str) -> Option<String> {
        let (name, (_, pids)) = self.toward.get(server)?.opened.iter().max_by(|a, b| a.1.0.total_cmp(&b.1.0))?;
        Some(match pids.len() {
            1 => format!("{name} pid {}", pids.first()?),
            n => format!("{name} ({n} processes)"),
        })
    }

    /// The bound (seconds) under which half the connections toward
    /// `server` that ended had lived.
    pub fn median_lifetime(&self, server: &str) -> Option<f64> {
        let mut closed = self.toward.get(server)?.closed.clone();
        closed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = closed.last()?.1;
        (total > 0.0).then(|| closed.iter().find(|(_, n)| *n >= total / 2.0).map(|(b, _)| *b))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# TYPE observer_probe_info gauge
observer_probe_info{observer_hook="connect"} 1
observer_tcp_connection_limit_inferred{observer_connection_direction="outbound",server_address="10.0.0.8",server_port="27017"} 10000
observer_tcp_connections_established_total{observer_connection_direction="outbound",process_executable_name="curl",process_pid="11",server_address="127.0.0.1",server_port="8080"} 1
observer_tcp_connections_established_total{observer_connection_direction="outbound",process_executable_name="curl",process_pid="12",server_address="127.0.0.1",server_port="8080"} 1
observer_tcp_connections_established_total{observer_connection_direction="outbound",process_executable_name="api",process_pid="7",server_address="127.0.0.1",server_port="8080"} 1
observer_tcp_connections_established_total{observer_connection_direction="inbound",process_executable_name="nginx",process_pid="3",server_port="8080"} 3
observer_tcp_connections_closed_total{observer_connection_direction="outbound",observer_le="0.001",process_pid="11",server_address="127.0.0.1",server_port="8080"} 0
observer_tcp_connections_closed_total{observer_connection_direction="outbound",observer_le="0.004",process_pid="11",server_address="127.0.0.1",server_port="8080"} 1
observer_tcp_connections_closed_total{observer_connection_direction="outbound",observer_le="+Inf",process_pid="11",server_address="127.0.0.1",server_port="8080"} 1
observer_tcp_connections_closed_total{observer_connection_direction="outbound",observer_le="0.001",process_pid="12",server_address="127.0.0.1",server_port="8080"} 0
observer_tcp_connections_closed_total{observer_connection_direction="outbound",observer_le="0.004",process_pid="12",server_address="127.0.0.1",server_port="8080"} 0
observer_tcp_connections_closed_total{observer_connection_direction="outbound",observer_le="+Inf",process_pid="12",server_address="127.0.0.1",server_port="8080"} 1
"#;

    #[test]
    fn a_daemons_page_names_the_limits_the_openers_and_the_lifetimes() {
        let view = DaemonView::parse("http://x", PAGE).unwrap();
        assert_eq!(view.inferred_limits, [("10.0.0.8:27017".to_string(), 10000)]);
        assert_eq!(view.opener("127.0.0.1:8080").as_deref(), Some("curl (2 processes)"));
        assert_eq!(view.median_lifetime("127.0.0.1:8080"), Some(0.004));
        assert_eq!(view.opener("127.0.0.1:9999"), None);
        assert!(DaemonView::parse("http://x", "up 1\n").is_err(), "not observer's");
    }
}
