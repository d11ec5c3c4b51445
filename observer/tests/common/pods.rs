//! Pods as kubelet makes them, for the attribution tests: cgroup v2
//! directories shaped like kubelet's and a pod's old connections.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use observer_testing::{Netns, Server};

/// The cgroup v2 mount (on this hybrid host /sys/fs/cgroup/unified).
pub fn cgroup2_root() -> PathBuf {
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
pub fn systemd_containerd_scope(root: &Path, qos: &str, pod_uid: &str, container_id: &str) -> PathBuf {
    root.join(format!(
        "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{}.slice/cri-containerd-{container_id}.scope",
        pod_uid.replace('-', "_")
    ))
}

/// Directories created for the test, removed deepest first on drop (they
/// are empty by then: their processes have exited).
pub struct Dirs(pub Vec<PathBuf>);

impl Dirs {
    pub fn create(&mut self, path: &Path) {
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

/// A pod (one container cgroup, systemd driver) whose shell opened
/// `connections` to the server on port 7000 of `ns` and holds them until
/// `close_all`, which closes them client-first (their TIME_WAIT entries are
/// the pod's) and returns once the kernel counted them, or `orphan_all`.
/// The shell lives on until the pod is dropped.
pub struct PodWithOldConnections {
    uid: String,
    id: String,
    client: Option<std::process::Child>,
    cgroup: Dirs,
    connections: u64,
}

/// A namespace with a server for `PodWithOldConnections` on port 7000.
pub fn namespace_with_server() -> (Netns, Server) {
    let ns = Netns::new();
    let server = ns.serve(&["--listen", "127.0.0.1:7000", "--close-first", "client"]);
    (ns, server)
}

/// A namespace whose server on port 7000 holds every connection until
/// told (`Server::close_oldest`), and whose orphans wait for it: with
/// `tcp_fin_timeout` above TIME_WAIT's 60 s, a client end closed first
/// (`PodWithOldConnections::orphan_all`) stays a full FIN-WAIT-2 socket,
/// held by no process, until the server's FIN puts it in TIME_WAIT.
pub fn namespace_with_holding_server() -> (Netns, Server) {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_fin_timeout", "600");
    let server = ns.serve(&["--listen", "127.0.0.1:7000", "--hold", "--close-on-input"]);
    (ns, server)
}

/// Wait (at most 10 s) until `ns` counted `entries` TIME_WAIT entries.
pub fn wait_for_time_wait_entries(ns: &Netns, entries: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ns.time_wait_entered() < entries && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

impl PodWithOldConnections {
    pub fn open(name: &str, logs: &mut Dirs, logs_root: &Path, ns: &Netns, connections: usize) -> Self {
        use std::io::{BufRead as _, BufReader};
        let tag = u64::from(std::process::id()) << 16 | u64::from(crc(name));
        let uid = format!("7c6b5a49-3827-4165-9a4b-{tag:012x}");
        let id = format!("{:064x}", 0xc0ffee_u64 * 1_000_003 + tag);
        let mut cgroup = Dirs(Vec::new());
        let path = systemd_containerd_scope(&cgroup2_root(), "besteffort", &uid, &id);
        cgroup.create(&path);
        logs.create(&logs_root.join(format!("shop_{name}_{uid}/client")));
        let fds: Vec<usize> = (3..3 + connections).collect();
        let open = fds.iter().map(|fd| format!("exec {fd}<>/dev/tcp/127.0.0.1/7000")).collect::<Vec<_>>().join("; ");
        let close = fds.iter().map(|fd| format!("{fd}>&-")).collect::<Vec<_>>().join(" ");
        let inner = format!("{open}; echo ready; read line; exec {close}; echo closed; read line");
        let script =
            format!("echo $$ > {}/cgroup.procs && exec ip netns exec {} bash -c '{inner}'", path.display(), ns.name);
        let mut client =
            Command::new("sh").args(["-c", &script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let mut ready = String::new();
        BufReader::new(client.stdout.as_mut().unwrap()).read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready", "the pod's connections did not open");
        Self { uid, id, client: Some(client), cgroup, connections: connections as u64 }
    }

    /// Close the connections and wait until `ns` (the pod's namespace)
    /// counted their TIME_WAIT entries (the server's FIN comes after the
    /// shell ended), at most 10 s.
    pub fn close_all(&mut self, ns: &Netns) {
        let before = ns.time_wait_entered();
        self.close_in_shell();
        wait_for_time_wait_entries(ns, before + self.connections);
    }

    /// Close the connections while the server (`namespace_with_holding_server`)
    /// holds its ends: they become orphans, full FIN-WAIT-2 sockets no
    /// process holds (returns once all are), whose TIME_WAIT entries come
    /// with the server's FIN.
    pub fn orphan_all(&mut self, ns: &Netns) {
        self.close_in_shell();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let ends = ns.closed_ends("dport = :7000");
            if ends.full_fin_wait2 >= self.connections && ends.fin_wait1 == 0 {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the pod's connections are not orphans yet:\n{}", ends.ss);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn close_in_shell(&mut self) {
        use std::io::Write as _;
        use std::io::{BufRead as _, BufReader};
        let client = self.client.as_mut().unwrap();
        writeln!(client.stdin.as_mut().unwrap()).unwrap();
        let mut closed = String::new();
        BufReader::new(client.stdout.as_mut().unwrap()).read_line(&mut closed).unwrap();
        assert_eq!(closed.trim(), "closed", "the pod's connections did not close");
    }

    /// The labels of the pod's unknown owner (pid 0).
    pub fn unknown_owner(&self, name: &str) -> Vec<String> {
        self.labels(name, 0, "unknown")
    }

    /// The labels of the pod's shell, which opened and holds the
    /// connections.
    pub fn holder(&self, name: &str) -> Vec<String> {
        self.labels(name, self.client.as_ref().unwrap().id(), "bash")
    }

    fn labels(&self, name: &str, pid: u32, executable: &str) -> Vec<String> {
        vec![
            format!("process_pid=\"{pid}\""),
            format!("process_executable_name=\"{executable}\""),
            format!("container_id=\"{}\"", self.id),
            format!("k8s_pod_uid=\"{}\"", self.uid),
            format!("k8s_pod_name=\"{name}\""),
            "k8s_namespace_name=\"shop\"".to_string(),
        ]
    }

    /// The pod is deleted: its cgroup goes. Its shell is moved out first
    /// and lives on until the returned guard drops: its process slot stays
    /// taken, so the only slot the pod can give back is its unknown owner's.
    pub fn remove(mut self) -> LiveProcess {
        let client = self.client.take().unwrap();
        std::fs::write(cgroup2_root().join("cgroup.procs"), client.id().to_string()).unwrap();
        LiveProcess(client)
    }
}

impl Drop for PodWithOldConnections {
    fn drop(&mut self) {
        // Before the cgroup's directories (dropped after this): a cgroup
        // with a process in it cannot be removed.
        if let Some(client) = self.client.take() {
            drop(LiveProcess(client));
        }
    }
}

/// A process killed (and reaped) when dropped.
pub struct LiveProcess(std::process::Child);

impl Drop for LiveProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A small stable number from a name, to keep the test pods apart.
fn crc(name: &str) -> u16 {
    name.bytes().fold(0u16, |h, b| h.wrapping_mul(31).wrapping_add(u16::from(b)))
}

/// Scrape `daemon` (at most 10 s) until the series with `labels` counts
/// `entries` TIME_WAIT entries, assert that it does (`context` and the
/// page's TIME_WAIT lines otherwise), and return the page.
pub fn scrape_time_wait_entries(
    daemon: &super::daemon::Daemon,
    labels: &[String],
    entries: u64,
    context: &str,
) -> String {
    use observer_testing::http::sample;
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let body = super::daemon::scrape_until(daemon, std::time::Duration::from_secs(10), |b| {
        sample(b, "observer_tcp_time_wait_entries_total", &labels) == Some(entries)
    });
    assert_eq!(
        sample(&body, "observer_tcp_time_wait_entries_total", &labels),
        Some(entries),
        "{context}\n{}",
        time_wait_lines(&body)
    );
    body
}

pub fn time_wait_lines(body: &str) -> String {
    body.lines().filter(|l| l.starts_with("observer_tcp_time_wait")).collect::<Vec<_>>().join("\n")
}
