//! The incidents observer exists for, reproduced in namespaces with the
//! kernel's ground truth checked: port exhaustion, TIME_WAIT, a listen
//! overflow, a lossy path, a connection storm, failures that all come at a
//! series' birth, and a server past a connection limit nobody declared. Shared by the tests that need every signal to have
//! data (the dashboards on a real Prometheus, the metric contract).
use observer_testing::{Netns, Server, churn};

/// The processes behind each incident, as the kernel's ground truth saw
/// them.
pub struct Culprits {
    pub ports: u32,
    /// A client whose EADDRNOTAVAIL all came in one burst at its start
    /// (its series is born above zero), and how many.
    pub burst: u32,
    pub burst_errors: u64,
    pub time_wait: u32,
    pub listener: u32,
    pub storm: u32,
    /// A client whose every handshake took a resent SYN.
    pub lossy: u32,
}

/// The incidents and what keeps them alive: their namespaces, servers and
/// the server-limit incident's pool, which runs on after the others.
pub struct Reproduced {
    pub culprits: Culprits,
    _namespaces: Vec<Netns>,
    _servers: Vec<Server>,
    _pool: KillOnDrop,
}

/// A child killed when the test is done with it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The server limit's address, and the connections its server holds.
pub const LIMITED_SERVER: &str = "127.0.0.1:27017";
pub const SERVER_LIMIT: u64 = 5;

/// The incidents, each spread over a few seconds so that the scrapes see
/// the counters grow (as in a real incident), each in its namespace. The
/// server limit first, in the background: observer judges its shape over
/// 15 s (`observer_tcp_connection_limit_inferred` comes ~17 s after this
/// starts and stays while the pool retries, 45 s: past the others and the
/// tests' reading of them).
pub fn reproduce_incidents() -> Reproduced {
    // A server past its connection limit (the first incident's database):
    // it holds SERVER_LIMIT and closes every further connection at once, while a
    // pool keeps opening new ones, 3 a second.
    let limited = Netns::new();
    let limit = SERVER_LIMIT.to_string();
    let limited_server = limited.serve(&["--listen", LIMITED_SERVER, "--hold", "--max-open", &limit]);
    let pool = KillOnDrop(
        limited
            .command(&churn())
            .args(["connect", "--to", LIMITED_SERVER, "--count", "135", "--hold", "--spread", "45s"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );

    // Port exhaustion: 6 ports, 9 held connections, 3 EADDRNOTAVAIL.
    let ports = Netns::new();
    ports.sysctl("net.ipv4.ip_local_port_range", "41000 41005");
    let holder = ports.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let client = ports.client(&["--to", "127.0.0.1:8080", "--count", "9", "--hold", "--spread", "6s"]);
    assert_eq!((client.connected, client.errors("EADDRNOTAVAIL")), (6, 3), "{client:?}");

    // The same at a series' birth: two ports, five attempts at once, the
    // three failures within one round (a short job that fails and exits).
    let burst = Netns::new();
    burst.sysctl("net.ipv4.ip_local_port_range", "42000 42001");
    let burst_holder = burst.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let burst_client = burst.client(&["--to", "127.0.0.1:8080", "--count", "5", "--hold"]);
    assert_eq!((burst_client.connected, burst_client.errors("EADDRNOTAVAIL")), (2, 3), "{burst_client:?}");

    // TIME_WAIT: client-first close, 25 connections.
    let tw = Netns::new();
    let tw_server = tw.serve(&["--listen", "127.0.0.1:7000", "--close-first", "client"]);
    let tw_client = tw.client(&["--to", "127.0.0.1:7000", "--count", "25", "--spread", "5s"]);
    assert_eq!(tw_client.connected, 25);

    // Listen overflow: a listener that never accepts, backlog 1.
    let lo = Netns::new();
    let listener = lo.serve(&["--listen", "127.0.0.1:8081", "--backlog", "1", "--never-accept"]);
    lo.client(&["--to", "127.0.0.1:8081", "--count", "12", "--nonblocking", "200ms", "--spread", "4s"]);
    assert!(lo.nstat("TcpExtListenOverflows") > 0, "the listener must overflow");

    // A lossy path: the firewall drops the first SYN of each connection
    // (every other SYN, connects one after another), so each handshake
    // takes a resent SYN and 1 s more.
    let lossy = Netns::new();
    let lossy_server = lossy.serve(&["--listen", "127.0.0.1:8443"]);
    observer_testing::netns::run(lossy.command("iptables").args([
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--syn",
        "--dport",
        "8443",
        "-m",
        "statistic",
        "--mode",
        "nth",
        "--every",
        "2",
        "--packet",
        "0",
        "-j",
        "DROP",
    ]));
    let resent_before = lossy.nstat("TcpExtTCPSynRetrans");
    let lossy_client = lossy.client(&["--to", "127.0.0.1:8443", "--count", "2"]);
    assert_eq!(lossy_client.connected, 2, "{lossy_client:?}");
    assert_eq!(lossy.nstat("TcpExtTCPSynRetrans") - resent_before, 2, "one SYN resent per connection");

    // A connection storm: connect, accept, close, spread over 4 s like the
    // others (a storm that comes and goes between two scrapes is a series
    // born above zero, which rate() cannot show: issue 18).
    let storm = Netns::new();
    storm.sysctl("net.ipv4.ip_local_port_range", "10000 65000");
    let child = storm
        .command(&churn())
        .args(["churn", "--threads", "2", "--connections", "30000", "--spread", "4s"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let storm_pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "churn: {}", String::from_utf8_lossy(&out.stdout));

    let culprits = Culprits {
        ports: client.pid,
        burst: burst_client.pid,
        burst_errors: burst_client.errors("EADDRNOTAVAIL"),
        time_wait: tw_client.pid,
        listener: listener.pid(),
        storm: storm_pid,
        lossy: lossy_client.pid,
    };
    Reproduced {
        culprits,
        _namespaces: vec![ports, burst, tw, lo, lossy, storm, limited],
        _servers: vec![holder, burst_holder, tw_server, listener, lossy_server, limited_server],
        _pool: pool,
    }
}
