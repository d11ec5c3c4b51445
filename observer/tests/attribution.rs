//! Who is behind a count on a Kubernetes node, with real cgroups: cgroup v2
//! directories shaped like kubelet's (systemd driver with containerd, and
//! the cgroupfs driver), a matching kubelet pod-log tree under a test root,
//! and clients run inside those cgroups exhausting ports in namespaces. The
//! daemon's series must carry the right container id, pod uid, pod name,
//! namespace (and container name when the pod has one container); a host
//! process beside them gets none of these labels.
mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use common::daemon::{scrape_until, start_daemon};
use observer_testing::{Netns, Server, churn, http::sample};

/// The cgroup v2 mount (on this hybrid host /sys/fs/cgroup/unified).
fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .expect("a cgroup2 mount (the kernel's cgroup v2 hierarchy)")
}

/// kubelet's cgroup of a container (systemd driver, containerd) in a pod of
/// QoS class `qos`.
fn systemd_containerd_scope(root: &Path, qos: &str, pod_uid: &str, container_id: &str) -> PathBuf {
    root.join(format!(
        "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{}.slice/cri-containerd-{container_id}.scope",
        pod_uid.replace('-', "_")
    ))
}

/// Directories created for the test, removed deepest first on drop (they
/// are empty by then: their processes have exited).
struct Dirs(Vec<PathBuf>);

impl Dirs {
    fn create(&mut self, path: &Path) {
        let mut missing = Vec::new();
        let mut p = path.to_path_buf();
        while !p.exists() {
            missing.push(p.clone());
            p.pop();
        }
        std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        self.0.extend(missing.into_iter().rev());
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            let _ = std::fs::remove_dir_all(dir).or_else(|_| std::fs::remove_dir(dir));
        }
    }
}

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
        [pid_a, pid_b, pid_host].iter().all(|pid| errors(b, *pid, &[]).is_some())
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

/// Sockets opened in a pod before observer started have no known owner
/// process: their TIME_WAIT entries (in softirq, when the peer's FIN
/// arrives) are charged to pid 0 "unknown", but in the socket's own cgroup,
/// so the series still name the pod. Ground truth: the namespace's
/// TIME_WAIT entries (TcpExtTW + TcpExtTWKilled).
#[test]
fn time_wait_of_sockets_older_than_observer_names_their_pod() {
    use std::io::{BufRead as _, BufReader, Write as _};
    let tag = std::process::id();
    let uid = format!("7c6b5a49-3827-4165-9a4b-{tag:012x}");
    let id = format!("{:064x}", 0xc0ffee_u64 * 1_000_003 + u64::from(tag));
    let root = cgroup2_root();
    let mut dirs = Dirs(Vec::new());
    let cgroup = systemd_containerd_scope(&root, "besteffort", &uid, &id);
    dirs.create(&cgroup);
    let logs = std::env::temp_dir().join(format!("observer-pod-logs-old-{tag}"));
    let mut log_dirs = Dirs(Vec::new());
    log_dirs.create(&logs.join(format!("shop_legacy-client-0_{uid}/client")));

    // Three connections opened by a shell in the pod's cgroup, held until
    // it reads a line, then closed first by it (client-first: the TIME_WAIT
    // is the pod's).
    let ns = Netns::new();
    let _server = ns.serve(&["--listen", "127.0.0.1:7000", "--close-first", "client"]);
    let open = (3..=5).map(|fd| format!("exec {fd}<>/dev/tcp/127.0.0.1/7000")).collect::<Vec<_>>().join("; ");
    let inner = format!("{open}; echo ready; read line; exec 3>&- 4>&- 5>&-; sleep 1");
    let script =
        format!("echo $$ > {}/cgroup.procs && exec ip netns exec {} bash -c '{inner}'", cgroup.display(), ns.name);
    let mut client =
        Command::new("sh").args(["-c", &script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut ready = String::new();
    BufReader::new(client.stdout.as_mut().unwrap()).read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready", "the pod's connections did not open");

    let daemon = start_daemon(&["--pod-logs", logs.to_str().unwrap()]);
    writeln!(client.stdin.as_mut().unwrap()).unwrap();
    assert!(client.wait().unwrap().success());

    let pod = [
        "process_pid=\"0\"".to_string(),
        "process_executable_name=\"unknown\"".to_string(),
        format!("container_id=\"{id}\""),
        format!("k8s_pod_uid=\"{uid}\""),
        "k8s_pod_name=\"legacy-client-0\"".to_string(),
        "k8s_namespace_name=\"shop\"".to_string(),
    ];
    let pod: Vec<&str> = pod.iter().map(String::as_str).collect();
    let entered = ns.time_wait_entered();
    assert_eq!(entered, 3, "three client-first closes, three TIME_WAIT entries:\n{}", ns.ss_all());
    let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
        sample(b, "observer_tcp_time_wait_entries_total", &pod) == Some(entered)
    });
    assert_eq!(
        sample(&body, "observer_tcp_time_wait_entries_total", &pod),
        Some(entered),
        "{}",
        body.lines().filter(|l| l.starts_with("observer_tcp_time_wait")).collect::<Vec<_>>().join("\n")
    );
}
