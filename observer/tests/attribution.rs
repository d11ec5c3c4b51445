//! Who is behind a count on a Kubernetes node, with real cgroups: cgroup v2
//! directories shaped like kubelet's (systemd driver with containerd, and
//! the cgroupfs driver), a matching kubelet pod-log tree under a test root,
//! and clients run inside those cgroups exhausting ports in namespaces. The
//! daemon's series must carry the right container id, pod uid, pod name,
//! namespace (and container name when the pod has one container); a host
//! process beside them gets none of these labels.
mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use common::{
    daemon::{scrape_until, start_daemon},
    pods::{
        Dirs, PodWithOldConnections, cgroup2_root, namespace_with_holding_server, namespace_with_server,
        scrape_time_wait_entries, systemd_containerd_scope, time_wait_lines, wait_for_time_wait_entries,
    },
};
use observer_testing::{Netns, Server, churn, http::sample};

/// Run `observer-churn connect` in `ns`, inside cgroup `cgroup` (moved
/// there before it execs, so every event of it is charged there).
fn client_in_cgroup(ns: &Netns, cgroup: Option<&Path>, args: &[&str]) -> (u32, String) {
    let join = cgroup.map(|c| format!("echo $$ > {}/cgroup.procs && ", c.display())).unwrap_or_default();
    let script = format!("{join}exec ip netns exec {} {} connect {}", ns.name, churn(), args.join(" "));
    let child = Command::new("sh").args(["-c", &script]).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "client failed: {out:?}");
    (pid, String::from_utf8(out.stdout).unwrap())
}

/// Hold 6 ports of a 6-port range, then fail 3 times with EADDRNOTAVAIL.
fn exhaust(cgroup: Option<&Path>) -> (Netns, Server, u32) {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41005");
    let server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let (pid, out) = client_in_cgroup(&ns, cgroup, &["--to", "127.0.0.1:8080", "--count", "9", "--hold"]);
    assert!(out.contains("connected=6") && out.contains("EADDRNOTAVAIL:3"), "{out}");
    (ns, server, pid)
}

#[test]
fn series_name_the_container_and_pod_of_the_process() {
    let tag = std::process::id();
    let uid_a = format!("1f2e3d4c-5b6a-4789-8abc-{tag:012x}");
    let uid_b = format!("a0b1c2d3-e4f5-4a6b-9c8d-{tag:012x}");
    let id_a = format!("{:064x}", 0xa11ce_u64 * 1_000_003 + u64::from(tag));
    let id_b = format!("{:064x}", 0xb0b_u64 * 1_000_003 + u64::from(tag));

    let root = cgroup2_root();
    let mut dirs = Dirs(Vec::new());
    // systemd driver, containerd, a Burstable pod.
    let systemd = systemd_containerd_scope(&root, "burstable", &uid_a, &id_a);
    // cgroupfs driver, a BestEffort pod.
    let cgroupfs = root.join(format!("kubepods/besteffort/pod{uid_b}/{id_b}"));
    dirs.create(&systemd);
    dirs.create(&cgroupfs);

    // kubelet's pod logs: one pod with one container, one with two.
    let logs = std::env::temp_dir().join(format!("observer-pod-logs-{tag}"));
    let mut log_dirs = Dirs(Vec::new());
    log_dirs.create(&logs.join(format!("shop_payment-api-7d9f_{uid_a}/payment-api")));
    log_dirs.create(&logs.join(format!("batch_report-job-x1_{uid_b}/worker")));
    log_dirs.create(&logs.join(format!("batch_report-job-x1_{uid_b}/log-shipper")));

    let daemon = start_daemon(&["--pod-logs", logs.to_str().unwrap()]);
    let (_ns_a, _server_a, pid_a) = exhaust(Some(&systemd));
    let (_ns_b, _server_b, pid_b) = exhaust(Some(&cgroupfs));
    let (_ns_h, _server_h, pid_host) = exhaust(None);

    let errors = |body: &str, pid: u32, labels: &[&str]| {
        let mut all = vec![format!("process_pid=\"{pid}\""), "error_type=\"EADDRNOTAVAIL\"".to_string()];
        all.extend(labels.iter().map(|l| l.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        sample(body, "observer_tcp_connect_errors_total", &all)
    };
    let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
        // All three of each: a client's errors can straddle two rounds.
        [pid_a, pid_b, pid_host].iter().all(|pid| errors(b, *pid, &[]) == Some(3))
    });

    let a = [
        format!("container_id=\"{id_a}\""),
        format!("k8s_pod_uid=\"{uid_a}\""),
        "k8s_pod_name=\"payment-api-7d9f\"".to_string(),
        "k8s_namespace_name=\"shop\"".to_string(),
        "k8s_container_name=\"payment-api\"".to_string(),
    ];
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    assert_eq!(errors(&body, pid_a, &a), Some(3), "systemd/containerd pod:\n{}", lines_of(&body, pid_a));
    let connects_a = [&[format!("process_pid=\"{pid_a}\"")][..], &[format!("container_id=\"{id_a}\"")][..]].concat();
    let connects_a: Vec<&str> = connects_a.iter().map(String::as_str).collect();
    assert_eq!(sample(&body, "observer_tcp_connects_total", &connects_a), Some(6), "{}", lines_of(&body, pid_a));

    let b = [
        format!("container_id=\"{id_b}\""),
        format!("k8s_pod_uid=\"{uid_b}\""),
        "k8s_pod_name=\"report-job-x1\"".to_string(),
        "k8s_namespace_name=\"batch\"".to_string(),
    ];
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    assert_eq!(errors(&body, pid_b, &b), Some(3), "cgroupfs pod:\n{}", lines_of(&body, pid_b));
    assert!(
        !lines_of(&body, pid_b).contains("k8s_container_name"),
        "two containers: which one is not known:\n{}",
        lines_of(&body, pid_b)
    );

    assert_eq!(errors(&body, pid_host, &[]), Some(3));
    let host = lines_of(&body, pid_host);
    for label in ["container_id", "k8s_pod_uid", "k8s_pod_name", "k8s_namespace_name", "k8s_container_name"] {
        assert!(!host.contains(label), "a host process has no {label}:\n{host}");
    }
}

fn lines_of(body: &str, pid: u32) -> String {
    body.lines().filter(|l| l.contains(&format!("process_pid=\"{pid}\""))).collect::<Vec<_>>().join("\n")
}

/// Sockets a pod's shell opened before observer started and closes after:
/// observer enters their holder at start (the socket iterator and /proc),
/// so their TIME_WAIT entries (in softirq, when the server's FIN arrives)
/// name the shell and its pod, as if observer had seen the connect()s, and
/// none is charged to pid 0. Ground truth: the namespace's TIME_WAIT
/// entries (TcpExtTW + TcpExtTWKilled).
#[test]
fn time_wait_of_sockets_older_than_observer_names_their_holder_and_pod() {
    let logs = std::env::temp_dir().join(format!("observer-pod-logs-old-{}", std::process::id()));
    let mut log_dirs = Dirs(Vec::new());
    let (ns, _server) = namespace_with_server();
    let mut pod = PodWithOldConnections::open("legacy-client-0", &mut log_dirs, &logs, &ns, 3);

    let daemon = start_daemon(&["--pod-logs", logs.to_str().unwrap()]);
    pod.close_all(&ns);

    let entered = ns.time_wait_entered();
    assert_eq!(entered, 3, "three client-first closes, three TIME_WAIT entries:\n{}", ns.ss_all());
    let body = scrape_time_wait_entries(&daemon, &pod.holder("legacy-client-0"), entered, "the pod's shell");
    let unknown = pod.unknown_owner("legacy-client-0");
    let unknown: Vec<&str> = unknown.iter().map(String::as_str).collect();
    assert_eq!(sample(&body, "observer_tcp_time_wait_entries_total", &unknown), None, "{}", time_wait_lines(&body));
}

/// Sockets of a pod that no process holds any more at observer's start
/// (orphans: the shell closed them, the server still holds its ends) have
/// no owner to find: their TIME_WAIT entries, when the server closes, are
/// charged to pid 0 "unknown", but in the socket's own cgroup, so the
/// series still name the pod.
#[test]
fn time_wait_of_orphans_older_than_observer_names_their_pod() {
    let logs = std::env::temp_dir().join(format!("observer-pod-logs-orphans-{}", std::process::id()));
    let mut log_dirs = Dirs(Vec::new());
    let (ns, mut server) = namespace_with_holding_server();
    let mut pod = PodWithOldConnections::open("legacy-client-1", &mut log_dirs, &logs, &ns, 3);
    pod.orphan_all(&ns);

    let daemon = start_daemon(&["--pod-logs", logs.to_str().unwrap()]);
    server.close_oldest(3);
    wait_for_time_wait_entries(&ns, 3);

    let entered = ns.time_wait_entered();
    assert_eq!(entered, 3, "three orphans, three TIME_WAIT entries:\n{}", ns.ss_all());
    scrape_time_wait_entries(&daemon, &pod.unknown_owner("legacy-client-1"), entered, "the pod's unknown owner");
}
