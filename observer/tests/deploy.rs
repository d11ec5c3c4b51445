//! The Kubernetes deployment in `deploy/`, checked offline: both
//! kustomizations build (kubectl's kustomize), every resource validates
//! against the Kubernetes schemas (kubernetes-validate, strict), the
//! DaemonSet has what the issue asks of it, the least-privilege variant
//! drops `privileged` for exactly the documented capabilities, the
//! ConfigMap's observer.toml passes observer's own validation, and the
//! Dockerfile builds with the command and nightly cargo xtask uses.
mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::{daemon::OBSERVER, run_with_input, tool};
use observer::probes::privileges::CAPABILITIES;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl kustomize <dir>`: the manifests as one YAML stream.
fn kustomize(dir: &str) -> String {
    let out =
        Command::new(tool("OBSERVER_KUBECTL", "kubectl")).args(["kustomize"]).arg(repo().join(dir)).output().unwrap();
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The YAML stream as JSON documents (PyYAML, from kubernetes-validate's venv).
fn documents(yaml: &str) -> Vec<Value> {
    let out = run_with_input(
        Command::new(tool("OBSERVER_K8S_PYTHON", "python3"))
            .args(["-c", "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))"]),
        yaml.as_bytes(),
    );
    assert!(out.status.success(), "not YAML: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

/// Strict schema validation of a built kustomization; only
/// prometheus-operator kinds (no schema there) may be skipped.
fn validate(name: &str, yaml: &str) {
    let file = std::env::temp_dir().join(format!("observer-deploy-{}-{name}.yaml", std::process::id()));
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(tool("OBSERVER_KUBERNETES_VALIDATE", "kubernetes-validate"))
        .args(["--strict", "-k", "1.30.0"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let report = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: kubernetes-validate:\n{report}");
    for line in report.lines().filter(|l| !l.starts_with("INFO")) {
        assert!(line.contains("kind PodMonitor with api version monitoring.coreos.com/v1"), "{name}: {line}");
    }
    for kind in ["namespace", "serviceaccount", "configmap", "service", "daemonset"] {
        assert!(
            report.contains(&format!("passed for resource {kind}/observer")),
            "{name}: {kind} not validated:\n{report}"
        );
    }
}

#[test]
fn the_manifests_build_and_validate_against_the_kubernetes_schemas() {
    let base = kustomize("deploy/kubernetes");
    validate("base", &base);
    let docs = documents(&base);
    let ds = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(ds["hostPID"], true);
    assert_eq!(ds["priorityClassName"], "system-node-critical");
    assert_eq!(ds["tolerations"][0]["operator"], "Exists", "every node, whatever its taints");
    let c = &ds["containers"][0];
    assert_eq!(c["securityContext"]["privileged"], true);
    let node = c["env"].as_array().unwrap().iter().find(|e| e["name"] == "NODE_NAME").expect("NODE_NAME");
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(c["resources"]["requests"]["memory"].is_string() && c["resources"]["limits"]["memory"].is_string());
    // The host paths it reads, all read-only.
    let mounts = c["volumeMounts"].as_array().unwrap();
    for path in ["/sys/kernel/btf", "/sys/kernel/tracing", "/host/sys/fs/cgroup", "/var/log/pods", "/host/proc"] {
        let m = mounts.iter().find(|m| m["mountPath"] == path).unwrap_or_else(|| panic!("no mount at {path}"));
        assert_eq!(m["readOnly"], true, "{path}");
    }
    let monitor = find(&docs, "PodMonitor");
    assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "observer");
    assert_eq!(find(&docs, "Service")["spec"]["clusterIP"], "None", "headless");
}

#[test]
fn the_least_privilege_variant_has_exactly_the_documented_capabilities() {
    let built = kustomize("deploy/least-privilege");
    validate("least-privilege", &built);
    let docs = documents(&built);
    let sc = &find(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    // Exactly the capabilities observer's own table names (what the error
    // at start and the README's Requirements render).
    let table: Vec<String> = CAPABILITIES.iter().map(|n| n.kubernetes_name()).collect();
    assert_eq!(sc["capabilities"]["add"], serde_json::json!(table));
    // Each capability has its reason next to it.
    let patch = std::fs::read_to_string(repo().join("deploy/least-privilege/capabilities.yaml")).unwrap();
    for cap in &table {
        let line = patch.lines().position(|l| l.trim() == format!("- {cap}")).unwrap();
        assert!(patch.lines().nth(line - 1).unwrap().trim().starts_with('#'), "{cap} needs a comment saying why");
    }
}

#[test]
fn the_configmap_configuration_passes_observers_own_validation() {
    let docs = documents(&kustomize("deploy/kubernetes"));
    let toml = find(&docs, "ConfigMap")["data"]["observer.toml"].as_str().expect("observer.toml");
    let file = std::env::temp_dir().join(format!("observer-configmap-{}.toml", std::process::id()));
    std::fs::write(&file, toml).unwrap();
    let out = Command::new(OBSERVER).args(["run", "--dry-run", "--config"]).arg(&file).output().unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let settings = String::from_utf8_lossy(&out.stdout);
    assert!(settings.contains("prometheus-listen = \"0.0.0.0:9464\""), "{settings}");
    assert!(settings.contains("proc-root = \"/host/proc\""), "{settings}");
    // The DaemonSet runs it from where the ConfigMap is mounted.
    let ds = documents(&kustomize("deploy/kubernetes"));
    let c = &find(&ds, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"], serde_json::json!(["run", "--config", "/etc/observer/observer.toml"]));
}

#[test]
fn the_dockerfile_builds_the_way_cargo_xtask_does() {
    let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    assert!(dockerfile.lines().any(|l| l.trim() == "RUN cargo xtask build --release"), "{dockerfile}");
    // What `cargo xtask build --release` produces (xtask/src/build.rs).
    assert!(dockerfile.contains("COPY --from=build /src/target/release/observer "), "{dockerfile}");
    let build = std::fs::read_to_string(repo().join("xtask/src/build.rs")).unwrap();
    assert!(build.contains(r#"let profile = if opts.release { "release" } else { "debug" };"#));
    // The same pinned nightly.
    let toolchain = std::fs::read_to_string(repo().join("xtask/src/toolchain.rs")).unwrap();
    let pinned = toolchain
        .lines()
        .find_map(|l| l.strip_prefix("pub const PINNED_RUSTUP_NAME: &str = \""))
        .and_then(|l| l.strip_suffix("\";"))
        .expect("PINNED_RUSTUP_NAME");
    assert!(dockerfile.contains(&format!("ENV OBSERVER_NIGHTLY={pinned}")), "Dockerfile's nightly is not {pinned}");
    // The stable toolchain of rust-toolchain.toml.
    let stable = std::fs::read_to_string(repo().join("rust-toolchain.toml")).unwrap();
    let version = stable.lines().find_map(|l| l.strip_prefix("channel = \"")).unwrap().trim_end_matches('"');
    let minor = version.rsplit_once('.').map_or(version, |(m, _)| m);
    assert!(dockerfile.contains(&format!("FROM rust:{minor}-")), "Dockerfile's Rust is not {version}");
}
