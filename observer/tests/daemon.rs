//! The daemon end to end: `observer run` as a user starts it, a reproduced
//! port exhaustion, and a scrape of /metrics that must show the exact
//! counts. Also: bad input gives one clear message and a non-zero exit.
mod common;

use std::{
    io::Read as _,
    net::TcpListener,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::daemon::{OBSERVER, start_daemon, start_daemon_with_env};
use observer_testing::{
    Netns,
    http::{free_port, sample, scrape},
};

#[test]
fn scrape_shows_the_exact_eaddrnotavail_count_of_the_client() {
    let daemon = start_daemon(&[]);
    let ns = Netns::new();
    // An even-sized range: the kernel only uses an even number of ports.
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41005");
    let _server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let client = ns.client(&["--to", "127.0.0.1:8080", "--count", "9", "--hold"]);
    assert_eq!((client.connected, client.errors("EADDRNOTAVAIL")), (6, 3), "{client:?}");

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
    assert_eq!(sample(&body, "observer_tcp_connect_errors_total", &errors_labels), Some(3), "{body}");
    assert_eq!(sample(&body, "observer_tcp_connects_total", &[pid.as_str()]), Some(6), "{body}");
    assert_eq!(
        sample(&body, "observer_map_limit", &["observer_map_name=\"PROC_COUNTERS\""]),
        Some(observer_common::capacity::PROC_COUNTERS as u64)
    );
    // The socket-owner map at its default size evicts nothing here.
    assert_eq!(
        sample(&body, "observer_map_evictions_total", &["observer_map_name=\"SOCK_OWNERS\""]),
        Some(0),
        "{body}"
    );
    for hook in ["inet_stream_connect", "inet_csk_accept", "tcp_time_wait", "listen_overflow", "syn_queue_full"] {
        assert_eq!(sample(&body, "observer_probe_info", &[&format!("observer_hook=\"{hook}\"")]), Some(1), "{hook}");
    }
    // Self-telemetry: rounds took some time (each in the histogram), none
    // failed.
    let value = |name: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{")).and_then(|l| l.rsplit(' ').next()))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let (seconds, rounds) =
        (value("observer_collection_duration_seconds_sum"), value("observer_collection_duration_seconds_count"));
    assert!(seconds.is_some_and(|s| s > 0.0) && rounds.is_some_and(|n| n >= 1.0), "{body}");
    assert!(seconds.unwrap() / rounds.unwrap() < 10.0, "{body}");
    assert_eq!(sample(&body, "observer_collection_failures_total", &[]), Some(0), "{body}");
    // Every series says where it comes from.
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    assert!(
        body.lines().filter(|l| l.starts_with("observer_")).all(|l| l.contains(&format!("host_name=\"{host}\""))),
        "{body}"
    );
    // The kernel's skipped runs are reported for every program, zero or not.
    for program in ["sock_state", "connect_exit", "process_exit"] {
        let labels = [format!("observer_program=\"{program}\"")];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        assert!(sample(&body, "observer_kernel_missed_events_total", &labels).is_some(), "{program}: {body}");
    }
}

#[test]
fn an_exited_process_keeps_its_series_for_the_grace_period_only() {
    let daemon = start_daemon(&["--grace", "2s"]);
    let ns = Netns::new();
    let client = ns.client(&["--to", "127.0.0.1:9", "--count", "2"]);
    assert_eq!(client.errors("ECONNREFUSED"), 2);
    let labels = [format!("process_pid=\"{}\"", client.pid), "error_type=\"ECONNREFUSED\"".to_string()];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let value = || sample(&scrape(daemon.port).expect("scrape"), "observer_tcp_connect_errors_total", &labels);

    // The client has exited; its counts are still scraped...
    let deadline = Instant::now() + Duration::from_secs(10);
    while value().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen_at = Instant::now();
    // The two errors may be collected in two rounds: a scrape between
    // them reads 1. Wait for the second before comparing.
    while value().is_some_and(|n| n < 2) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(value(), Some(2));
    // ...and retired once the grace period has passed.
    while value().is_some() && Instant::now() < deadline + Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(value(), None, "series must be retired after the grace period");
    assert!(seen_at.elapsed() >= Duration::from_millis(1500), "retired too early: {:?}", seen_at.elapsed());
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

#[test]
fn no_btf_names_the_kernel_option() {
    let (code, stderr) =
        run_cli(&["run", "--prometheus-listen", "127.0.0.1:0", "--kernel-btf", "/nonexistent/vmlinux"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("no kernel BTF at /nonexistent/vmlinux") && stderr.contains("CONFIG_DEBUG_INFO_BTF"),
        "{stderr}"
    );
}

/// Run observer in a private mount namespace where tracefs is unmounted,
/// optionally without CAP_SYS_ADMIN (so it cannot mount it back). debugfs
/// goes too where it is mounted: its `tracing` directory mounts tracefs
/// again on the first look (a node with debugfs mounted failed the test).
fn run_without_tracefs(can_mount: bool) -> (i32, String) {
    let caps = if can_mount { "" } else { "setpriv --inh-caps=-all --bounding-set=-all,+bpf,+perfmon,+net_admin --" };
    let script = format!(
        "umount -l /sys/kernel/tracing 2>/dev/null; umount -l /sys/kernel/debug/tracing 2>/dev/null; \
         umount -l /sys/kernel/debug 2>/dev/null; \
         test -d /sys/kernel/tracing/events && exit 99; test -d /sys/kernel/debug/tracing/events && exit 99; \
         exec {caps} timeout --preserve-status -s INT 8 {OBSERVER} run --prometheus-listen 127.0.0.1:0"
    );
    let out = Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn missing_tracefs_is_mounted_when_possible_and_explained_otherwise() {
    let (code, stderr) = run_without_tracefs(true);
    assert_eq!(code, 0, "runs, then stops on SIGINT: {stderr}");
    assert!(stderr.contains("tracefs was not mounted; mounted it"), "{stderr}");

    let (code, stderr) = run_without_tracefs(false);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("tracefs is not mounted") && stderr.contains("mount -t tracefs"), "{stderr}");
}

#[test]
fn a_sigterm_while_the_probes_load_stops_the_daemon_cleanly() {
    use std::io::BufRead as _;
    let port = free_port();
    let mut child = Command::new(OBSERVER)
        .args(["run", "--prometheus-listen", &format!("127.0.0.1:{port}")])
        .args(["--attach-mode", &common::test_mode().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    // The first hook is attached, the others are still loading.
    while !log.contains(" attached ") {
        assert!(stderr.read_line(&mut log).unwrap() > 0, "observer exited: {log}");
    }
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    stderr.read_to_string(&mut log).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: a signal during loading must not kill the daemon uncleanly\n{log}");
    assert!(log.contains("shutting down"), "{log}");
}

/// SIGHUP neither stops nor resets the daemon; a restart starts from zero:
/// neither counts anything twice.
#[test]
fn sighup_and_restart_never_count_twice() {
    let daemon = start_daemon(&[]);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41005");
    let _server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold"]);
    let client = ns.client(&["--to", "127.0.0.1:8080", "--count", "9", "--hold"]);
    assert_eq!(client.errors("EADDRNOTAVAIL"), 3, "{client:?}");
    let labels = [format!("process_pid=\"{}\"", client.pid)];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let errors = |body: &str| sample(body, "observer_tcp_connect_errors_total", &labels);
    // Until all three: the client's errors can straddle two rounds.
    let body = common::daemon::scrape_until(&daemon, Duration::from_secs(10), |b| errors(b) == Some(3));
    assert_eq!(errors(&body), Some(3), "{body}");

    let hup = Command::new("kill").args(["-HUP", &daemon.child.id().to_string()]).status().unwrap();
    assert!(hup.success());
    std::thread::sleep(Duration::from_millis(600)); // three collections
    let body = daemon.scrape();
    assert_eq!(errors(&body), Some(3), "after SIGHUP: still serving, same count\n{}", daemon.log());
    assert!(daemon.log().contains("SIGHUP: nothing to reload"), "{}", daemon.log());

    // A new daemon counts what happens from its start, not what its
    // predecessor counted (a collector sees a new start time).
    drop(daemon);
    let restarted = start_daemon(&[]);
    let again = ns.client(&["--to", "127.0.0.1:8080", "--count", "2", "--hold"]);
    assert_eq!(again.errors("EADDRNOTAVAIL"), 2, "{again:?}");
    let again_labels = [format!("process_pid=\"{}\"", again.pid)];
    let again_labels: Vec<&str> = again_labels.iter().map(String::as_str).collect();
    let body = common::daemon::scrape_until(&restarted, Duration::from_secs(10), |b| {
        sample(b, "observer_tcp_connect_errors_total", &again_labels) == Some(2)
    });
    assert_eq!(sample(&body, "observer_tcp_connect_errors_total", &again_labels), Some(2), "{body}");
    assert_eq!(errors(&body), None, "the first client's errors belong to the first daemon: {body}");
}

/// `observer run --dry-run` with `env` set: (exit code, stdout, stderr).
fn dry_run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(OBSERVER).arg("run").arg("--dry-run").args(args).envs(env.iter().copied()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A configuration file in the temp directory, removed on drop.
struct ConfigFile(std::path::PathBuf);

fn config_file(text: &str) -> ConfigFile {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "observer-test-{}-{}.toml",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, text).unwrap();
    ConfigFile(path)
}

impl ConfigFile {
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn settings_come_from_flag_then_environment_then_file_then_default() {
    let file = config_file("interval = \"7s\"\ngrace = \"3m\"\nmax-processes = 50\n");
    let (code, out, err) = dry_run(
        &["--config", file.path(), "--interval", "9s"],
        &[("OBSERVER_INTERVAL", "8s"), ("OBSERVER_GRACE", "4m")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("interval = \"9s\""), "flag beats environment and file:\n{out}");
    assert!(out.contains("grace = \"4m\""), "environment beats file:\n{out}");
    assert!(out.contains("max-processes = 50"), "file beats default:\n{out}");
    assert!(out.contains("max-destinations = 100"), "default:\n{out}");
    // The printed settings are themselves a valid configuration file.
    let printed = config_file(&out);
    let (code, again, err) = dry_run(&["--config", printed.path()], &[]);
    assert_eq!((code, again.as_str()), (0, out.as_str()), "{err}");
    // The file can come from the environment too.
    let (code, out, _) = dry_run(&[], &[("OBSERVER_CONFIG", file.path())]);
    assert_eq!(code, 0);
    assert!(out.contains("interval = \"7s\""), "{out}");
}

/// OTLP settings follow the same order, with the standard OpenTelemetry
/// variables as their environment; header values never appear.
#[test]
fn otlp_settings_come_from_flag_then_otel_environment_then_file() {
    let file = config_file(
        "otlp-endpoint = \"http://file:4318\"\notlp-protocol = \"grpc\"\notlp-interval = \"30s\"\n\
         otlp-temporality = \"delta\"\n",
    );
    let (code, out, err) = dry_run(
        &["--config", file.path(), "--otlp-endpoint", "https://flag:4317"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("otlp-endpoint = \"https://flag:4317/\""), "flag beats environment and file:\n{out}");
    assert!(out.contains("otlp-protocol = \"http/protobuf\""), "environment beats file:\n{out}");
    assert!(out.contains("otlp-timeout = \"2s 500ms\""), "a bare number is milliseconds:\n{out}");
    assert!(out.contains("otlp-interval = \"30s\"") && out.contains("otlp-temporality = \"delta\""), "{out}");
    assert!(out.contains("otlp-headers = \"authorization=<hidden>\"") && !out.contains("s3cret"), "{out}");
    // No endpoint anywhere: no push.
    let (code, out, _) = dry_run(&[], &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert_eq!(code, 0);
    assert!(out.contains("no OTLP push") && !out.contains("otlp-protocol"), "{out}");
    // Bad values in the standard variables are named like bad flags.
    for (var, value, want) in [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317", "not an http(s) URL"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "invalid value 'http/json'"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization", "not key=value"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "0", "out of range"),
    ] {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
        let env = if var == endpoint.0 { vec![(var, value)] } else { vec![endpoint, (var, value)] };
        let (code, _, err) = dry_run(&[], &env);
        assert_eq!(code, observer::cli::USAGE_EXIT, "{var}={value}: {err}");
        assert!(err.contains(want) && err.contains("--otlp-"), "{var}={value}: {err}");
    }
}

#[test]
fn a_bad_configuration_file_is_one_error_naming_the_key_and_line() {
    for (text, expect) in [
        ("interval = \"5s\"\nintervall = \"5s\"\n", ["line 2", "unknown field `intervall`"]),
        ("\ngrace = \"soon\"\n", ["line 2", "not a duration"]),
        ("prometheus-listen = \"localhost\"\n", ["line 1", "invalid socket address"]),
        ("\n\notlp-endpoint = \"collector\"\n", ["line 3", "not a URL"]),
    ] {
        let file = config_file(text);
        let (code, _, err) = dry_run(&["--config", file.path()], &[]);
        assert_eq!(code, 1, "{err}");
        assert!(err.starts_with(&format!("error: configuration file {}", file.path())), "{err}");
        for want in expect {
            assert!(err.contains(want), "{want:?} not in: {err}");
        }
        assert_eq!(err.matches("error:").count(), 1, "one error: {err}");
    }
    let (code, _, err) = dry_run(&["--config", "/nonexistent/observer.toml"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/observer.toml") && err.contains("cannot read it"), "{err}");
    // Environment values are checked like flags.
    let (code, _, err) = dry_run(&[], &[("OBSERVER_INTERVAL", "soon")]);
    assert_eq!(code, observer::cli::USAGE_EXIT, "{err}");
    assert!(err.contains("not a duration"), "{err}");
}

#[test]
fn the_resource_names_the_service_node_and_host_and_honours_the_otel_environment() {
    let daemon = start_daemon_with_env(
        &[],
        &[("NODE_NAME", "node-test-7"), ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=ci,team=sre")],
    );
    let body = scrape(daemon.port).expect("scrape");
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let host_label = format!("host_name=\"{host}\"");
    let labels = [
        "service_name=\"observer\"",
        concat!("service_version=\"", env!("CARGO_PKG_VERSION"), "\""),
        "service_instance_id=\"node-test-7\"",
        "k8s_node_name=\"node-test-7\"",
        "os_type=\"linux\"",
        host_label.as_str(),
        "deployment_environment_name=\"ci\"",
        "team=\"sre\"",
    ];
    assert_eq!(sample(&body, "target_info", &labels), Some(1), "{body}");
    drop(daemon);

    let daemon = start_daemon_with_env(&[], &[("OTEL_SERVICE_NAME", "observer-ci")]);
    let body = scrape(daemon.port).expect("scrape");
    let labels = ["service_name=\"observer-ci\"", host_label.as_str()];
    assert_eq!(sample(&body, "target_info", &labels), Some(1), "{body}");
    assert!(!body.contains("k8s_node_name"), "no NODE_NAME, no node label: {body}");
}

/// The ceilings next to usage, as gauges per network namespace, equal to
/// what `ss` and the namespace's settings say.
#[test]
fn ceilings_are_exported_next_to_usage_per_namespace() {
    use std::os::unix::fs::MetadataExt as _;
    let daemon = start_daemon(&[]);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "41000 41009");
    let a = ns.serve_with_open_files_limit(64, &["--listen", "127.0.0.1:8080", "--hold"]);
    assert_eq!(ns.client(&["--to", "127.0.0.1:8080", "--count", "10", "--hold"]).connected, 10);
    let b = ns.serve(&["--listen", "127.0.0.1:8082", "--backlog", "5", "--never-accept"]);
    assert_eq!(ns.client(&["--to", "127.0.0.1:8082", "--count", "3", "--hold"]).connected, 3);
    let inode = std::fs::metadata(format!("/run/netns/{}", ns.name)).unwrap().ino();
    let netns = format!("observer_network_namespace=\"{inode}\"");
    let body = common::daemon::scrape_until(&daemon, Duration::from_secs(10), |b| {
        sample(b, "observer_ephemeral_port_usage", &[&netns, "server_port=\"8080\""]) == Some(10)
    });
    // What ss shows: every socket holding one of the 10 ports toward :8080.
    let ss = ns.command("ss").args(["-Htan", "state", "connected", "dst", "127.0.0.1:8080"]).output().unwrap();
    let held = String::from_utf8_lossy(&ss.stdout).lines().count() as u64;
    assert_eq!(sample(&body, "observer_ephemeral_port_usage", &[&netns, "server_port=\"8080\""]), Some(held), "{body}");
    assert_eq!(sample(&body, "observer_ephemeral_port_limit", &[&netns]), Some(10));
    assert_eq!(
        sample(&body, "observer_listen_queue_usage", &[&netns, "server_port=\"8082\""]),
        Some(ns.accept_queue(8082))
    );
    assert_eq!(sample(&body, "observer_listen_queue_limit", &[&netns, "server_port=\"8082\""]), Some(5));
    // Charged to the process that listens, as the kernel recorded it.
    let owner = format!("process_pid=\"{}\"", b.pid());
    assert_eq!(
        sample(&body, "observer_listen_queue_usage", &[&netns, "server_port=\"8082\"", &owner]),
        Some(ns.accept_queue(8082)),
        "{body}"
    );
    let tw = ns.command("ss").args(["-Htan", "state", "time-wait"]).output().unwrap();
    let tw = String::from_utf8_lossy(&tw.stdout).lines().count() as u64;
    assert_eq!(sample(&body, "observer_time_wait_usage", &[&netns]), Some(tw));
    assert_eq!(sample(&body, "observer_sysctl_net_ipv4_ip_local_port_range_low", &[&netns]), Some(41000));
    let host_buckets = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_max_tw_buckets").unwrap();
    assert_eq!(
        sample(&body, "observer_sysctl_net_ipv4_tcp_max_tw_buckets", &["observer_network_namespace=\"host\""]),
        host_buckets.trim().parse().ok(),
        "{body}"
    );

    // The server holding 10 accepted connections: its open files as the
    // kernel counts them (/proc/PID/fd's size, this kernel has it: the
    // entries listed there and the one its accept() in progress holds),
    // against the limit prlimit gave it.
    let pid = format!("process_pid=\"{}\"", a.pid());
    let fds = std::fs::metadata(format!("/proc/{}/fd", a.pid())).unwrap().len();
    let listed = std::fs::read_dir(format!("/proc/{}/fd", a.pid())).unwrap().count() as u64;
    assert!(listed >= 11 && fds == listed + 1, "listener, 10 connections, accept(): {fds}, {listed} listed");
    let body = common::daemon::scrape_until(&daemon, Duration::from_secs(10), |b| {
        sample(b, "observer_process_open_file_descriptor_usage", &[&pid]) == Some(fds)
    });
    assert_eq!(sample(&body, "observer_process_open_file_descriptor_usage", &[&pid]), Some(fds), "{body}");
    assert_eq!(sample(&body, "observer_process_open_file_descriptor_limit", &[&pid]), Some(64), "{body}");
}

/// Ports taken toward one destination at a steady pace: the estimated time
/// to exhaustion is the ports left over the pace at which the exported use
/// itself grew between two scrapes (within a factor of 2: the daemon's
/// window and the scrapes' do not start at the same moment).
#[test]
fn time_to_port_exhaustion_follows_the_pace_ports_are_taken() {
    use std::os::unix::fs::MetadataExt as _;
    const RANGE: u64 = 1000;
    let daemon = start_daemon(&[]);
    let ns = Netns::new();
    ns.sysctl("net.ipv4.ip_local_port_range", "40000 40999");
    let _server = ns.serve(&["--listen", "127.0.0.1:8080", "--hold", "--backlog", "1024"]);
    let inode = std::fs::metadata(format!("/run/netns/{}", ns.name)).unwrap().ino();
    let netns = format!("observer_network_namespace=\"{inode}\"");
    let labels = [netns.as_str(), "server_port=\"8080\""];
    let used = |body: &str| sample(body, "observer_ephemeral_port_usage", &labels);
    std::thread::scope(|s| {
        let client = s.spawn(|| ns.client(&["--to", "127.0.0.1:8080", "--count", "800", "--spread", "16s", "--hold"]));
        std::thread::sleep(Duration::from_secs(4));
        let (t1, body1) = (Instant::now(), daemon.scrape());
        std::thread::sleep(Duration::from_secs(5));
        let (t2, body2) = (Instant::now(), daemon.scrape());
        let (used1, used2) = (used(&body1).expect("ports used"), used(&body2).expect("ports used"));
        assert!(used2 > used1 && used2 < RANGE, "{used1} -> {used2}");
        let pace = (used2 - used1) as f64 / (t2 - t1).as_secs_f64();
        let expected = (RANGE - used2) as f64 / pace;
        let estimate = body2
            .lines()
            .find(|l| {
                l.starts_with("observer_ephemeral_port_time_to_exhaustion_seconds{")
                    && labels.iter().all(|w| l.contains(w))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        assert!(
            estimate.is_some_and(|e| e > expected / 2.0 && e < expected * 2.0),
            "estimate {estimate:?}, expected ~{expected:.1} s ({used1} -> {used2} ports in {:?})",
            t2 - t1
        );
        assert_eq!(client.join().unwrap().connected, 800);
    });
}

/// A listener opened before observer started: the kernel side never saw
/// its listen(), so its owner is found once through /proc.
#[test]
fn the_owner_of_a_listener_older_than_observer_is_found_through_proc() {
    use std::os::unix::fs::MetadataExt as _;
    let ns = Netns::new();
    let server = ns.serve(&["--listen", "127.0.0.1:8083", "--backlog", "3", "--never-accept"]);
    assert_eq!(ns.client(&["--to", "127.0.0.1:8083", "--count", "2", "--hold"]).connected, 2);
    let daemon = start_daemon(&[]);
    let inode = std::fs::metadata(format!("/run/netns/{}", ns.name)).unwrap().ino();
    let labels = [
        format!("observer_network_namespace=\"{inode}\""),
        "server_port=\"8083\"".to_string(),
        format!("process_pid=\"{}\"", server.pid()),
        "process_executable_name=\"observer-churn\"".to_string(),
    ];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let body = common::daemon::scrape_until(&daemon, Duration::from_secs(10), |b| {
        sample(b, "observer_listen_queue_usage", &labels).is_some()
    });
    assert_eq!(sample(&body, "observer_listen_queue_usage", &labels), Some(ns.accept_queue(8083)), "{body}");
}
