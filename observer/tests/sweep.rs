//! The sweep on a node of many namespaces: every namespace exact against
//! `ss` once quiet, however many there are and however many sockets the
//! node holds (each dump walks them all, so cold namespaces take turns);
//! a namespace near its port ceiling read at once while others wait, a hot
//! one below the warning at its own pace; the
//! files held in each namespace closed when it goes; the bound counted.
//!
//! Its own test binary, one test at a time (`SERIAL`): the tests count the
//! node's namespaces, which other tests' namespaces would change.
mod common;

use std::{
    process::{Child, Stdio},
    sync::Mutex,
    time::Duration,
};

use common::daemon::{Daemon, scrape_until, start_daemon};
use observer_testing::{Netns, churn::Server, http::sample};

static SERIAL: Mutex<()> = Mutex::new(());

/// A namespace like a pod: a server on :8080 that holds what it accepts.
struct Pod {
    ns: Netns,
    _server: Server,
    netns_label: String,
}

impl Pod {
    fn new() -> Self {
        use std::os::unix::fs::MetadataExt as _;
        let ns = Netns::new();
        let server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
        let inode = std::fs::metadata(ns.path()).unwrap().ino();
        Self { ns, _server: server, netns_label: format!("observer_network_namespace=\"{inode}\"") }
    }

    /// `n` more connections to its server, held (the client exits; its
    /// sockets wait in FIN_WAIT2 for the server, holding their ports).
    fn connect(&self, n: u64) {
        let report = self.ns.client(&["--to", "127.0.0.1:8080", "--count", &n.to_string(), "--hold"]);
        assert_eq!(report.connected, n, "{report:?}");
    }

    /// Ports held toward the server, as `ss` counts them.
    fn ss_ports(&self) -> u64 {
        let out =
            self.ns.command("ss").args(["-Htan", "state", "connected", "dst", "127.0.0.1:8080"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count() as u64
    }

    fn observer_ports(&self, body: &str) -> Option<u64> {
        sample(body, "observer_ephemeral_port_usage", &[&self.netns_label, "server_port=\"8080\""])
    }
}

/// A namespace with `cycles` TIME_WAIT sockets (for 60 s): every dump of
/// any namespace walks them, so a dump is no longer nearly free.
fn node_with_sockets(cycles: u64) -> Netns {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_tw_reuse", "0");
    let out = ns
        .command(&observer_testing::churn::churn())
        .args(["churn", "--threads", "2", "--listen", "127.0.0.1:9300", "--connections", &cycles.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "churn failed: {}", String::from_utf8_lossy(&out.stderr));
    ns
}

/// How many namespaces the last round read as `reading`; None when the
/// scrape has no such series.
fn namespaces(body: &str, reading: &str) -> Option<u64> {
    sample(body, "observer_network_namespace_usage", &[&format!("observer_reading=\"{reading}\"")])
}

/// Until every pod's ports equal `ss` and no namespace waits; the body.
fn until_all_exact(daemon: &Daemon, pods: &[Pod]) -> String {
    let body = scrape_until(daemon, Duration::from_secs(60), |body| {
        namespaces(body, "deferred") == Some(0) && pods.iter().all(|p| p.observer_ports(body) == Some(p.ss_ports()))
    });
    for (i, pod) in pods.iter().enumerate() {
        assert_eq!(pod.observer_ports(&body), Some(pod.ss_ports()), "pod {i}: {}", pod.ns.ss_all());
    }
    assert_eq!(namespaces(&body, "deferred"), Some(0));
    body
}

#[test]
fn every_namespace_is_exact_against_ss_once_quiet_however_many_there_are() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let _busy = node_with_sockets(30_000);
    let pods: Vec<Pod> = (0..40).map(|_| Pod::new()).collect();
    for (i, pod) in pods.iter().enumerate() {
        pod.connect(i as u64 % 7 + 1);
    }
    let daemon = start_daemon(&[]);
    until_all_exact(&daemon, &pods);
    // Each changes again; each is read again.
    for (i, pod) in pods.iter().enumerate() {
        pod.connect(i as u64 % 3 + 1);
    }
    until_all_exact(&daemon, &pods);
}

/// `observer-churn connect` spreading `count` connections over `over`.
fn trickle(ns: &Netns, to: &str, count: u64, over: &str) -> Child {
    ns.command(&observer_testing::churn::churn())
        .args(["connect", "--to", to, "--count", &count.to_string(), "--spread", over])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_namespace_near_its_port_ceiling_is_read_at_once_while_changed_ones_wait() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let _busy = node_with_sockets(30_000);
    // Forty busy pods: each changes every round, more than a round's
    // budget of dumps can follow.
    let pods: Vec<Pod> = (0..40).map(|_| Pod::new()).collect();
    let mut trickles: Vec<Child> = pods.iter().map(|p| trickle(&p.ns, "127.0.0.1:8080", 600, "60s")).collect();
    let daemon = start_daemon(&[]);
    scrape_until(&daemon, Duration::from_secs(30), |body| namespaces(body, "deferred").is_some_and(|n| n > 0));

    // A namespace taking the ports of a 10-port range, one every 300 ms.
    let hot = Pod::new();
    hot.ns.sysctl("net.ipv4.ip_local_port_range", "41000 41009");
    let mut client = hot
        .ns
        .command(&observer_testing::churn::churn())
        .args(["connect", "--to", "127.0.0.1:8080", "--count", "10", "--hold", "--spread", "3s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Read while it fills: once all 10 are taken, observer says 10 while
    // cold namespaces are still waiting their turn.
    let body = scrape_until(&daemon, Duration::from_secs(20), |body| {
        hot.observer_ports(body) == Some(10) && namespaces(body, "deferred").is_some_and(|n| n > 0)
    });
    assert_eq!(hot.observer_ports(&body), Some(hot.ss_ports()), "{}", hot.ns.ss_all());
    assert!(
        namespaces(&body, "deferred").is_some_and(|n| n > 0),
        "the busy pods were all read: the test proves nothing"
    );
    let _ = client.kill();
    let _ = client.wait();
    for t in &mut trickles {
        let _ = t.kill();
        let _ = t.wait();
    }
}

/// A namespace whose most used destination holds half its ports or more is
/// hot: dumped whenever it changes if it could be near the warning (70%:
/// its last reading plus every connect() since), at its own pace below
/// that (a dump walks every socket of the node), and exact once quiet.
#[test]
fn a_hot_namespace_is_read_at_its_own_pace_below_the_warning_and_every_round_near_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let daemon = start_daemon(&[]);
    let pod = Pod::new();
    pod.ns.sysctl("net.ipv4.ip_local_port_range", "40000 40999");
    // The clients' ends wait for the server's FIN as orphans: for 10 min,
    // not the default 60 s, which a slow run could reach.
    pod.ns.sysctl("net.ipv4.tcp_fin_timeout", "600");
    // 550 of 1,000 ports: hot, below the warning.
    pod.connect(550);
    until_all_exact(&daemon, std::slice::from_ref(&pod));

    // Changing every 500 ms (rounds are 200 ms): it waits its turn, the
    // one namespace waiting. No other changes here but the host's, which
    // is cold and read first (a round always reads one cold namespace).
    let mut slow = trickle(&pod.ns, "127.0.0.1:8080", 20, "10s");
    let waiting = |body: &str| namespaces(body, "deferred");
    let body = scrape_until(&daemon, Duration::from_secs(15), |body| waiting(body) == Some(1));
    assert_eq!(waiting(&body), Some(1), "read every round it changed: {body}");

    // 200 more at once: 750 could be held, past the warning: read every
    // round from now on, while a trickle changes it every round.
    pod.connect(200);
    let mut fast = trickle(&pod.ns, "127.0.0.1:8080", 100, "10s");
    let body =
        scrape_until(&daemon, Duration::from_secs(10), |body| pod.observer_ports(body).is_some_and(|n| n >= 750));
    assert!(pod.observer_ports(&body).is_some_and(|n| n >= 750), "{body}");
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(300));
        let body = daemon.scrape();
        assert_eq!(waiting(&body), Some(0), "a namespace near its ceiling waited: {body}");
    }
    for t in [&mut slow, &mut fast] {
        let _ = t.wait();
    }
    until_all_exact(&daemon, std::slice::from_ref(&pod));
}

/// Namespaces whose files a process holds: its open `net/sockstat`
/// files, one per namespace (nothing else opens that file). The link reads
/// `/proc/<tid>/net/sockstat (deleted)` once the opening thread ended.
fn held_namespaces(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return 0 };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| {
            let target = target.to_string_lossy();
            target.ends_with("/net/sockstat") || target.ends_with("/net/sockstat (deleted)")
        })
        .count()
}

#[test]
fn files_held_in_each_namespace_close_when_it_goes_and_the_bound_is_counted() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let found = observer::node::netns::all(std::path::Path::new("/proc")).len();
    let max = (found + 2).to_string();
    let daemon = start_daemon(&["--max-namespaces", &max]);
    let pid = daemon.child.id();
    // (A namespace of an earlier test may still be going: its files are
    // held a round after it went.)
    let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
        namespaces(b, "current") == Some(found as u64) && held_namespaces(pid) == found
    });
    assert_eq!(namespaces(&body, "unread"), Some(0), "{body}");
    assert_eq!(held_namespaces(pid), found);

    // Four more than there was room for two of.
    let pods: Vec<Pod> = (0..4).map(|_| Pod::new()).collect();
    // (Read in turn: they may wait a round or two, as deferred.)
    let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
        namespaces(b, "unread") == Some(2) && namespaces(b, "deferred") == Some(0)
    });
    assert_eq!(namespaces(&body, "unread"), Some(2), "{body}");
    assert_eq!(namespaces(&body, "current"), Some(found as u64 + 2), "{body}");
    assert!(daemon.log().contains("raise it to read them"), "{}", daemon.log());
    assert_eq!(held_namespaces(pid), found + 2);

    // Gone, and their files closed (a round later: the round's count of
    // listen overflows of a namespace gone is still read).
    drop(pods);
    scrape_until(&daemon, Duration::from_secs(10), |b| {
        namespaces(b, "current") == Some(found as u64) && held_namespaces(pid) == found
    });
    assert_eq!(held_namespaces(pid), found);
}

/// A pod's network namespace carries its pod's labels on the ceiling
/// gauges, from the pod's process in it (kubelet's cgroup and pod logs).
#[test]
fn a_pods_namespace_is_named_by_its_pod() {
    use common::pods::{Dirs, cgroup2_root, systemd_containerd_scope};
    use std::os::unix::fs::MetadataExt as _;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let logs_root = std::env::temp_dir().join(format!("observer-pod-logs-sweep-{}", std::process::id()));
    let uid = format!("5e1f2a3b-4c5d-4e6f-8a9b-{:012x}", std::process::id());
    let id = format!("{:064x}", 0xbeef_u64 << 20 | u64::from(std::process::id()));
    let (mut logs, mut cgroup) = (Dirs(Vec::new()), Dirs(Vec::new()));
    logs.create(&logs_root.join(format!("shop_web-0_{uid}/app")));
    let scope = systemd_containerd_scope(&cgroup2_root(), "burstable", &uid, &id);
    cgroup.create(&scope);
    // Only the pod's process holds the namespace besides `ip netns`.
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41009");
    let script = format!("echo $$ > {}/cgroup.procs && exec ip netns exec {} sleep 60", scope.display(), ns.name);
    let mut pod = std::process::Command::new("sh").args(["-c", &script]).spawn().unwrap();

    let daemon = start_daemon(&["--pod-logs", logs_root.to_str().unwrap()]);
    let inode = std::fs::metadata(ns.path()).unwrap().ino();
    let labels = [
        format!("observer_network_namespace=\"{inode}\""),
        format!("k8s_pod_uid=\"{uid}\""),
        "k8s_pod_name=\"web-0\"".to_string(),
        "k8s_namespace_name=\"shop\"".to_string(),
    ];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
        sample(b, "observer_ephemeral_port_limit", &labels).is_some()
    });
    assert_eq!(sample(&body, "observer_ephemeral_port_limit", &labels), Some(10), "{body}");
    // The host's namespace is no pod's.
    let host = body.lines().find(|l| l.starts_with("observer_ephemeral_port_limit{") && l.contains("\"host\""));
    assert!(host.is_some_and(|l| !l.contains("k8s_pod")), "{host:?}");
    let _ = pod.kill();
    let _ = pod.wait();
    drop(cgroup);
}

/// The open files each namespace costs, as `--max-namespaces` and the
/// daemon's RLIMIT_NOFILE warning count them.
#[test]
fn each_namespace_holds_the_files_the_bound_counts() {
    use observer::node::sweep::{FILES_PER_NAMESPACE, NetnsFiles};
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let open = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let before = open();
    let files = NetnsFiles::open(true).unwrap();
    assert_eq!(open() - before, FILES_PER_NAMESPACE as usize);
    drop(files);
    assert_eq!(open(), before);
}
