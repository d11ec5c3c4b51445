//! The Kubernetes deployment in `deploy/`, checked offline: both
//! kustomizations and each optional component build (kubectl's
//! kustomize), every resource validates against the Kubernetes schemas
//! (kubernetes-validate, strict), the DaemonSet has what a stock cluster
//! needs (its own PriorityClass, a NetworkPolicy, the image through
//! `images:`, the cluster's name from one place), the least-privilege
//! variant drops `privileged` for exactly the documented capabilities, the
//! ConfigMap's observer.toml passes observer's own validation, and the
//! Dockerfile builds the way `cargo xtask image` does. tests/image.rs runs
//! the DaemonSet's container for real.
mod common;

use std::process::Command;

use common::{
    daemon::OBSERVER,
    manifests::{config_map, documents, find, kustomize, pod_spec, repo},
    tool,
};
use observer::probes::privileges::CAPABILITIES;

/// Strict schema validation of a built kustomization; only
/// prometheus-operator kinds (no schema there) may be skipped. Every kind
/// of `kinds` must have passed.
fn validate(name: &str, yaml: &str, kinds: &[&str]) {
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
        let operator_kind = ["PodMonitor", "PrometheusRule"]
            .iter()
            .any(|k| line.contains(&format!("kind {k} with api version monitoring.coreos.com/v1")));
        assert!(operator_kind, "{name}: {line}");
    }
    for kind in kinds {
        assert!(
            report.contains(&format!("passed for resource {kind}/observer")),
            "{name}: {kind} not validated:\n{report}"
        );
    }
}

/// What the base has; each must validate.
const BASE_KINDS: [&str; 7] =
    ["namespace", "serviceaccount", "configmap", "service", "daemonset", "networkpolicy", "priorityclass"];

#[test]
fn the_manifests_build_and_validate_against_the_kubernetes_schemas() {
    let base = kustomize("deploy/kubernetes");
    validate("base", &base, &BASE_KINDS);
    let docs = documents(&base);
    // A stock cluster: nothing that needs prometheus-operator's CRDs.
    assert!(docs.iter().all(|d| d["apiVersion"] != "monitoring.coreos.com/v1"), "operator kinds belong in components");
    let ds = pod_spec(&docs);
    assert_eq!(ds["hostPID"], true);
    // Its own PriorityClass, not system-node-critical (kube-system only on GKE).
    let priority = find(&docs, "PriorityClass");
    assert_eq!(ds["priorityClassName"], priority["metadata"]["name"]);
    assert!(priority["value"].as_u64().is_some_and(|v| v <= 1_000_000_000), "{priority}");
    assert_eq!(ds["tolerations"][0]["operator"], "Exists", "every node, whatever its taints");
    let c = &ds["containers"][0];
    assert_eq!(c["securityContext"]["privileged"], true);
    // The image `cargo xtask image` tags, set through `images:`.
    assert_eq!(c["image"], format!("localhost/observer:{}", env!("CARGO_PKG_VERSION")));
    let kustomization = std::fs::read_to_string(repo().join("deploy/kubernetes/kustomization.yaml")).unwrap();
    assert!(kustomization.contains("images:\n  - name: observer\n"), "{kustomization}");
    let env = c["env"].as_array().unwrap();
    let var = |name: &str| env.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no {name}"));
    assert_eq!(var("NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    // The cluster's name from one place: the generated ConfigMap.
    let cluster = &var("CLUSTER_NAME")["valueFrom"]["configMapKeyRef"];
    let generated = config_map(&docs, cluster["name"].as_str().unwrap());
    assert_eq!(generated["data"][cluster["key"].as_str().unwrap()], "my-cluster");
    assert_eq!(var("OTEL_RESOURCE_ATTRIBUTES")["value"], "host.name=$(NODE_NAME),k8s.cluster.name=$(CLUSTER_NAME)");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(c["resources"]["requests"]["memory"].is_string() && c["resources"]["limits"]["memory"].is_string());
    // The host paths it reads, all read-only.
    let mounts = c["volumeMounts"].as_array().unwrap();
    for path in ["/sys/kernel/btf", "/sys/kernel/tracing", "/host/sys/fs/cgroup", "/var/log/pods", "/host/proc"] {
        let m = mounts.iter().find(|m| m["mountPath"] == path).unwrap_or_else(|| panic!("no mount at {path}"));
        assert_eq!(m["readOnly"], true, "{path}");
    }
    assert_eq!(find(&docs, "Service")["spec"]["clusterIP"], "None", "headless");
    // Only the monitoring namespace may scrape; the policy selects the pods.
    let policy = &find(&docs, "NetworkPolicy")["spec"];
    assert_eq!(policy["podSelector"]["matchLabels"], find(&docs, "DaemonSet")["spec"]["selector"]["matchLabels"]);
    assert_eq!(policy["policyTypes"], serde_json::json!(["Ingress"]));
    let rule = &policy["ingress"][0];
    assert_eq!(policy["ingress"].as_array().unwrap().len(), 1, "{policy}");
    assert_eq!(rule["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "monitoring");
    assert_eq!(rule["ports"][0]["port"], "metrics");
}

/// Each optional component on top of the base, as a user adds it.
fn with_component(component: &str) -> Vec<serde_json::Value> {
    // kustomize takes relative paths only: a directory two levels below
    // the repository.
    let dir = repo().join(format!("target/observer-component-{}-{component}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../deploy/kubernetes\n\
         components:\n  - ../../deploy/kubernetes/components/{component}\n"
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
    let built = kustomize(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    validate(component, &built, &BASE_KINDS);
    documents(&built)
}

#[test]
fn each_optional_component_builds_and_validates() {
    let docs = with_component("podmonitor");
    let monitor = find(&docs, "PodMonitor");
    assert_eq!(monitor["metadata"]["namespace"], "observer");
    assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "observer");
    let docs = with_component("prometheusrule");
    let rule = find(&docs, "PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], "observer");
    assert!(rule["spec"]["groups"].as_array().is_some_and(|g| !g.is_empty()));
    let docs = with_component("grafana-dashboards");
    let boards = config_map(&docs, "observer-dashboards");
    assert_eq!(boards["metadata"]["labels"]["grafana_dashboard"], "1");
    for (name, json) in boards["data"].as_object().unwrap() {
        let board: serde_json::Value = serde_json::from_str(json.as_str().unwrap()).unwrap();
        assert!(board["uid"].is_string(), "{name}: a dashboard");
    }
}

#[test]
fn the_least_privilege_variant_has_exactly_the_documented_capabilities() {
    let built = kustomize("deploy/least-privilege");
    validate("least-privilege", &built, &BASE_KINDS);
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
    let toml = config_map(&docs, "observer")["data"]["observer.toml"].as_str().expect("observer.toml");
    let file = std::env::temp_dir().join(format!("observer-configmap-{}.toml", std::process::id()));
    std::fs::write(&file, toml).unwrap();
    let out = Command::new(OBSERVER).args(["run", "--dry-run", "--config"]).arg(&file).output().unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let settings = String::from_utf8_lossy(&out.stdout);
    assert!(settings.contains("prometheus-listen = \"0.0.0.0:9464\""), "{settings}");
    assert!(settings.contains("proc-root = \"/host/proc\""), "{settings}");
    // The DaemonSet runs it from where the ConfigMap is mounted.
    let c = &pod_spec(&docs)["containers"][0];
    assert_eq!(c["args"], serde_json::json!(["run", "--config", "/etc/observer/observer.toml"]));
}

#[test]
fn the_dockerfile_builds_the_way_cargo_xtask_image_does() {
    let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).collect();
    // The image's files, collected by the same code as the OCI archive's,
    // alone in a scratch image (tests/image.rs compares the rest of the
    // image's configuration with the archive's).
    assert!(lines.contains(&"RUN cargo xtask image --rootfs /rootfs"), "{dockerfile}");
    assert!(lines.contains(&"FROM scratch") && lines.contains(&"COPY --from=build /rootfs/ /"), "{dockerfile}");
    // The build context leaves the build output and history out.
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l == "target/") && ignore.lines().any(|l| l == ".git/"), "{ignore}");
    // Release builds use the committed Cargo.lock, and building sets up no
    // test tools (no apt, no tracefs mount inside an image build).
    let build = std::fs::read_to_string(repo().join("xtask/src/build.rs")).unwrap();
    assert!(build.contains(r#"cmd.args(["--release", "--locked"]);"#), "release builds are --locked");
    assert!(
        build.contains("setup::build_tools()") && !build.contains("setup::run()"),
        "build sets up only what it needs"
    );
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
