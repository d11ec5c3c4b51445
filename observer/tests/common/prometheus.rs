//! A real Prometheus server (Debian's, unpacked by `cargo xtask setup`)
//! scraping one observer daemon every second, and its HTTP API.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use observer_testing::http::free_port;

use super::tool;

pub struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    /// A server scraping `target` every second, with its own storage.
    pub fn start(target: u16) -> Self {
        Self::start_with_rules(target, None)
    }

    /// `start`, evaluating the alert rules of `rules` every second.
    pub fn start_with_rules(target: u16, rules: Option<&std::path::Path>) -> Self {
        let binary = tool("OBSERVER_PROMETHEUS", "prometheus");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("observer-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n{}scrape_configs:\n  \
                 - job_name: observer\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n",
                rules.map(|r| format!("rule_files:\n  - {}\n", r.display())).unwrap_or_default()
            ),
        )
        .unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(dir.join("log")).unwrap()))
            .spawn()
            .expect("start prometheus");
        let server = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.get("/-/ready").is_none_or(|(status, _)| status != 200) {
            assert!(Instant::now() < deadline, "prometheus not ready: {}", server.log());
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        // HTTP/1.0: the answer comes whole, never chunked.
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut response = String::new();
        s.read_to_string(&mut response).ok()?;
        let status = response.split_whitespace().nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n")?.1.to_string();
        Some((status, body))
    }

    /// A query through the HTTP API (`/api/v1/<kind>?query=...<extra>`):
    /// its result array.
    fn api(&self, kind: &str, promql: &str, extra: &str) -> Vec<serde_json::Value> {
        let encoded = percent_encoding::utf8_percent_encode(promql, percent_encoding::NON_ALPHANUMERIC);
        let (status, body) = self.get(&format!("/api/v1/{kind}?query={encoded}{extra}")).expect("query prometheus");
        assert_eq!(status, 200, "{promql}: {body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        answer["data"]["result"].as_array().cloned().unwrap_or_else(|| panic!("{promql}: {body}"))
    }

    /// An instant query: each series' labels and value.
    pub fn query(&self, promql: &str) -> Vec<(serde_json::Value, f64)> {
        let value = |v: &serde_json::Value| v[1].as_str().unwrap().parse().unwrap();
        self.api("query", promql, "").iter().map(|r| (r["metric"].clone(), value(&r["value"]))).collect()
    }

    /// A range query, as Grafana runs a graph: each series' labels and its
    /// values from `start` to now (Unix seconds), one per `step` seconds.
    pub fn query_range(&self, promql: &str, start: u64, step: u64) -> Vec<(serde_json::Value, Vec<f64>)> {
        let end = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 1;
        let value = |v: &serde_json::Value| v[1].as_str().unwrap().parse().unwrap();
        self.api("query_range", promql, &format!("&start={start}&end={end}&step={step}"))
            .iter()
            .map(|r| (r["metric"].clone(), r["values"].as_array().unwrap().iter().map(value).collect()))
            .collect()
    }

    /// Query until some series is there (scrapes come every second).
    pub fn query_until_found(&self, promql: &str, limit: Duration) -> Vec<(serde_json::Value, f64)> {
        let deadline = Instant::now() + limit;
        loop {
            let result = self.query(promql);
            if !result.is_empty() || Instant::now() > deadline {
                return result;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
