//! The daemon end to end: `observer run` as a user starts it, a reproduced
//! port exhaustion, and a scrape of /metrics that must show the exact
//! counts. Also: bad input gives one clear message and a non-zero exit.
mod common;

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::Netns;

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

struct Daemon {
    child: Child,
    port: u16,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start_daemon() -> Daemon {
    let port = free_port();
    let child = Command::new(OBSERVER)
        .args(["run", "--interval", "200ms", "--prometheus-listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let daemon = Daemon { child, port };
    let deadline = Instant::now() + Duration::from_secs(20);
    while scrape(port).is_none() {
        assert!(Instant::now() < deadline, "observer did not start serving");
        std::thread::sleep(Duration::from_millis(100));
    }
    daemon
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.starts_with("HTTP/1.1 200").then_some(body)
}

/// The value of the first sample of `metric` whose labels include all of
/// `labels` (each `name="value"`).
fn sample(body: &str, metric: &str, labels: &[&str]) -> Option<u64> {
    body.lines().filter(|l| l.starts_with(&format!("{metric}{{"))).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        labels.iter().all(|want| series.contains(want)).then(|| value.parse().ok())?
    })
}

#[test]
fn scrape_shows_the_exact_eaddrnotavail_count_of_the_client() {
    let daemon = start_daemon();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41004");
    let _server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let client = ns.client(&["--to", "127.0.0.1:8080", "--count", "9", "--hold"]);
    assert_eq!((client.connected, client.errors("EADDRNOTAVAIL")), (5, 4), "{client:?}");

    let pid = format!("process_pid=\"{}\"", client.pid);
    let errors_labels = [
        pid.as_str(),
        "error_type=\"EADDRNOTAVAIL\"",
        "server_address=\"127.0.0.1\"",
        "server_port=\"8080\"",
        "process_executable_name=\"observer-churn\"",
        "network_type=\"ipv4\"",
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let body = scrape(daemon.port).expect("scrape");
        if sample(&body, "observer_tcp_connect_errors_total", &errors_labels).is_some() || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(sample(&body, "observer_tcp_connect_errors_total", &errors_labels), Some(4), "{body}");
    assert_eq!(sample(&body, "observer_tcp_connects_total", &[pid.as_str()]), Some(5), "{body}");
    for hook in ["tcp_connect", "inet_csk_accept", "tcp_time_wait", "listen_overflow"] {
        assert_eq!(sample(&body, "observer_probe_attached", &[&format!("hook=\"{hook}\"")]), Some(1), "{hook}");
    }
}

fn run_cli(args: &[&str]) -> (i32, String) {
    let out = Command::new(OBSERVER).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_input_is_one_clear_error_and_a_nonzero_exit() {
    for (args, expect) in [
        (&["run", "--interval", "soon"][..], "not a duration"),
        (&["run", "--interval", "0s"][..], "out of range"),
        (&["run", "--prometheus-listen", "nowhere"][..], "invalid socket address"),
        (&["run", "--attach-mode", "magic"][..], "possible values"),
        (&["run", "--no-such-flag"][..], "unexpected argument"),
    ] {
        let (code, stderr) = run_cli(args);
        assert_ne!(code, 0, "{args:?}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_busy_port_is_reported_before_anything_is_loaded() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let (code, stderr) = run_cli(&["run", "--prometheus-listen", &addr]);
    assert_eq!(code, 1);
    assert!(stderr.contains(&format!("cannot listen on {addr}")), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn without_privileges_the_missing_capabilities_are_named() {
    // Drop every capability for the child with setpriv (util-linux), as an
    // unprivileged user or a container without CAP_BPF would run it.
    let port = free_port().to_string();
    let out = Command::new("setpriv")
        .args(["--inh-caps=-all", "--bounding-set=-all", "--", OBSERVER, "run", "--prometheus-listen"])
        .arg(format!("127.0.0.1:{port}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("missing privileges") && stderr.contains("CAP_BPF"), "{stderr}");
}
