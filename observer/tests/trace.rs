//! `observer trace` against what clients saw: every EADDRNOTAVAIL of a
//! client that runs out of ports appears once, in order, with its pid,
//! executable, destination and errno; the filters keep what they name and
//! nothing else; a storm of 20,000 failures at --rate 100 prints about
//! 100 lines a second and counts the rest, the two summing to the
//! client's own count. Runs in the kernel matrix too (the tp_btf and
//! fexit/kretprobe paths of a failure).
mod common;

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::daemon::OBSERVER;
use observer_testing::{Netns, churn};
use serde_json::Value;

/// One trace at a time: an unfiltered one would see (and rate-limit) the
/// storm of another test.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running `observer trace --json`, its lines gathered as they come.
struct Trace {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    started: Instant,
}

impl Trace {
    /// Start it with `args`, and wait until it is attached (its first line
    /// on stderr).
    fn start(args: &[&str]) -> Self {
        let mut cmd = Command::new(OBSERVER);
        cmd.arg("trace").arg("--json").args(args);
        if let Ok(mode) = std::env::var("OBSERVER_TEST_ATTACH_MODE") {
            cmd.args(["--attach-mode", &mode]);
        }
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("observer trace");
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let gathered = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                gathered.lock().unwrap().push(value);
            }
        });
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        loop {
            let mut line = String::new();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "observer trace ended before attaching:\n{said}");
            said.push_str(&line);
            if line.starts_with("observer trace: connect() failures") {
                break;
            }
        }
        // The rest of stderr (the summary) is read at the end.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Trace { child, lines, started: Instant::now() }
    }

    /// The events so far (not the left-out counts).
    fn events(&self) -> Vec<Value> {
        self.lines.lock().unwrap().iter().filter(|v| v["event"] == "connect_error").cloned().collect()
    }

    fn left_out(&self) -> u64 {
        self.lines.lock().unwrap().iter().filter_map(|v| v["left_out"].as_u64()).sum()
    }

    fn lost(&self) -> u64 {
        self.lines.lock().unwrap().iter().filter_map(|v| v["lost"].as_u64()).sum()
    }

    fn wait_for(&self, what: &str, done: impl Fn(&Trace) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done(self) {
            let lines = self.lines.lock().unwrap();
            let last = &lines[lines.len().saturating_sub(5)..];
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; {} lines, the last: {last:?}",
                lines.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ctrl-C: it must end cleanly, after its last counts.
    fn stop(mut self) -> Self {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGINT).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "observer trace after Ctrl-C: {status}");
        // The reader thread drains what it printed last.
        std::thread::sleep(Duration::from_millis(200));
        self
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn of_pid(events: &[Value], pid: u32) -> Vec<&Value> {
    events.iter().filter(|e| e["pid"] == pid).collect()
}

#[test]
fn every_eaddrnotavail_appears_once_in_order_with_who_and_where() {
    let _serial = serial();
    let trace = Trace::start(&[]);
    let (_ns, _server, client, failures) = common::exhaust_ports();
    trace.wait_for("the client's failures", |t| of_pid(&t.events(), client).len() as u64 >= failures);
    std::thread::sleep(Duration::from_millis(500));
    let trace = trace.stop();
    let events = trace.events();
    let mine = of_pid(&events, client);
    assert_eq!(mine.len() as u64, failures, "once each: {mine:?}");
    for e in &mine {
        assert_eq!(
            (&e["executable"], &e["destination"], &e["error"], &e["errno"]),
            (
                &Value::from("observer-churn"),
                &Value::from("127.0.0.1:8080"),
                &Value::from("EADDRNOTAVAIL"),
                &Value::from(99)
            ),
            "{e}"
        );
        assert_eq!(e["meaning"], "Cannot assign requested address");
        assert_eq!(e["pod"], Value::Null, "a host process");
    }
    let times: Vec<&str> = mine.iter().map(|e| e["time"].as_str().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "in order: {times:?}");
    assert_eq!((trace.left_out(), trace.lost()), (0, 0));
}

#[test]
fn filters_keep_what_they_name_and_nothing_else() {
    let _serial = serial();
    // ECONNREFUSED only: the port exhaustion's EADDRNOTAVAIL are left out,
    // a refused connect is not.
    let trace = Trace::start(&["--errno", "ECONNREFUSED"]);
    let (ns, _server, exhausting, _) = common::exhaust_ports();
    let refused = ns.client(&["--to", "127.0.0.1:9", "--count", "2"]);
    assert_eq!(refused.errors("ECONNREFUSED"), 2);
    trace.wait_for("the refused connects", |t| of_pid(&t.events(), refused.pid).len() == 2);
    std::thread::sleep(Duration::from_millis(500));
    let events = trace.stop().events();
    assert!(of_pid(&events, exhausting).is_empty(), "{events:?}");
    assert!(events.iter().all(|e| e["error"] == "ECONNREFUSED"), "{events:?}");

    // By pid, and by destination: two clients failing at once, each
    // kept by one filter only.
    let spread = |port: &str| {
        ns.command(&churn())
            .args(["connect", "--to", &format!("127.0.0.1:{port}"), "--count", "200", "--spread", "20s"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (spread("9"), spread("10"));
    let a_pid = a.id().to_string();
    let by_pid = Trace::start(&["--pid", &a_pid]);
    let by_dest = Trace::start(&["--dest", "127.0.0.1:10"]);
    by_pid.wait_for("a's failures", |t| t.events().len() >= 3);
    by_dest.wait_for("b's failures", |t| t.events().len() >= 3);
    let (by_pid, by_dest) = (by_pid.stop().events(), by_dest.stop().events());
    let _ = (a.kill(), b.kill(), a.wait(), b.wait());
    assert!(by_pid.iter().all(|e| e["pid"] == a.id() && e["destination"] == "127.0.0.1:9"), "{by_pid:?}");
    assert!(by_dest.iter().all(|e| e["pid"] == b.id() && e["destination"] == "127.0.0.1:10"), "{by_dest:?}");
}

#[test]
fn a_storm_prints_at_the_rate_and_counts_the_rest() {
    let _serial = serial();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "44000 44001");
    let _holder = ns.serve(&["--listen", "127.0.0.1:8088", "--hold"]);
    let trace = Trace::start(&["--rate", "100/s", "--dest", "127.0.0.1:8088"]);
    let client = ns.client(&["--to", "127.0.0.1:8088", "--count", "20000", "--hold"]);
    let failures = client.errors("EADDRNOTAVAIL");
    assert_eq!(failures, 19_998, "{client:?}");
    // Each second's left-out count comes at the next tick; the last at
    // Ctrl-C.
    trace.wait_for("the storm counted", |t| t.events().len() as u64 + t.left_out() + t.lost() >= failures);
    let seconds = trace.started.elapsed().as_secs_f64();
    let trace = trace.stop();
    let (shown, left_out, lost) = (trace.events().len() as u64, trace.left_out(), trace.lost());
    assert_eq!(lost, 0, "the ring buffer holds a storm this size");
    assert_eq!(shown + left_out, failures, "printed {shown} + left out {left_out}");
    assert!(shown >= 100, "the first second's 100 lines: {shown}");
    assert!(shown as f64 <= 100.0 * (seconds.ceil() + 1.0), "at most 100 a second over {seconds:.1} s: {shown}");
    assert!(of_pid(&trace.events(), client.pid).len() as u64 == shown, "all of them the client's");
}

/// As `observer trace | head -1`: once its reader is gone, the trace ends
/// at its next line, with exit 0 and no panic (a closed pipe is how a
/// reader says it has enough).
#[test]
fn a_reader_that_goes_away_ends_the_trace_quietly() {
    let _serial = serial();
    let mut cmd = Command::new(OBSERVER);
    cmd.args(["trace", "--dest", "127.0.0.1:9"]);
    if let Ok(mode) = std::env::var("OBSERVER_TEST_ATTACH_MODE") {
        cmd.args(["--attach-mode", &mode]);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("Ctrl-C ends it") {
        assert!(stderr.read_line(&mut said).unwrap() > 0, "ended before attaching: {said}");
    }
    let ns = Netns::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    ns.client(&["--to", "127.0.0.1:9", "--count", "1"]);
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("ECONNREFUSED"), "{first}");
    drop(stdout);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        ns.client(&["--to", "127.0.0.1:9", "--count", "1"]);
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "observer trace goes on writing to a closed pipe");
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(status.success() && !rest.contains("panicked"), "{status}: {rest}");
}
