//! A real Prometheus server (Debian's, unpacked by `cargo xtask setup`)
//! scrapes the daemon while a port exhaustion is reproduced in a network
//! namespace. Prometheus's own HTTP API must then return, for the client's
//! pid, exactly the EADDRNOTAVAIL count the client saw; and `promtool check
//! metrics` must find nothing wrong with what observer serves.
mod common;

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{
    Netns,
    daemon::{free_port, start_daemon},
};

/// `OBSERVER_PROMETHEUS`/`OBSERVER_PROMTOOL` (set by `cargo xtask test`),
/// else the program on PATH. Missing is a failure, never a skip.
fn tool(var: &str, program: &str) -> PathBuf {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(program));
    let found = Command::new(&path).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(
        found.is_ok_and(|s| s.success()),
        "{program} not found at {}: run the tests with `cargo xtask test`, which installs it",
        path.display()
    );
    path
}

struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    /// A server scraping `target` every second, with its own storage.
    fn start(target: u16) -> Self {
        let binary = tool("OBSERVER_PROMETHEUS", "prometheus");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("observer-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: observer\n    \
                 static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
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

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
        let mut response = String::new();
        s.read_to_string(&mut response).ok()?;
        let status = response.split_whitespace().nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n")?.1.to_string();
        Some((status, body))
    }

    /// An instant query through the HTTP API: each series' labels and value.
    fn query(&self, promql: &str) -> Vec<(serde_json::Value, f64)> {
        let encoded = percent_encoding::utf8_percent_encode(promql, percent_encoding::NON_ALPHANUMERIC);
        let (status, body) = self.get(&format!("/api/v1/query?query={encoded}")).expect("query prometheus");
        assert_eq!(status, 200, "{promql}: {body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        answer["data"]["result"]
            .as_array()
            .unwrap_or_else(|| panic!("{promql}: {body}"))
            .iter()
            .map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse().unwrap()))
            .collect()
    }

    /// Query until some series is there (scrapes come every second).
    fn query_until_found(&self, promql: &str, limit: Duration) -> Vec<(serde_json::Value, f64)> {
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

#[test]
fn prometheus_finds_the_exact_eaddrnotavail_count_of_the_client() {
    let daemon = start_daemon(&[]);
    let prometheus = Prometheus::start(daemon.port);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41005");
    let _server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let client = ns.client(&["--to", "127.0.0.1:8080", "--count", "9", "--hold"]);
    let failures = client.errors("EADDRNOTAVAIL");
    assert_eq!((client.connected, failures), (6, 3), "{client:?}");

    let promql = format!(
        "observer_tcp_connect_errors_total{{process_pid=\"{}\",error_type=\"EADDRNOTAVAIL\",\
         server_address=\"127.0.0.1\",server_port=\"8080\"}}",
        client.pid
    );
    // The series appears with its final value: the client is done before
    // observer's first collection after it.
    let result = prometheus.query_until_found(&promql, Duration::from_secs(30));
    assert_eq!(result.len(), 1, "{promql}: {result:?}; prometheus log:\n{}", prometheus.log());
    assert_eq!(result[0].1, failures as f64, "{result:?}");
    assert_eq!(result[0].0["process_executable_name"], "observer-churn", "{result:?}");
    assert_eq!(result[0].0["job"], "observer");
    // Prometheus sees the target healthy, and who it is.
    let up = prometheus.query("up{job=\"observer\"}");
    assert_eq!(up.iter().map(|r| r.1).collect::<Vec<_>>(), [1.0], "{up:?}");
    let info = prometheus.query("target_info{service_name=\"observer\"}");
    assert_eq!(info.len(), 1, "{info:?}");
}

#[test]
fn promtool_finds_no_problem_in_the_exposition() {
    let daemon = start_daemon(&[]);
    // Some traffic, so that per-process series exist too.
    let ns = Netns::new();
    let _server = ns.serve(&["--listen", "127.0.0.1:8080"]);
    let client = ns.client(&["--to", "127.0.0.1:8080", "--count", "3"]);
    assert_eq!(client.connected, 3);
    let body = common::daemon::scrape_until(&daemon, Duration::from_secs(10), |b| {
        b.contains(&format!("process_pid=\"{}\"", client.pid))
    });
    let exposition = body.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or(&body);
    assert!(exposition.contains("observer_tcp_connects_total{"), "{exposition}");
    let mut promtool = Command::new(tool("OBSERVER_PROMTOOL", "promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && report.trim().is_empty(), "promtool check metrics:\n{report}");
}
