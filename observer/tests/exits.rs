//! A process's series end a grace period after the process ends, and not
//! before: the kernel's exit notice comes from the thread-group leader,
//! which can end while the process runs on.
mod common;

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use common::daemon::{scrape_until, start_daemon};
use observer_testing::{ClientReport, Netns, churn, http::sample};

#[test]
fn a_process_whose_leader_thread_exits_keeps_counting_in_one_series() {
    // Grace 3 s, the client runs 6 s: retiring it at its leader's exit
    // would restart its series halfway (a counter reset, counts lost).
    let daemon = start_daemon(&["--grace", "3s"]);
    let ns = Netns::new();
    let client = ns
        .command(&churn())
        .args(["connect", "--to", "127.0.0.1:20600", "--count", "40", "--spread", "6s", "--leader-exits"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = client.id();
    let out = client.wait_with_output().unwrap();
    let report = ClientReport::parse(pid, &String::from_utf8(out.stdout).unwrap());
    assert_eq!(report.errors("ECONNREFUSED"), 40);
    let ended = Instant::now();

    let labels = [format!("process_pid=\"{pid}\""), "error_type=\"ECONNREFUSED\"".to_string()];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let body = scrape_until(&daemon, Duration::from_secs(2), |b| {
        sample(b, "observer_tcp_connect_errors_total", &labels).is_some_and(|n| n >= 40)
    });
    assert!(ended.elapsed() < Duration::from_secs(3), "scraped within the grace period after the end");
    assert_eq!(sample(&body, "observer_tcp_connect_errors_total", &labels), Some(40), "one series, every refusal");

    // Once the whole process has ended, its series go after the grace.
    let body = scrape_until(&daemon, Duration::from_secs(15), |b| {
        sample(b, "observer_tcp_connect_errors_total", &labels).is_none()
    });
    assert_eq!(sample(&body, "observer_tcp_connect_errors_total", &labels), None, "retired after the grace");
}

/// An exit storm: 150 processes refused twice each, all exiting at once,
/// twice over. Each process's count is exact in its own series; each batch
/// is retired a grace period after it ended, so the second batch finds the
/// process slots free (200 by default: without the retirement, 300
/// processes would overflow into `other`).
#[test]
fn an_exit_storm_is_counted_exactly_and_retired_whole() {
    const BATCH: usize = 150;
    let daemon = start_daemon(&["--grace", "1s"]);
    let ns = Netns::new();
    for batch in 0..2 {
        let port = 20700 + batch;
        let clients: Vec<_> = (0..BATCH)
            .map(|_| {
                ns.command(&churn())
                    .args(["connect", "--to", &format!("127.0.0.1:{port}"), "--count", "2"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let pids: Vec<u32> = clients.iter().map(std::process::Child::id).collect();
        for client in clients {
            let pid = client.id();
            let out = client.wait_with_output().unwrap();
            let report = ClientReport::parse(pid, &String::from_utf8(out.stdout).unwrap());
            assert_eq!(report.errors("ECONNREFUSED"), 2, "ground truth: each client refused twice");
        }
        let count = |body: &str, pid: u32| {
            sample(body, "observer_tcp_connect_errors_total", &[&format!("process_pid=\"{pid}\"")])
        };
        let body = scrape_until(&daemon, Duration::from_secs(10), |b| pids.iter().all(|p| count(b, *p) == Some(2)));
        let wrong: Vec<String> = pids
            .iter()
            .filter(|p| count(&body, **p) != Some(2))
            .map(|p| format!("{p}: {:?}", count(&body, *p)))
            .collect();
        assert!(wrong.is_empty(), "batch {batch}: not 2 refusals each: {wrong:?}");
        let other = sample(&body, "observer_tcp_connect_errors_total", &["otel_metric_overflow=\"true\""]);
        assert_eq!(other, None, "batch {batch}: nothing folded into other");
        // Then the whole batch goes.
        let body = scrape_until(&daemon, Duration::from_secs(15), |b| pids.iter().all(|p| count(b, *p).is_none()));
        let left = pids.iter().filter(|p| count(&body, **p).is_some()).count();
        assert_eq!(left, 0, "batch {batch}: {left} processes not retired 15 s after they all ended");
    }
}

/// A pid taken by a new process while the old one's series still wait out
/// their grace period: the new process gets series of its own (its name),
/// exact, instead of adding to the old one's under the old name. The
/// kernel hands out the old pid again when told the last one it gave
/// (`/proc/sys/kernel/ns_last_pid`, as checkpoint/restore tools do). Both
/// live for several rounds: observer tells a reused pid by the start time
/// /proc shows (processes that lived less than a round are not told apart
/// yet: that needs the start time from the kernel).
#[test]
fn a_reused_pid_starts_a_new_process_series() {
    let daemon = start_daemon(&["--grace", "60s"]);
    let ns = Netns::new();
    let refused = |pid: u32, name: &str, body: &str| {
        sample(
            body,
            "observer_tcp_connect_errors_total",
            &[&format!("process_pid=\"{pid}\""), &format!("process_executable_name=\"{name}\"")],
        )
    };

    // The first process: refused 3 times over 2 s, then gone (its series
    // stay 60 s).
    let first = ns
        .command(&churn())
        .args(["connect", "--to", "127.0.0.1:20800", "--count", "3", "--spread", "2s"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&first.stdout).contains("ECONNREFUSED:3"), "{first:?}");
    // Its pid: the only observer-churn series with 3 refusals to port 20800.
    let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
        b.lines().any(|l| l.contains("server_port=\"20800\"") && l.ends_with(" 3"))
    });
    let line = body.lines().find(|l| l.contains("server_port=\"20800\"") && l.ends_with(" 3")).expect(&body);
    let pid: u32 = line.split("process_pid=\"").nth(1).and_then(|r| r.split('"').next()).unwrap().parse().unwrap();

    // A second process with that pid, refused 5 times, running another
    // executable: a copy of observer-churn under a name longer than the
    // 15 bytes of `comm` (the series name the whole executable).
    const SECOND: &str = "observer-churn-second";
    let dir = std::env::temp_dir().join(format!("observer-reuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let other = dir.join(SECOND);
    std::fs::copy(churn(), &other).unwrap();
    let second = (0..20)
        .find_map(|_| {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
            let mut child = ns
                .command("sh")
                .args([
                    "-c",
                    &format!("read go; exec {} connect --to 127.0.0.1:20801 --count 5 --spread 2s", other.display()),
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            if child.id() == pid {
                Some(child)
            } else {
                // Another fork took it first: try again.
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        })
        .expect("the kernel did not hand out the pid again in 20 tries");
    let mut second = second;
    std::io::Write::write_all(second.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let out = second.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let report = ClientReport::parse(pid, &String::from_utf8(out.stdout).unwrap());
    assert_eq!(report.errors("ECONNREFUSED"), 5);

    let body = scrape_until(&daemon, Duration::from_secs(10), |b| refused(pid, SECOND, b) == Some(5));
    assert_eq!(refused(pid, SECOND, &body), Some(5), "the new process's own series:\n{}", lines(&body, pid));
    assert_eq!(
        refused(pid, "observer-churn", &body),
        None,
        "the old process's series ended when its pid was taken:\n{}",
        lines(&body, pid)
    );
}

fn lines(body: &str, pid: u32) -> String {
    body.lines().filter(|l| l.contains(&format!("process_pid=\"{pid}\""))).collect::<Vec<_>>().join("\n")
}
