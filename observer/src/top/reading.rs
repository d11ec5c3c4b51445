//! One reading of a daemon's Prometheus endpoint, reduced to what `observer
//! top` ranks: per process and per destination, the signals' counters as
//! they stand. Parsed with prometheus-parse (the text format's own rules:
//! escapes, comments, histograms), not by hand.
use std::{collections::HashMap, time::Instant};

use prometheus_parse::{Scrape, Value};

/// Who a process row is about, as the series' labels name it; the folded
/// series (`otel_metric_overflow`) are one row, "other".
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Process {
    pub pid: String,
    pub name: String,
    /// `namespace/name` of its pod, empty on the host.
    pub pod: String,
}

/// A destination row: the server connect() was aimed at.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Destination {
    /// `address:port`, or "other" for the folded destinations.
    pub server: String,
}

/// A listener row: its port and the process owning it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Listener {
    pub port: String,
    pub owner: Process,
}

/// The counters of a row (cumulative in a reading, per second in a rate).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    pub eaddrnotavail: f64,
    pub connect_errors: f64,
    pub time_wait: f64,
    pub overflows: f64,
    pub connects: f64,
    pub accepts: f64,
    /// SYNs a listener got with its SYN queue full (listener rows only).
    pub syn_queue_full: f64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.eaddrnotavail += other.eaddrnotavail;
        self.connect_errors += other.connect_errors;
        self.time_wait += other.time_wait;
        self.overflows += other.overflows;
        self.connects += other.connects;
        self.accepts += other.accepts;
        self.syn_queue_full += other.syn_queue_full;
    }

    fn minus(&self, before: &Counts) -> Counts {
        // A counter below its last value was reset (the daemon restarted,
        // or a process's series were dropped and made again): all new.
        let d = |now: f64, then: f64| if now >= then { now - then } else { now };
        Counts {
            eaddrnotavail: d(self.eaddrnotavail, before.eaddrnotavail),
            connect_errors: d(self.connect_errors, before.connect_errors),
            time_wait: d(self.time_wait, before.time_wait),
            overflows: d(self.overflows, before.overflows),
            connects: d(self.connects, before.connects),
            accepts: d(self.accepts, before.accepts),
            syn_queue_full: d(self.syn_queue_full, before.syn_queue_full),
        }
    }

    fn per_second(&self, seconds: f64) -> Counts {
        let r = |n: f64| n / seconds;
        Counts {
            eaddrnotavail: r(self.eaddrnotavail),
            connect_errors: r(self.connect_errors),
            time_wait: r(self.time_wait),
            overflows: r(self.overflows),
            connects: r(self.connects),
            accepts: r(self.accepts),
            syn_queue_full: r(self.syn_queue_full),
        }
    }
}

/// The counters of one reading, summed per row.
#[derive(Clone, Debug)]
pub struct Reading {
    pub at: Instant,
    pub processes: HashMap<Process, Counts>,
    pub destinations: HashMap<Destination, Counts>,
    pub listeners: HashMap<Listener, Counts>,
    /// The page is an observer's (it lists `observer_probe_info`, which
    /// every observer exports from its start).
    pub from_observer: bool,
}

/// The per-second rates between two readings, per row; a row born since
/// the first counts whole (its series started with it).
#[derive(Clone, Debug, Default)]
pub struct Rates {
    pub seconds: f64,
    pub processes: Vec<(Process, Counts)>,
    pub destinations: Vec<(Destination, Counts)>,
    pub listeners: Vec<(Listener, Counts)>,
}

impl Reading {
    /// Parse a /metrics body (Prometheus text format).
    pub fn parse(body: &str, at: Instant) -> Result<Self, String> {
        let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).map_err(|e| e.to_string())?;
        let mut reading = Reading {
            at,
            processes: HashMap::new(),
            destinations: HashMap::new(),
            listeners: HashMap::new(),
            from_observer: false,
        };
        for sample in &scrape.samples {
            reading.from_observer |= sample.metric == "observer_probe_info";
            let value = match sample.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => continue,
            };
            let label = |key: &str| sample.labels.get(key).unwrap_or_default().to_string();
            let mut counts = Counts::default();
            match sample.metric.as_str() {
                "observer_tcp_connect_errors_total" => {
                    counts.connect_errors = value;
                    if label("error_type") == "EADDRNOTAVAIL" {
                        counts.eaddrnotavail = value;
                    }
                    let server = match (sample.labels.get("server_address"), sample.labels.get("server_port")) {
                        (Some(addr), Some(port)) if addr.contains(':') => format!("[{addr}]:{port}"),
                        (Some(addr), Some(port)) => format!("{addr}:{port}"),
                        _ => "other".to_string(),
                    };
                    reading.destinations.entry(Destination { server }).or_default().add(&counts);
                }
                "observer_tcp_time_wait_entries_total" => counts.time_wait = value,
                "observer_tcp_listen_overflows_total" => counts.overflows = value,
                "observer_tcp_syn_queue_full_total" => counts.syn_queue_full = value,
                "observer_tcp_connects_total" => counts.connects = value,
                "observer_tcp_accepts_total" => counts.accepts = value,
                _ => continue,
            }
            let process = match sample.labels.get("process_pid") {
                Some(pid) => Process {
                    pid: pid.to_string(),
                    name: label("process_executable_name"),
                    pod: match (sample.labels.get("k8s_namespace_name"), sample.labels.get("k8s_pod_name")) {
                        (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
                        _ => String::new(),
                    },
                },
                None => Process { pid: "-".into(), name: "other".into(), pod: String::new() },
            };
            if counts.overflows > 0.0 || counts.syn_queue_full > 0.0 {
                let port = sample.labels.get("server_port").unwrap_or("other").to_string();
                reading.listeners.entry(Listener { port, owner: process.clone() }).or_default().add(&counts);
            }
            if counts.syn_queue_full > 0.0 {
                // A listener's, not its owner's own signal: not a process column.
                continue;
            }
            reading.processes.entry(process).or_default().add(&counts);
        }
        Ok(reading)
    }

    /// Rates from `before` to this reading.
    pub fn rates_since(&self, before: &Reading) -> Rates {
        let seconds = self.at.duration_since(before.at).as_secs_f64().max(0.001);
        fn rows<K: Clone + Eq + std::hash::Hash>(
            now: &HashMap<K, Counts>,
            then: &HashMap<K, Counts>,
            seconds: f64,
        ) -> Vec<(K, Counts)> {
            now.iter()
                .map(|(k, c)| (k.clone(), c.minus(&then.get(k).copied().unwrap_or_default()).per_second(seconds)))
                .collect()
        }
        Rates {
            seconds,
            processes: rows(&self.processes, &before.processes, seconds),
            destinations: rows(&self.destinations, &before.destinations, seconds),
            listeners: rows(&self.listeners, &before.listeners, seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const BEFORE: &str = "\
# TYPE observer_tcp_connect_errors_total counter
observer_tcp_connect_errors_total{process_pid=\"7\",process_executable_name=\"api\",k8s_namespace_name=\"shop\",k8s_pod_name=\"api-1\",error_type=\"EADDRNOTAVAIL\",server_address=\"10.0.0.5\",server_port=\"27017\"} 10
observer_tcp_connect_errors_total{process_pid=\"7\",process_executable_name=\"api\",k8s_namespace_name=\"shop\",k8s_pod_name=\"api-1\",error_type=\"ECONNREFUSED\",server_address=\"10.0.0.5\",server_port=\"27017\"} 1
# TYPE observer_tcp_connects_total counter
observer_tcp_connects_total{process_pid=\"7\",process_executable_name=\"api\",k8s_namespace_name=\"shop\",k8s_pod_name=\"api-1\",network_type=\"ipv4\"} 100
";

    const AFTER: &str = "\
# TYPE observer_tcp_connect_errors_total counter
observer_tcp_connect_errors_total{process_pid=\"7\",process_executable_name=\"api\",k8s_namespace_name=\"shop\",k8s_pod_name=\"api-1\",error_type=\"EADDRNOTAVAIL\",server_address=\"10.0.0.5\",server_port=\"27017\"} 30
observer_tcp_connect_errors_total{process_pid=\"7\",process_executable_name=\"api\",k8s_namespace_name=\"shop\",k8s_pod_name=\"api-1\",error_type=\"ECONNREFUSED\",server_address=\"10.0.0.5\",server_port=\"27017\"} 1
observer_tcp_connect_errors_total{otel_metric_overflow=\"true\",error_type=\"ETIMEDOUT\"} 4
# TYPE observer_tcp_connects_total counter
observer_tcp_connects_total{process_pid=\"7\",process_executable_name=\"api\",k8s_namespace_name=\"shop\",k8s_pod_name=\"api-1\",network_type=\"ipv4\"} 140
observer_tcp_connects_total{process_pid=\"9\",process_executable_name=\"curl\",network_type=\"ipv4\"} 6
# TYPE observer_tcp_listen_overflows_total counter
observer_tcp_listen_overflows_total{process_pid=\"3\",process_executable_name=\"nginx\",server_port=\"80\",network_type=\"ipv4\"} 8
# TYPE observer_tcp_syn_queue_full_total counter
observer_tcp_syn_queue_full_total{process_pid=\"3\",process_executable_name=\"nginx\",server_port=\"80\",observer_syn_queue_action=\"drop\"} 4
";

    #[test]
    fn rates_per_process_and_destination_with_born_rows_counted_whole() {
        let t0 = Instant::now();
        let before = Reading::parse(BEFORE, t0).unwrap();
        let after = Reading::parse(AFTER, t0 + Duration::from_secs(2)).unwrap();
        let rates = after.rates_since(&before);
        let api = Process { pid: "7".into(), name: "api".into(), pod: "shop/api-1".into() };
        let row = |p: &Process| rates.processes.iter().find(|(k, _)| k == p).map(|(_, c)| *c).unwrap();
        assert_eq!(
            row(&api),
            Counts { eaddrnotavail: 10.0, connect_errors: 10.0, connects: 20.0, ..Counts::default() }
        );
        let curl = Process { pid: "9".into(), name: "curl".into(), pod: String::new() };
        assert_eq!(row(&curl).connects, 3.0, "born since: counted whole");
        let other = Process { pid: "-".into(), name: "other".into(), pod: String::new() };
        assert_eq!(row(&other).connect_errors, 2.0, "the folded series are one row");
        let dest = rates.destinations.iter().find(|(d, _)| d.server == "10.0.0.5:27017").unwrap().1;
        assert_eq!((dest.eaddrnotavail, dest.connect_errors), (10.0, 10.0));
        let nginx = Process { pid: "3".into(), name: "nginx".into(), pod: String::new() };
        let listener = rates.listeners.iter().find(|(l, _)| l.port == "80" && l.owner == nginx).unwrap().1;
        assert_eq!((listener.overflows, listener.syn_queue_full), (4.0, 2.0));
        assert_eq!(row(&nginx).overflows, 4.0, "the owner's overflows are its own column too");
    }
}
