//! The image `cargo xtask image` built, run with podman and runc exactly as
//! the DaemonSet runs it: its command, arguments, environment, volumes,
//! mounts, security context and limits are read from `kubectl kustomize
//! deploy/...` and translated (`run_args`), never restated here; a field the
//! translation does not know fails the test rather than being dropped. Once
//! privileged, once as the least-privilege variant. In each: every hook
//! attaches; port exhaustion, TIME_WAIT and a listen overflow made on the
//! host are counted exactly against the kernel; a process in a
//! kubelet-shaped pod gets its pod's labels through the /host mounts; the
//! probes' endpoints answer; `observer top` and `observer trace` work
//! through `podman exec` as through `kubectl exec`; SIGTERM ends the
//! container within its grace period, after a last OTLP push.
//!
//! One deviation, as this machine has no CNI: the container shares the
//! host's network (the DaemonSet's pod network would), so the metrics port
//! is the node's 9464 and the two tests take turns.
mod common;
#[path = "common/otlp_sink.rs"]
mod otlp_sink;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use common::{
    manifests::{config_map, documents, kustomize, pod_spec, repo},
    pods::{Dirs, PodWithOldConnections, namespace_with_server},
};
use observer_testing::{
    Netns,
    http::{free_port, get_within, sample, sample_sum},
};
use otlp_sink::{Sink, Value};
use serde_json::Value as Json;

/// The two variants use the node's metrics port in turn.
static SERIAL: Mutex<()> = Mutex::new(());

/// The OCI archive `cargo xtask test` builds with `cargo xtask image`.
fn archive() -> PathBuf {
    let path = std::env::var_os("OBSERVER_IMAGE").map(PathBuf::from).expect(
        "OBSERVER_IMAGE is not set: run the tests with `cargo xtask test`, which builds the image (cargo xtask image)",
    );
    assert!(path.exists(), "{}: no image archive; `cargo xtask image` writes it", path.display());
    path
}

/// podman with a storage of the test's own (vfs: no overlay needed) and
/// runc (crun refuses hybrid cgroup hosts like this one).
struct Podman {
    /// The image store, under target/ (reused by the next run).
    root: PathBuf,
    /// Run-time state: `runroot_of(root)`.
    runroot: PathBuf,
}

/// podman refuses a `--runroot` longer than this ("the specified runroot
/// is longer than 50 characters").
const PODMAN_RUNROOT_MAX: usize = 50;

/// podman's run-time state (`--runroot`) for the store at `root`: not under
/// the checkout, whose path may be of any length, but a short directory
/// of the test's own in /run. One per store, named by a hash of its path:
/// podman's database keeps the runroot a store was first used with and
/// refuses another, and two checkouts must not share one.
fn runroot_of(root: &Path) -> PathBuf {
    // FNV-1a: stable across toolchains, unlike std's DefaultHasher.
    let hash = root
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    PathBuf::from(format!("/run/observer-test-podman-{:08x}", hash as u32))
}

impl Podman {
    fn new(root: PathBuf) -> Self {
        let runroot = runroot_of(&root);
        assert!(
            runroot.as_os_str().len() <= PODMAN_RUNROOT_MAX,
            "podman's runroot {} is longer than the {PODMAN_RUNROOT_MAX} characters podman takes",
            runroot.display()
        );
        std::fs::create_dir_all(&runroot).unwrap_or_else(|e| panic!("mkdir {}: {e}", runroot.display()));
        // Removed when the test binary exits (libtest ends with exit(),
        // which runs atexit handlers): nothing of it outlives the run.
        extern "C" fn remove_runroot() {
            if let Some(podman) = PODMAN.get() {
                let _ = std::fs::remove_dir_all(&podman.runroot);
            }
        }
        // SAFETY: registers a function that takes no arguments and only
        // removes a directory.
        unsafe { nix::libc::atexit(remove_runroot) };
        Self { root, runroot }
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.arg("--root").arg(&self.root).arg("--runroot").arg(&self.runroot);
        cmd.args(["--storage-driver", "vfs", "--runtime", "runc"]);
        cmd
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("podman (cargo xtask setup installs it)");
        assert!(out.status.success(), "podman {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

static PODMAN: OnceLock<Podman> = OnceLock::new();

/// The archive loaded once per test binary, as a user loads it.
fn podman() -> &'static Podman {
    PODMAN.get_or_init(|| {
        // Under target/, reused by the next run (a vfs copy of the image).
        // Not target/podman/root: a store made before the runroot moved
        // keeps the old runroot in its database, which podman would refuse.
        let podman = Podman::new(repo().join("target/podman/images"));
        let loaded = podman.run(&["load", "-i", archive().to_str().unwrap()]);
        assert!(loaded.contains(&format!("localhost/observer:{}", env!("CARGO_PKG_VERSION"))), "{loaded}");
        podman
    })
}

/// A running container, removed (with its storage) when dropped.
struct Container {
    name: String,
}

impl Container {
    fn logs(&self) -> String {
        let out = podman().cmd().args(["logs", &self.name]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the container's log:\n{}", self.logs());
        }
        let _ = podman().cmd().args(["rm", "-f", "-t", "0", &self.name]).output();
    }
}

/// Kubernetes' `$(VAR)` references to variables defined before, as kubelet
/// expands them (an unknown one stays as written).
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = value.to_string();
    for (name, v) in env {
        out = out.replace(&format!("$({name})"), v);
    }
    out
}

/// `128Mi` -> podman's `128m`; `500m` CPUs -> `0.5`.
fn memory(quantity: &str) -> String {
    let (n, unit) = quantity.split_at(quantity.find(|c: char| !c.is_ascii_digit()).unwrap_or(quantity.len()));
    match unit {
        "Mi" => format!("{n}m"),
        "Gi" => format!("{n}g"),
        "" => n.to_string(),
        _ => panic!("memory quantity {quantity}: teach the test its unit"),
    }
}

fn cpus(quantity: &str) -> String {
    match quantity.strip_suffix('m') {
        Some(milli) => format!("{}", milli.parse::<f64>().unwrap() / 1000.0),
        None => quantity.to_string(),
    }
}

/// Keys of `object` the translation knows; anything else fails the test.
fn only_known(object: &Json, what: &str, known: &[&str]) {
    for key in object.as_object().map(|o| o.keys()).into_iter().flatten() {
        assert!(known.contains(&key.as_str()), "{what}.{key}: the test does not know how to run it; teach run_args");
    }
}

/// `podman run` arguments for the DaemonSet's pod as the rendered manifests
/// give it, on this node named `node`; ConfigMap volumes are written under
/// `dir`. Returns (arguments before the image, the image, arguments after).
fn run_args(docs: &[Json], node: &str, dir: &Path, extra_env: &[(&str, &str)]) -> (Vec<String>, String, Vec<String>) {
    let pod = pod_spec(docs);
    // Scheduling and API-access fields have nothing to do on one node.
    only_known(
        pod,
        "pod",
        &[
            "serviceAccountName",
            "automountServiceAccountToken",
            "priorityClassName",
            "tolerations",
            "hostPID",
            "terminationGracePeriodSeconds",
            "containers",
            "volumes",
        ],
    );
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one container");
    let c = &containers[0];
    only_known(
        c,
        "container",
        &[
            "name",
            "image",
            "args",
            "command",
            "ports",
            "env",
            "securityContext",
            "resources",
            "livenessProbe",
            "readinessProbe",
            "volumeMounts",
        ],
    );
    // The pod network is the host's here (no CNI: see the module comment).
    let mut args: Vec<String> = vec!["--network=host".into()];
    if pod["hostPID"] == true {
        args.push("--pid=host".into());
    }
    // podman's default ulimits are above this node's hard limits, which root
    // cannot raise here (no CAP_SYS_RESOURCE): the node's open-files limit,
    // as kubelet's runtime would give it, and a process limit runc can set
    // (the node's own it refuses).
    let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap().1;
    args.push(format!("--ulimit=nofile={nofile}:{nofile}"));
    args.push("--ulimit=nproc=4096:4096".into());

    let sc = &c["securityContext"];
    only_known(
        sc,
        "securityContext",
        &[
            "privileged",
            "allowPrivilegeEscalation",
            "readOnlyRootFilesystem",
            "seccompProfile",
            "appArmorProfile",
            "capabilities",
        ],
    );
    if sc["privileged"] == true {
        args.push("--privileged".into());
    }
    for cap in sc["capabilities"]["drop"].as_array().into_iter().flatten() {
        args.push(format!("--cap-drop={}", cap.as_str().unwrap().to_lowercase()));
    }
    for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
        args.push(format!("--cap-add=CAP_{}", cap.as_str().unwrap()));
    }
    if sc["allowPrivilegeEscalation"] == false {
        args.push("--security-opt=no-new-privileges".into());
    }
    if sc["readOnlyRootFilesystem"] == true {
        args.push("--read-only".into());
    }
    for (field, opt) in [("seccompProfile", "seccomp"), ("appArmorProfile", "apparmor")] {
        match sc[field]["type"].as_str() {
            None | Some("RuntimeDefault") => {}
            Some("Unconfined") => args.push(format!("--security-opt={opt}=unconfined")),
            Some(other) => panic!("{field} {other}: teach run_args"),
        }
    }
    let limits = &c["resources"]["limits"];
    only_known(limits, "resources.limits", &["cpu", "memory"]);
    if let Some(m) = limits["memory"].as_str() {
        args.push(format!("--memory={}", memory(m)));
    }
    if let Some(cpu) = limits["cpu"].as_str() {
        args.push(format!("--cpus={}", cpus(cpu)));
    }

    let mut env: Vec<(String, String)> = Vec::new();
    for var in c["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = var["value"].as_str() {
            expand(v, &env)
        } else if let Some(field) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            assert_eq!(field, "spec.nodeName", "{name}: teach run_args the field {field}");
            node.to_string()
        } else if let Some(key) = var["valueFrom"]["configMapKeyRef"].as_object() {
            let map = config_map(docs, key["name"].as_str().unwrap());
            map["data"][key["key"].as_str().unwrap()].as_str().expect("the key is in the ConfigMap").to_string()
        } else {
            panic!("{name}: teach run_args where its value comes from: {var}");
        };
        env.push((name, value));
    }
    // The user's OTLP collector, set the way the DaemonSet's comment shows.
    env.extend(extra_env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    for (k, v) in &env {
        args.push(format!("--env={k}={v}"));
    }

    let volumes: HashMap<&str, &Json> =
        pod["volumes"].as_array().unwrap().iter().map(|v| (v["name"].as_str().unwrap(), v)).collect();
    for mount in c["volumeMounts"].as_array().into_iter().flatten() {
        only_known(mount, "volumeMount", &["name", "mountPath", "readOnly", "mountPropagation"]);
        let volume = volumes[mount["name"].as_str().unwrap()];
        only_known(volume, "volume", &["name", "hostPath", "configMap"]);
        let source = if let Some(host) = volume["hostPath"].as_object() {
            let path = PathBuf::from(host["path"].as_str().unwrap());
            match host.get("type").and_then(Json::as_str) {
                Some("Directory") => assert!(path.is_dir(), "hostPath {}: no such directory here", path.display()),
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&path).unwrap(),
                other => panic!("hostPath type {other:?}: teach run_args"),
            }
            path
        } else {
            let map = config_map(docs, volume["configMap"]["name"].as_str().unwrap());
            let files = dir.join(volume["name"].as_str().unwrap());
            std::fs::create_dir_all(&files).unwrap();
            for (key, text) in map["data"].as_object().unwrap() {
                std::fs::write(files.join(key), text.as_str().unwrap()).unwrap();
            }
            files
        };
        let mut options = Vec::new();
        if mount["readOnly"] == true {
            options.push("ro");
        }
        match mount["mountPropagation"].as_str() {
            None | Some("None") => {}
            Some("HostToContainer") => options.push("rslave"),
            Some(other) => panic!("mountPropagation {other}: teach run_args"),
        }
        let target = mount["mountPath"].as_str().unwrap();
        args.push(format!("--volume={}:{target}:{}", source.display(), options.join(",")));
    }
    if let Some(command) = c["command"].as_array() {
        args.push(format!("--entrypoint={}", serde_json::to_string(command).unwrap()));
    }
    let after = c["args"].as_array().into_iter().flatten().map(|a| a.as_str().unwrap().to_string()).collect();
    (args, c["image"].as_str().unwrap().to_string(), after)
}

/// The container port a probe names (by name or number).
fn probe_port(container: &Json, probe: &str) -> (u16, String) {
    let get = &container[probe]["httpGet"];
    let port = match &get["port"] {
        Json::Number(n) => n.as_u64().unwrap() as u16,
        Json::String(name) => container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == *name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap() as u16,
        other => panic!("{probe} port {other}"),
    };
    (port, get["path"].as_str().unwrap().to_string())
}

fn scrape_until(port: u16, limit: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let body = get_within(port, "/metrics", Duration::from_secs(5)).unwrap_or_default();
        if done(&body) || Instant::now() > deadline {
            return body;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn daemonset_container_counts_exactly(variant: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let docs = documents(&kustomize(format!("deploy/{variant}")));
    let spec = pod_spec(&docs);
    let container = &spec["containers"][0];
    let (ready_port, ready_path) = probe_port(container, "readinessProbe");
    let (live_port, live_path) = probe_port(container, "livenessProbe");
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);

    let sink_port = free_port();
    let sink = Sink::http(sink_port);
    let endpoint = format!("http://127.0.0.1:{sink_port}");
    let otlp = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")];
    let dir = std::env::temp_dir().join(format!("observer-image-{}-{variant}", std::process::id()));
    let node = format!("node-{variant}");
    let (args, image, after) = run_args(&docs, &node, &dir, &otlp);
    let name = format!("observer-test-{}-{variant}", std::process::id());
    let mut run = vec!["run", "--detach", "--name", &name];
    run.extend(args.iter().map(String::as_str));
    run.push(&image);
    run.extend(after.iter().map(String::as_str));
    podman().run(&run);
    let container_guard = Container { name: name.clone() };

    // Ready once every hook is attached.
    let deadline = Instant::now() + Duration::from_secs(60);
    while get_within(ready_port, &ready_path, Duration::from_secs(2)).is_none_or(|b| !b.contains("ready")) {
        assert!(Instant::now() < deadline, "{variant}: never ready:\n{}", container_guard.logs());
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(get_within(live_port, &live_path, Duration::from_secs(2)).is_some(), "{variant}: {live_path}");
    let body = scrape_until(ready_port, Duration::from_secs(10), |b| b.contains("observer_probe_info"));
    for hook in observer::probes::hooks::HOOKS {
        let attached = sample(&body, "observer_probe_info", &[&format!("observer_hook=\"{}\"", hook.name)]);
        assert_eq!(attached, Some(1), "{variant}: hook {} not attached:\n{}", hook.name, container_guard.logs());
    }
    assert!(body.contains(&format!("host_name=\"{node}\"")), "{variant}: the node's name from the downward API");

    // Port exhaustion: 6 ports, 9 held connections, 3 EADDRNOTAVAIL.
    let (_exhausted, _holder, client_pid, failures) = common::exhaust_ports();
    let errors = [format!("process_pid=\"{client_pid}\""), "error_type=\"EADDRNOTAVAIL\"".to_string()];
    let errors: Vec<&str> = errors.iter().map(String::as_str).collect();

    // TIME_WAIT: 20 connections closed client-first.
    let waits = Netns::new();
    let _server = waits.serve(&["--listen", "127.0.0.1:7000"]);
    let closer = waits.client(&["--to", "127.0.0.1:7000", "--count", "20"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while waits.time_wait_entered() < 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let entered = waits.time_wait_entered();
    assert_eq!(entered, 20, "the kernel's TIME_WAIT entries:\n{}", waits.ss_all());
    let closer_pid = format!("process_pid=\"{}\"", closer.pid);

    // A listen overflow: backlog 1, never accepting.
    let overflowed = Netns::new();
    let listener = overflowed.serve(&["--listen", "127.0.0.1:7900", "--backlog", "1", "--never-accept"]);
    overflowed.client(&["--to", "127.0.0.1:7900", "--count", "8", "--nonblocking", "200ms"]);
    std::thread::sleep(Duration::from_millis(300));
    let overflows = overflowed.nstat("TcpExtListenOverflows");
    assert!(overflows > 0, "the scenario must overflow the accept queue");
    let owner = format!("process_pid=\"{}\"", listener.pid());

    // A pod as kubelet makes it: cgroup and log directory on the host,
    // seen through the DaemonSet's /host mounts.
    let (pod_ns, _pod_server) = namespace_with_server();
    let mut pod_logs = Dirs(Vec::new());
    let pod_name = format!("web-{variant}");
    let mut pod = PodWithOldConnections::open(&pod_name, &mut pod_logs, Path::new("/var/log/pods"), &pod_ns, 3);
    pod.close_all(&pod_ns);
    let pod_label = format!("k8s_pod_name=\"{pod_name}\"");
    let pod_labels = [pod_label.as_str(), "k8s_namespace_name=\"shop\""];

    let counted = |b: &str| {
        sample(b, "observer_tcp_connect_errors_total", &errors) == Some(failures)
            && sample_sum(b, "observer_tcp_time_wait_entries_total", &[&closer_pid]) == entered
            && sample_sum(b, "observer_tcp_listen_overflows_total", &[&owner]) == overflows
            && sample_sum(b, "observer_tcp_time_wait_entries_total", &pod_labels) == 3
    };
    let body = scrape_until(ready_port, Duration::from_secs(30), counted);
    assert_eq!(sample(&body, "observer_tcp_connect_errors_total", &errors), Some(failures), "{variant}:\n{body}");
    assert_eq!(sample_sum(&body, "observer_tcp_time_wait_entries_total", &[&closer_pid]), entered, "{variant}");
    assert_eq!(sample_sum(&body, "observer_tcp_listen_overflows_total", &[&owner]), overflows, "{variant}:\n{body}");
    assert_eq!(
        sample_sum(&body, "observer_tcp_time_wait_entries_total", &pod_labels),
        3,
        "{variant}: the pod's labels through /host/sys/fs/cgroup and /var/log/pods:\n{}",
        body.lines().filter(|l| l.contains("time_wait_entries")).collect::<Vec<_>>().join("\n")
    );

    // `kubectl exec ... -- observer top` in the pod: no terminal there, so
    // the table once, from the default endpoint, which is this daemon's;
    // the port-exhaustion client ranked with its pid, the pod named.
    assert_eq!(ready_port, 9464, "{variant}: observer top's default endpoint is the DaemonSet's port");
    let top = podman().run(&[
        "exec",
        &name,
        "/usr/local/bin/observer",
        "top",
        "--once",
        "--interval",
        "500ms",
        "--rows",
        "200",
    ]);
    // The daemon's endpoint, not a second copy of its programs (which the
    // pod's memory limit is not sized for).
    assert!(top.starts_with("observer top: http://127.0.0.1:9464/metrics,"), "{variant}: top's source:\n{top}");
    let client_row = top.lines().any(|l| l.split_whitespace().next() == Some(client_pid.to_string().as_str()));
    assert!(client_row, "{variant}: observer top in the pod:\n{top}");
    assert!(top.contains(&format!("shop/{pod_name}")), "{variant}: the pod named in observer top:\n{top}");
    trace_in_the_pod(&name, variant);

    // SIGTERM, as kubelet stops it: gone within the grace period, exit 0,
    // after a last push with the counts.
    let pushes_before = sink.requests();
    let stopping = Instant::now();
    podman().run(&["stop", "--time", &grace.to_string(), &name]);
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(grace), "{variant}: stopped after {took:?} (grace {grace} s)");
    let exit = podman().run(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(exit.trim(), "0", "{variant}: exit code after SIGTERM:\n{}", container_guard.logs());
    assert!(sink.requests() > pushes_before, "{variant}: no push at SIGTERM");
    let pushed = sink.latest(
        "observer.tcp.connect_errors",
        &[("process.pid", Value::Int(i64::from(client_pid))), ("error.type", Value::Str("EADDRNOTAVAIL"))],
    );
    assert_eq!(pushed, failures as i64, "{variant}: the last push carries the counts");
    println!("{variant}: stopped in {took:?}, {} pushes", sink.requests());
    drop(container_guard);
    drop(pod_logs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kubectl exec ... -- observer trace` in the pod: once attached, each
/// EADDRNOTAVAIL of a client that runs out of ports meanwhile is a line
/// with its pid, executable and destination; Ctrl-C (SIGINT to the trace,
/// a process of the node like any other) ends it with exit 0, which the
/// exec passes on.
fn trace_in_the_pod(container: &str, variant: &str) {
    use std::{
        io::{BufRead as _, BufReader},
        process::Stdio,
        sync::Arc,
    };
    // A --rate of its own tells this trace's process from the host's.
    const MARK: &str = "4217";
    let mut exec = podman()
        .cmd()
        .args(["exec", container, "/usr/local/bin/observer", "trace", "--json", "--errno", "EADDRNOTAVAIL"])
        .args(["--rate", MARK])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(exec.stderr.take().unwrap());
    let mut said = String::new();
    while !said.lines().any(|l| l.starts_with("observer trace: ")) {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("{variant}: observer trace in the pod ended ({}):\n{said}", exec.wait().unwrap());
        }
        said.push_str(&line);
    }
    let lines = Arc::new(Mutex::new(Vec::<Json>::new()));
    let gathered = lines.clone();
    let stdout = exec.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            gathered.lock().unwrap().push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
        }
    });
    let (_ns, _holder, client, failures) = common::exhaust_ports();
    let of_client = || -> Vec<Json> { lines.lock().unwrap().iter().filter(|l| l["pid"] == client).cloned().collect() };
    let deadline = Instant::now() + Duration::from_secs(20);
    while (of_client().len() as u64) < failures {
        assert!(Instant::now() < deadline, "{variant}: trace in the pod: {:?}", lines.lock().unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }

    let trace_pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"/observer"))
                && args.windows(2).any(|w| w == [b"--rate".as_slice(), MARK.as_bytes()])
        })
        .expect("the trace's process");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(trace_pid), nix::sys::signal::SIGINT).unwrap();
    let status = exec.wait().unwrap();
    reader.join().unwrap();
    assert!(status.success(), "{variant}: observer trace after Ctrl-C in the pod: {status}");
    let mine = of_client();
    assert_eq!(mine.len() as u64, failures, "{variant}: once each: {mine:?}");
    for line in &mine {
        assert_eq!(
            (line["error"].as_str(), line["destination"].as_str(), line["executable"].as_str()),
            (Some("EADDRNOTAVAIL"), Some("127.0.0.1:8080"), Some("observer-churn")),
            "{variant}: {line}"
        );
    }
}

/// The tests that need the image built (`cargo xtask test` runs them
/// after the rest of the host suite, which runs beside the kernel matrix
/// while the release image is built: xtask/src/test.rs, IMAGE_TESTS).
mod with_the_image {
    use super::*;

    #[test]
    fn the_daemonset_container_counts_exactly() {
        daemonset_container_counts_exactly("kubernetes");
    }

    #[test]
    fn the_least_privilege_container_counts_exactly() {
        daemonset_container_counts_exactly("least-privilege");
    }

    /// What the image holds: the daemon, its libraries, the CA bundle; no
    /// shell, no compiler, no package manager. Its configuration is the
    /// Dockerfile's, so both ways of building give the same image.
    #[test]
    fn the_image_holds_the_daemon_and_nothing_else() {
        let podman = podman();
        let image = format!("localhost/observer:{}", env!("CARGO_PKG_VERSION"));
        let name = format!("observer-test-{}-export", std::process::id());
        podman.run(&["create", "--name", &name, &image]);
        let _guard = Container { name: name.clone() };
        let tar = podman.cmd().args(["export", &name]).output().unwrap();
        assert!(tar.status.success());
        let mut list = Command::new("tar")
            .args(["-t"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write as _;
            list.stdin.take().unwrap().write_all(&tar.stdout).unwrap();
        }
        let listing = String::from_utf8(list.wait_with_output().unwrap().stdout).unwrap();
        let files: Vec<&str> = listing.lines().filter(|l| !l.ends_with('/')).collect();
        for want in ["usr/local/bin/observer", "etc/ssl/certs/ca-certificates.crt"] {
            assert!(files.contains(&want), "{want} missing:\n{listing}");
        }
        let unwanted = ["sh", "bash", "busybox", "dash", "cc", "gcc", "ld", "rustc", "cargo", "apt", "apt-get", "dpkg"];
        for file in &files {
            let base = file.rsplit('/').next().unwrap();
            assert!(!unwanted.contains(&base), "{file} does not belong in the image");
            let allowed = *file == "usr/local/bin/observer"
                || *file == "etc/ssl/certs/ca-certificates.crt"
                || file.contains(".so");
            assert!(allowed, "{file}: only the daemon, its libraries and the CA bundle");
        }
        let size = podman.run(&["image", "inspect", "--format", "{{.Size}}", &image]);
        let archive_size = std::fs::metadata(archive()).unwrap().len();
        println!("image: {} files, {} bytes unpacked, archive {archive_size} bytes", files.len(), size.trim());

        // The Dockerfile's image configuration is the archive's.
        let config: Json =
            serde_json::from_str(&podman.run(&["image", "inspect", "--format", "{{json .Config}}", &image])).unwrap();
        let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
        let image_stage = &dockerfile[dockerfile.find("FROM scratch").expect("a scratch stage")..];
        let line = |key: &str| {
            image_stage.lines().find_map(|l| l.strip_prefix(&format!("{key} "))).unwrap_or_else(|| panic!("no {key}"))
        };
        assert_eq!(serde_json::from_str::<Json>(line("ENTRYPOINT")).unwrap(), config["Entrypoint"]);
        assert_eq!(serde_json::from_str::<Json>(line("CMD")).unwrap(), config["Cmd"]);
        assert!(config["ExposedPorts"].get(format!("{}/tcp", line("EXPOSE"))).is_some(), "{config}");
        assert!(config["Env"].as_array().unwrap().iter().any(|e| *e == line("ENV")), "{config}");
        // The DaemonSet's arguments are the image's default command.
        let docs = documents(&kustomize("deploy/kubernetes"));
        assert_eq!(pod_spec(&docs)["containers"][0]["args"], config["Cmd"]);
    }
}

/// A checkout anywhere (here 200 characters deep) gives podman a runroot
/// it takes: the image tests once failed from any checkout deeper than
/// ~20 characters, with the runroot under target/.
#[test]
fn podmans_runroot_is_short_wherever_the_checkout_is() {
    let deep = Path::new("/home").join("a-user-with-a-long-name/".repeat(8)).join("observer/target/podman/root");
    for root in [repo().join("target/podman/images"), deep] {
        let runroot = runroot_of(&root);
        assert!(runroot.as_os_str().len() <= PODMAN_RUNROOT_MAX, "{} for {}", runroot.display(), root.display());
        assert!(!runroot.starts_with(repo()), "{}: not under the checkout", runroot.display());
    }
    assert_ne!(runroot_of(Path::new("/a/target/podman/root")), runroot_of(Path::new("/b/target/podman/root")));
}
