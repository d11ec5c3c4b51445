//! `observer doctor` in prepared network namespaces: each ceiling's usage
//! must equal what the kernel shows (`ss`), its limit the namespace's
//! setting, the verdict and the exit code must follow, worst first.
mod common;

use std::{process::Command, time::Duration};

use common::{
    daemon::OBSERVER,
    pods::{Dirs, cgroup2_root},
    web::{CurlLoop, Nginx, Redis, Wrk, narrow_range},
};
use observer_testing::Netns;
use serde_json::Value;

/// `observer doctor ARGS --json`: (exit code, report).
fn doctor(args: &[&str]) -> (i32, Value) {
    let out = Command::new(OBSERVER).arg("doctor").args(args).arg("--json").output().unwrap();
    if out.status.code() == Some(3) {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error: "), "{err}");
        return (3, Value::Null);
    }
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap(), report)
}

fn findings<'a>(report: &'a Value, check: &str) -> Vec<&'a Value> {
    report["findings"].as_array().unwrap().iter().filter(|f| f["check"] == check).collect()
}

fn find<'a>(report: &'a Value, check: &str, subject_has: &str) -> &'a Value {
    findings(report, check)
        .into_iter()
        .find(|f| f["subject"].as_str().unwrap().contains(subject_has))
        .unwrap_or_else(|| panic!("no {check} finding about {subject_has}: {report:#}"))
}

/// Sockets `ss` lists toward `dst` with a local port in [lo, hi], in any
/// state but listening (`connected`: also the closing ones, which hold
/// their port too).
fn ss_ports_toward(ns: &Netns, dst: &str, lo: u16, hi: u16) -> u64 {
    let out = ns.command("ss").args(["-Htan", "state", "connected"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port: u16 = f[f.len() - 2].rsplit(':').next().unwrap().parse().unwrap();
            f[f.len() - 1] == dst && (lo..=hi).contains(&local_port)
        })
        .count() as u64
}

#[test]
fn ports_per_destination_are_counted_apart_and_a_full_range_is_critical() {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41009");
    let _a = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let _b = ns.serve(&["--listen", "127.0.0.1:8081", "--hold"]);
    let full = ns.client(&["--to", "127.0.0.1:8080", "--count", "10", "--hold"]);
    assert_eq!(full.connected, 10, "{full:?}");
    let some = ns.client(&["--to", "127.0.0.1:8081", "--count", "3", "--hold"]);
    assert_eq!(some.connected, 3, "{some:?}");

    let path = format!("/run/netns/{}", ns.name);
    let (code, report) = doctor(&["--netns", &path]);
    let full = find(&report, "ephemeral-ports", "-> 127.0.0.1:8080");
    assert_eq!(full["used"], ss_ports_toward(&ns, "127.0.0.1:8080", 41000, 41009), "{full}");
    assert_eq!((&full["used"], &full["limit"], &full["verdict"]), (&10.into(), &10.into(), &"critical".into()));
    let some = find(&report, "ephemeral-ports", "-> 127.0.0.1:8081");
    assert_eq!(some["used"], ss_ports_toward(&ns, "127.0.0.1:8081", 41000, 41009));
    assert_eq!((&some["used"], &some["verdict"]), (&3.into(), &"ok".into()));
    assert_eq!(code, 2, "critical exits 2");
    assert_eq!(report["findings"][0]["check"], "ephemeral-ports", "worst first: {report:#}");
    assert_eq!(report["namespaces"][0]["settings"]["ip_local_port_range"], serde_json::json!([41000, 41009]));

    // The table names the reason and the next step, after a summary line;
    // the namespace's settings only when asked (--verbose).
    let out = Command::new(OBSERVER).args(["doctor", "--netns", &path]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let summary = table.lines().next().unwrap();
    let findings = report["findings"].as_array().unwrap().len();
    assert_eq!(
        summary,
        format!(
            "1 network namespace, {findings} findings: 1 critical, 0 warnings; worst: ephemeral-ports 127.0.0.1 -> \
             127.0.0.1:8080 in {path}, 10/10 (100%)"
        ),
        "{table}"
    );
    let first = table.lines().find(|l| l.starts_with("CRITICAL")).unwrap_or_else(|| panic!("{table}"));
    assert!(
        first.contains("ephemeral-ports") && first.contains("127.0.0.1:8080") && first.contains("10/10"),
        "{table}"
    );
    assert!(first.contains("ip_local_port_range"), "a next step: {first}");
    assert!(!table.contains("tcp_fin_timeout"), "no settings without --verbose: {table}");
    assert_eq!(out.status.code(), Some(2));
    let verbose = Command::new(OBSERVER).args(["doctor", "--verbose", "--netns", &path]).output().unwrap();
    let verbose = String::from_utf8_lossy(&verbose.stdout);
    assert!(verbose.contains(&format!("netns {path}: ip_local_port_range 41000-41009 (10 ports)")), "{verbose}");
}

/// A pod's namespace is named by the pod, and `--pod NAMESPACE/NAME`
/// examines only its namespace and its processes' files: a server in a
/// cgroup shaped like kubelet's (cgroupfs driver) with kubelet's pod log
/// directory naming it.
#[test]
fn a_pod_names_its_namespace_and_pod_scopes_to_it() {
    let tag = std::process::id();
    let uid = format!("c0ffee00-1234-4abc-8def-{tag:012x}");
    let id = format!("{:064x}", 0xd0c_u64 * 1_000_003 + u64::from(tag));
    let mut dirs = Dirs(Vec::new());
    let cgroup = cgroup2_root().join(format!("kubepods/besteffort/pod{uid}/{id}"));
    dirs.create(&cgroup);
    let logs = std::env::temp_dir().join(format!("observer-doctor-pod-logs-{tag}"));
    let mut log_dirs = Dirs(Vec::new());
    log_dirs.create(&logs.join(format!("shop_payment-api-7d9f_{uid}/payment-api")));
    let logs = logs.to_str().unwrap().to_string();

    let ns = Netns::new();
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec ip netns exec {} {} serve --listen 127.0.0.1:7500 --hold",
        cgroup.display(),
        ns.name,
        observer_testing::churn()
    );
    let mut server = Command::new("sh").args(["-c", &script]).stdout(std::process::Stdio::null()).spawn().unwrap();
    let pid = server.id();
    let listening = || !ns.command("ss").args(["-Htln", "sport = :7500"]).output().unwrap().stdout.is_empty();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !listening() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    let pod = "pod shop/payment-api-7d9f";
    let (_, report) = doctor(&["--pod-logs", &logs, "--pod", "shop/payment-api-7d9f"]);
    let namespaces = report["namespaces"].as_array().unwrap();
    assert_eq!(namespaces.len(), 1, "{report:#}");
    assert_eq!(namespaces[0]["netns"], pod, "{report:#}");
    assert_eq!(namespaces[0]["path"], format!("/proc/{pid}/ns/net"));
    let findings = report["findings"].as_array().unwrap();
    assert!(findings.iter().all(|f| f["netns"] == pod), "{report:#}");
    let files: Vec<&Value> = findings.iter().filter(|f| f["check"] == "open-files").collect();
    assert_eq!(files.len(), 1, "the pod's one process only: {files:#?}");
    assert!(files[0]["subject"].as_str().unwrap().ends_with(&format!("pid {pid} in shop/payment-api-7d9f")));
    find(&report, "accept-queue", "listener 127.0.0.1:7500");

    // Every namespace: the pod's is named by its pod.
    let (_, all) = doctor(&["--pod-logs", &logs]);
    assert!(all["namespaces"].as_array().unwrap().iter().any(|n| n["netns"] == pod), "{all:#}");
    // Every process's open files but kernel threads' (they have none of
    // their own; their flags in /proc/PID/stat say which they are).
    let listed: Vec<u32> = all["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "open-files")
        .filter_map(|f| f["subject"].as_str()?.split(" pid ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(listed.contains(&pid), "the pod's server among {listed:?}");
    const PF_KTHREAD: u32 = 0x0020_0000;
    let kernel_thread = |pid: u32| {
        let stat = procfs::process::Process::new(pid as i32).and_then(|p| p.stat());
        stat.is_ok_and(|s| s.flags & PF_KTHREAD != 0)
    };
    assert!(kernel_thread(2), "kthreadd's flags read as a kernel thread's");
    let threads: Vec<u32> = listed.iter().copied().filter(|p| kernel_thread(*p)).collect();
    assert!(threads.is_empty(), "kernel threads listed with open files: {threads:?}");

    // No such pod: the checks cannot run (3), and the error says why.
    let out = Command::new(OBSERVER).args(["doctor", "--pod-logs", &logs, "--pod", "shop/nope"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("shop/nope") && err.contains("--pod-logs"), "{err}");
    let _ = server.kill();
    let _ = server.wait();
}

/// A command line doctor cannot use exits 64, never 2 (critical to the
/// scripts that run it) nor 3; --help exits 0.
#[test]
fn a_usage_error_is_not_a_verdict() {
    for args in [
        &["doctor", "--no-such-flag"][..],
        &["doctor", "--pid", "not-a-pid"],
        &["doctor", "extra"],
        &["doctor", "--pod", "no-namespace"],
    ] {
        let out = Command::new(OBSERVER).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.starts_with("error:"), "clap's message: {args:?}: {err}");
    }
    let help = Command::new(OBSERVER).args(["doctor", "--help"]).output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let help = String::from_utf8_lossy(&help.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("64 a command line it cannot use"), "{help}");
}

#[test]
fn time_wait_sockets_equal_ss_and_near_their_ceiling_warn() {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_max_tw_buckets", "30");
    let _server = ns.serve(&["--listen", "127.0.0.1:7000", "--close-first", "client"]);
    let client = ns.client(&["--to", "127.0.0.1:7000", "--count", "25", "--close-first", "client"]);
    assert_eq!(client.connected, 25);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (code, report) = doctor(&["--netns", &format!("/run/netns/{}", ns.name)]);
    let tw = find(&report, "time-wait", "TIME-WAIT");
    let in_ss = ns.command("ss").args(["-Htan", "state", "time-wait"]).output().unwrap();
    let in_ss = String::from_utf8_lossy(&in_ss.stdout).lines().count() as u64;
    assert_eq!(tw["used"], in_ss, "{tw}");
    assert_eq!((&tw["limit"], &tw["verdict"]), (&30.into(), &"warning".into()), "{tw}");
    assert_eq!(code, 1, "the worst is a warning: {report:#}");
}

/// The second incident's client at a wide port range (the default, 28,232
/// ports), a new connection per request: 3,200 connections opened and
/// closed first by the client toward one server, 6 held toward another.
/// The first is "no connection reuse" (its TIME_WAIT sockets, the
/// connections closed here within the minute, as `ss` lists them, past 50
/// a second though far from the ports' end), the second is not.
#[test]
fn a_client_without_connection_reuse_is_named_with_its_destination() {
    let ns = Netns::new();
    // Loopback's default (2) lets a connect take over a TIME_WAIT port
    // toward the same server, which would end some of them early.
    ns.sysctl("net.ipv4.tcp_tw_reuse", "0");
    let _churned = ns.serve(&["--listen", "127.0.0.1:7400", "--close-first", "client"]);
    let _pooled = ns.serve(&["--listen", "127.0.0.1:7401", "--hold"]);
    let churn = ns.client(&["--to", "127.0.0.1:7400", "--count", "3200", "--close-first", "client"]);
    assert_eq!(churn.connected, 3200, "{churn:?}");
    let pool = ns.client_holding(&["--to", "127.0.0.1:7401", "--count", "6"]);
    assert_eq!(pool.report.connected, 6);

    let (code, report) = doctor(&["--netns", &format!("/run/netns/{}", ns.name)]);
    let churned = find(&report, "connection-reuse", "-> 127.0.0.1:7400");
    assert_eq!(churned["used"], time_wait_toward(&ns, "127.0.0.1:7400"), "TIME_WAIT toward it, as ss lists: {churned}");
    let range = &report["namespaces"][0]["settings"]["ip_local_port_range"];
    let ports = range[1].as_u64().unwrap() - range[0].as_u64().unwrap() + 1;
    assert_eq!((&churned["limit"], &churned["verdict"]), (&ports.into(), &"warning".into()), "{churned}");
    let subject = churned["subject"].as_str().unwrap();
    assert!(
        subject.contains("ports held by TIME_WAIT of connections closed here") && subject.ends_with(", 0 open"),
        "{subject}"
    );
    assert!(churned["next_step"].as_str().unwrap().contains("keep-alive"), "{churned}");
    assert!(
        !findings(&report, "connection-reuse").iter().any(|f| f["subject"].as_str().unwrap().contains(":7401")),
        "connections held are reused: {report:#}"
    );
    assert_eq!(code, 1, "a warning: {report:#}");

    let out = Command::new(OBSERVER).args(["doctor", "--netns", &format!("/run/netns/{}", ns.name)]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let line = table.lines().find(|l| l.starts_with("WARNING")).unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains("connection-reuse") && line.contains("no connection reuse toward it"), "{table}");
}

/// TIME_WAIT sockets `ss` lists toward `dst` in `ns`.
fn time_wait_toward(ns: &Netns, dst: &str) -> u64 {
    let out = ns.command("ss").args(["-Htan", "state", "time-wait", "dst", dst]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count() as u64
}

/// The port-exhaustion incident replayed as a new user would: nginx, a
/// range of 200 ports, and a client that opens a new connection per
/// request, closes it first and retries each failure 3 times (curl, in 4
/// loops). Once connect() fails with EADDRNOTAVAIL, doctor's first line
/// names the cause, not the symptom: no connection reuse, the ports
/// toward nginx held by TIME_WAIT of connections closed here, as many as
/// `ss` lists. Beside it, a pool (wrk) holding 150 of its 200 ports open
/// toward its own nginx is near its ports' end but never named.
#[test]
fn missing_reuse_is_named_as_the_cause_of_a_replayed_port_exhaustion() {
    // The daemon, for what only it knows: who opened them, how long they lived.
    let daemon = common::daemon::start_daemon(&[]);
    let from = format!("http://127.0.0.1:{}", daemon.port);
    let replay = narrow_range();
    let _nginx = Nginx::start(&replay, "127.0.0.1:8080");
    let client = CurlLoop::start(&replay, "http://127.0.0.1:8080/", 4);
    assert!(client.until_exhausted(Duration::from_secs(60)), "the client must meet EADDRNOTAVAIL");

    let path = replay.path().display().to_string();
    let before = time_wait_toward(&replay, "127.0.0.1:8080");
    let (code, report) = doctor(&["--netns", &path, "--from", &from]);
    let after = time_wait_toward(&replay, "127.0.0.1:8080");
    let cause = &report["findings"][0];
    assert_eq!((&cause["check"], &cause["verdict"]), (&"connection-reuse".into(), &"critical".into()), "{report:#}");
    assert!(cause["subject"].as_str().unwrap().contains("-> 127.0.0.1:8080: "), "{cause}");
    let used = cause["used"].as_u64().unwrap();
    assert!((before.min(after)..=before.max(after)).contains(&used), "ss listed {before} then {after}: {cause}");
    assert_eq!(cause["limit"], 200, "{cause}");
    assert_eq!(code, 2);
    let out = Command::new(OBSERVER).args(["doctor", "--netns", &path, "--from", &from]).output().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().to_string();
    assert!(
        summary.contains("cause: no connection reuse 127.0.0.1 -> 127.0.0.1:8080: ")
            && summary.contains(" of 200 ports held by TIME_WAIT of connections closed here")
            && summary.contains("; half lived under ")
            && summary.contains("; opened by curl ("),
        "{summary}"
    );

    let pooled = narrow_range();
    let _pool_server = Nginx::start(&pooled, "127.0.0.1:8080");
    let pool = Wrk::start(&pooled, "http://127.0.0.1:8080/", 150, Duration::from_secs(60));
    pool.until_open(&pooled, 150);
    let (code, report) = doctor(&["--netns", &pooled.path().display().to_string()]);
    assert!(
        findings(&report, "connection-reuse").iter().all(|f| f["verdict"] == "ok"),
        "a pool reuses its connections: {report:#}"
    );
    let ports = find(&report, "ephemeral-ports", "-> 127.0.0.1:8080");
    assert_eq!(ports["verdict"], "warning", "150 of 200 ports held open: {ports}");
    assert_eq!(code, 1, "{report:#}");
}

/// A server's limit nobody declared, as the daemon inferred it:
/// redis-server with `maxclients 5`, closing every further connection at
/// once while a pool keeps opening new ones. doctor, reading the daemon (--from), says
/// so; without a daemon to read at --from, it says why it cannot.
#[test]
fn a_server_limit_the_daemon_inferred_is_a_finding() {
    let daemon = common::daemon::start_daemon(&[]);
    let ns = Netns::new();
    let server = "127.0.0.1:27021";
    let _redis = Redis::start(&ns, server, 5);
    let mut pool = ns
        .command(&observer_testing::churn())
        .args(["connect", "--to", server, "--count", "120", "--hold", "--spread", "40s"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::daemon::scrape_until(&daemon, Duration::from_secs(40), |b| {
        observer_testing::http::sample(b, "observer_tcp_connection_limit_inferred", &["server_port=\"27021\""])
            == Some(5)
    });
    let from = format!("http://127.0.0.1:{}", daemon.port);
    let (code, report) = doctor(&["--from", &from]);
    let limit = find(&report, "server-limit", "127.0.0.1:27021");
    assert_eq!(limit["subject"], "127.0.0.1:27021 closes new connections at once above ~5 open: a server-side limit");
    assert_eq!((&limit["verdict"], &limit["used"]), (&"warning".into(), &5.into()), "{limit}");
    assert!(limit["next_step"].as_str().unwrap().contains("--connection-limits"), "{limit}");
    assert!(code >= 1, "{report:#}");
    assert_eq!(report["daemon"], format!("{from}/metrics"));

    // A --from that does not answer: exit 3, naming it.
    let nobody = format!("http://127.0.0.1:{}", observer_testing::http::free_port());
    let out = Command::new(OBSERVER).args(["doctor", "--from", &nobody]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(&nobody) && err.contains("is observer running there?"), "{err}");
    let _ = (pool.kill(), pool.wait());
}

#[test]
fn an_unaccepted_backlog_shows_what_ss_shows() {
    let ns = Netns::new();
    let server = ns.serve(&["--listen", "127.0.0.1:8082", "--backlog", "5", "--never-accept"]);
    let client = ns.client(&["--to", "127.0.0.1:8082", "--count", "3", "--hold"]);
    assert_eq!(client.connected, 3);
    let (_, report) = doctor(&["--netns", &format!("/run/netns/{}", ns.name)]);
    let queue = find(&report, "accept-queue", "127.0.0.1:8082");
    assert_eq!(queue["used"], ns.accept_queue(8082), "Recv-Q of ss -lnt: {queue}");
    assert_eq!(queue["limit"], 5, "Send-Q of ss -lnt: {queue}");
    assert_eq!(queue["verdict"], "warning");
    let owner = format!("observer-churn pid {}", server.pid());
    assert!(queue["subject"].as_str().unwrap().contains(&owner), "the owner: {queue}");
}

#[test]
fn a_process_near_its_file_limit_is_critical_and_pid_scopes_to_it() {
    let ns = Netns::new();
    let server = ns.serve_with_open_files_limit(10, &["--listen", "127.0.0.1:8083", "--hold"]);
    let pid = server.pid();
    let client = ns.client(&["--to", "127.0.0.1:8083", "--count", "5", "--hold"]);
    assert_eq!(client.connected, 5);
    std::thread::sleep(std::time::Duration::from_millis(200)); // accepted
    // The kernel's count of its descriptors (this kernel has it: 6.2+):
    // those /proc/PID/fd lists and the one its accept() in progress holds.
    let open = std::fs::metadata(format!("/proc/{pid}/fd")).unwrap().len();
    let listed = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64;
    assert_eq!(open, listed + 1, "{listed} listed");
    let (code, report) = doctor(&["--pid", &pid.to_string()]);
    let files = findings(&report, "open-files");
    assert_eq!(files.len(), 1, "--pid: only that process's files: {files:?}");
    assert_eq!((&files[0]["used"], &files[0]["limit"]), (&open.into(), &10.into()), "{:#}", files[0]);
    // The only finding near a ceiling in that namespace: it sets the exit
    // code (2 critical, 1 warning).
    let (verdict, exit) = if open >= 9 { ("critical", 2) } else { ("warning", 1) };
    assert_eq!(files[0]["verdict"], verdict);
    assert_eq!(code, exit, "{report:#}");
}

#[test]
fn a_healthy_namespace_exits_zero() {
    let ns = Netns::new();
    let (code, report) = doctor(&["--netns", &format!("/run/netns/{}", ns.name)]);
    assert_eq!(code, 0, "{report:#}");
    assert!(report["findings"].as_array().unwrap().iter().all(|f| f["verdict"] == "ok"));
    let out = Command::new(OBSERVER).args(["doctor", "--netns", &format!("/run/netns/{}", ns.name)]).output().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().to_string();
    assert!(
        summary.starts_with("1 network namespace, ") && summary.contains(": all ok; closest to its limit: "),
        "{summary}"
    );
    let (code, _) = doctor(&["--netns", "/run/netns/does-not-exist"]);
    assert_eq!(code, 3, "an unusable scope is an error, not a verdict");
}
