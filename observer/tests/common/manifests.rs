//! deploy/'s Kubernetes manifests as kubectl renders them, read as JSON:
//! for the checks of the manifests (tests/deploy.rs) and for running the
//! DaemonSet's container as it is written there (tests/image.rs).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use super::{run_with_input, tool};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl kustomize <dir>` (relative to the repository, or absolute):
/// the manifests as one YAML stream.
pub fn kustomize(dir: impl AsRef<Path>) -> String {
    let dir = repo().join(dir);
    let out = Command::new(tool("OBSERVER_KUBECTL", "kubectl")).args(["kustomize"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The YAML stream as JSON documents (PyYAML, from kubernetes-validate's venv).
pub fn documents(yaml: &str) -> Vec<Value> {
    let out = run_with_input(
        Command::new(tool("OBSERVER_K8S_PYTHON", "python3"))
            .args(["-c", "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))"]),
        yaml.as_bytes(),
    );
    assert!(out.status.success(), "not YAML: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

/// A ConfigMap of the rendered manifests by its (generated) name.
pub fn config_map<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ConfigMap {name}"))
}

/// The DaemonSet's pod spec.
pub fn pod_spec(docs: &[Value]) -> &Value {
    &find(docs, "DaemonSet")["spec"]["template"]["spec"]
}
