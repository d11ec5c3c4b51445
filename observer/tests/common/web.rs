//! Real software for the incidents' replays, in a test's namespace: nginx
//! (Debian's, unpacked by `cargo xtask setup`), a client that opens a new
//! connection per request and retries each failure 3 times (a curl loop,
//! as a CLI or a cron job in a loop does), a pool that keeps its
//! connections alive (wrk), and a database with a connection limit
//! (redis-server's `maxclients`, likewise unpacked).
use std::{
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use observer_testing::Netns;

/// A namespace of 200 ephemeral ports (50000-50199), none taken over from
/// TIME_WAIT (tcp_tw_reuse=0, as on a node whose traffic is not loopback):
/// the replays' narrow range, where ports run out first.
pub fn narrow_range() -> Netns {
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "50000 50199");
    ns.sysctl("net.ipv4.tcp_tw_reuse", "0");
    ns
}

/// A directory of the test's own, removed on drop.
fn own_dir(what: &str) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("observer-{what}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A server or client of a test, with a directory of its own (its
/// configuration, its log): killed, and its directory removed, on drop.
struct Running {
    child: Child,
    dir: PathBuf,
}

impl Running {
    /// The text of `file` in its directory (a log), or nothing yet.
    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Kill a child's whole process group (a loop's curl, not only its shell).
fn kill_group(child: &mut Child) {
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
}

/// nginx serving `200 ok` on one address, HTTP/1.1 keep-alive as shipped
/// (it closes a connection after 1,000 requests, or 75 s idle).
pub struct Nginx(Running);

impl Nginx {
    /// Listening on `listen` (e.g. 127.0.0.1:8080) in `ns`, answering.
    pub fn start(ns: &Netns, listen: &str) -> Self {
        let binary = std::env::var_os("OBSERVER_NGINX").map(PathBuf::from).unwrap_or_else(|| "nginx".into());
        let dir = own_dir("nginx");
        let d = dir.display();
        // Every path nginx writes to is the test's: it runs as root, in
        // the foreground, one process (its pid is the listener's owner).
        let config = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             server {{\n    listen {listen};\n    location / {{ return 200 \"ok\\n\"; }}\n  }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), config).unwrap();
        let child = ns
            .command(binary.to_str().unwrap())
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{}: {e}: run the tests with `cargo xtask test`, which installs it", binary.display())
            });
        let nginx = Self(Running { child, dir });
        let url = format!("http://{listen}/");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ns.command("curl").args(["-sf", "-o", "/dev/null", &url]).status().unwrap().success() {
            assert!(Instant::now() < deadline, "nginx does not answer at {url}: {}", nginx.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        nginx
    }

    pub fn pid(&self) -> u32 {
        self.0.child.id()
    }

    fn log(&self) -> String {
        self.0.read("error.log")
    }
}

/// `loops` shells, each running curl once per request toward `url`, one
/// after another, each curl retrying a failure 3 times a second apart: a
/// new connection per request, closed first by the client (curl exits
/// after the response; nginx would keep it alive).
pub struct CurlLoop {
    children: Vec<Child>,
    dir: PathBuf,
}

impl CurlLoop {
    pub fn start(ns: &Netns, url: &str, loops: usize) -> Self {
        let dir = own_dir("curl");
        // curl -v says "Immediate connect fail for ...: Cannot assign
        // requested address" for EADDRNOTAVAIL (its exit code, 7, is any
        // failure to connect): one line per such attempt.
        let failures = dir.join("eaddrnotavail");
        let script = format!(
            "while :; do\n  out=$(curl -sv -o /dev/null --retry 3 --retry-all-errors --retry-delay 1 {url} 2>&1)\n  \
             case $out in *'Cannot assign requested address'*) echo \"$out\" | grep -c 'Cannot assign' >> {f};; esac\n\
             done",
            f = failures.display()
        );
        let children = (0..loops)
            .map(|_| ns.command("bash").args(["-c", &script]).process_group(0).stdin(Stdio::null()).spawn().unwrap())
            .collect();
        Self { children, dir }
    }

    /// The connects that failed with EADDRNOTAVAIL so far, as curl said.
    pub fn eaddrnotavail(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("eaddrnotavail")).unwrap_or_default();
        text.lines().filter_map(|l| l.trim().parse::<u64>().ok()).sum()
    }

    /// Wait (at most `limit`) for the first EADDRNOTAVAIL.
    pub fn until_exhausted(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.eaddrnotavail() == 0 {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }
}

impl Drop for CurlLoop {
    fn drop(&mut self) {
        self.children.iter_mut().for_each(kill_group);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// wrk holding `connections` keep-alive connections toward `url` for
/// `duration`, each sending a request every 100 ms (a pool at a steady
/// rate, not a load test: the machine stays free for the rest).
pub struct Wrk {
    running: Running,
    /// `ss`'s filter for its connections (`dport = :8080`).
    toward: String,
}

impl Wrk {
    pub fn start(ns: &Netns, url: &str, connections: u32, duration: Duration) -> Self {
        let dir = own_dir("wrk");
        let script = dir.join("pace.lua");
        std::fs::write(&script, "function delay()\n  return 100\nend\n").unwrap();
        let child = ns
            .command("wrk")
            .args(["-t", "1", "-c", &connections.to_string(), "-d", &format!("{}s", duration.as_secs())])
            .arg("-s")
            .arg(&script)
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("wrk: run the tests with `cargo xtask test`, which installs it");
        let port = url.rsplit(':').next().unwrap().trim_end_matches('/');
        Self { running: Running { child, dir }, toward: format!("dport = :{port}") }
    }

    pub fn pid(&self) -> u32 {
        self.running.child.id()
    }

    /// Wait (at most 30 s) until all its `connections` are open, as `ss`
    /// lists them in `ns`.
    pub fn until_open(&self, ns: &Netns, connections: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while ns.established(&self.toward, Some(self.pid())) < connections {
            assert!(Instant::now() < deadline, "wrk's pool must open its {connections} connections");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// redis-server on `listen` in `ns`, holding at most `maxclients`
/// connections: past them it answers "-ERR max number of clients reached"
/// and closes each new one at once, as the first incident's database did.
pub struct Redis(Running);

impl Redis {
    pub fn start(ns: &Netns, listen: &str, maxclients: u32) -> Self {
        let binary = std::env::var_os("OBSERVER_REDIS").map(PathBuf::from).unwrap_or_else(|| "redis-server".into());
        let dir = own_dir("redis");
        let (addr, port) = listen.rsplit_once(':').unwrap();
        let child = ns
            .command(binary.to_str().unwrap())
            .args(["--bind", addr, "--port", port, "--maxclients", &maxclients.to_string()])
            // Nothing of its own on disk but its log: no snapshots, no
            // append-only file, its working directory the test's.
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{}: {e}: run the tests with `cargo xtask test`, which installs it", binary.display())
            });
        let redis = Running { child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !redis.read("log").contains("Ready to accept") {
            assert!(Instant::now() < deadline, "redis-server not ready: {}", redis.read("log"));
            std::thread::sleep(Duration::from_millis(50));
        }
        Self(redis)
    }
}
