//! The OpenTelemetry resource: who is reporting. Prometheus shows it as
//! `target_info`, OTLP sends it with every export.
//!
//! observer's own attributes come first; the standard environment
//! (`OTEL_RESOURCE_ATTRIBUTES`, then `OTEL_SERVICE_NAME`) overrides them, as
//! the OpenTelemetry specification asks.
use opentelemetry::KeyValue;
use opentelemetry_sdk::{
    Resource,
    resource::{EnvResourceDetector, ResourceDetector as _},
};

/// `node_name`: the Kubernetes node (the DaemonSet sets `NODE_NAME` from
/// the downward API); `host_name`: this machine's name.
pub fn build(node_name: Option<String>, host_name: String) -> Resource {
    let mut own = vec![
        KeyValue::new("service.name", "observer"),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        // One observer per node: the node (or host) names the instance, and
        // stays the same across restarts, so series continue.
        KeyValue::new("service.instance.id", node_name.clone().unwrap_or_else(|| host_name.clone())),
        KeyValue::new("host.name", host_name),
        KeyValue::new("os.type", "linux"),
    ];
    if let Some(node) = node_name {
        own.push(KeyValue::new("k8s.node.name", node));
    }
    let mut builder = Resource::builder_empty().with_attributes(own);
    let from_env = EnvResourceDetector::new().detect();
    builder = builder.with_attributes(from_env.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME").ok().filter(|n| !n.is_empty()) {
        builder = builder.with_service_name(name);
    }
    builder.build()
}

/// The values `build` takes, from this process's environment.
pub fn from_environment() -> Resource {
    let node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "unknown".into());
    build(node, host)
}

#[cfg(test)]
mod tests {
    use opentelemetry::Key;

    use super::*;

    fn get(r: &Resource, key: &'static str) -> Option<String> {
        r.get(&Key::from_static_str(key)).map(|v| v.to_string())
    }

    #[test]
    fn own_attributes_and_the_node() {
        let r = build(Some("node-7".into()), "host-a".into());
        assert_eq!(get(&r, "service.name").as_deref(), Some("observer"));
        assert_eq!(get(&r, "service.version").as_deref(), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(get(&r, "service.instance.id").as_deref(), Some("node-7"));
        assert_eq!(get(&r, "host.name").as_deref(), Some("host-a"));
        assert_eq!(get(&r, "os.type").as_deref(), Some("linux"));
        assert_eq!(get(&r, "k8s.node.name").as_deref(), Some("node-7"));
        let r = build(None, "host-a".into());
        assert_eq!(get(&r, "service.instance.id").as_deref(), Some("host-a"));
        assert_eq!(get(&r, "k8s.node.name"), None);
    }
}
