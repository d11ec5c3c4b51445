//! Container and pod from a cgroup v2 path, for the shapes kubelet and the
//! container runtimes create:
//!
//! - systemd driver: `/kubepods.slice/kubepods-burstable.slice/
//!   kubepods-burstable-pod<uid, _ for ->.slice/<runtime>-<id>.scope`
//!   (runtime `cri-containerd`, `crio`, `docker`; Guaranteed pods sit
//!   directly under `kubepods.slice`, as `kubepods-pod<uid>.slice`);
//! - cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>` (or
//!   `/kubepods/pod<uid>/<id>`);
//! - either nested deeper (kind, k3s: `/kubelet.slice/kubelet-kubepods.slice/...`).
//!
//! Anything else (a host process, a malformed path) is no container: no
//! labels, never a panic.

/// A container found in a cgroup path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// The runtime's container id: 64 lowercase hex digits.
    pub id: String,
    /// The pod's uid, with dashes (`1f0e...-...`).
    pub pod_uid: String,
}

pub fn container(path: &str) -> Option<Container> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (last, parents) = segments.split_last()?;
    let pod_segment = parents.last()?;
    // Only under a kubepods hierarchy: elsewhere a "pod..." name means nothing.
    if !parents.iter().any(|s| s.starts_with("kubepods") || s.contains("-kubepods")) {
        return None;
    }
    Some(Container { id: container_id(last)?, pod_uid: pod_uid(pod_segment)? })
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`
/// (systemd) or a bare `<id>` (cgroupfs).
fn container_id(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    let id = ["cri-containerd-", "crio-", "docker-", "containerd-"]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    let hex = id.len() == 64 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then(|| id.to_string())
}

/// `kubepods-burstable-pod<uid_with_underscores>.slice`,
/// `kubepods-pod<uid>.slice` (systemd) or `pod<uid>` (cgroupfs).
fn pod_uid(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".slice").unwrap_or(segment);
    let (_, uid) = name.rsplit_once("pod")?;
    let uid = uid.replace('_', "-");
    let shape = [8, 4, 4, 4, 12];
    let parts: Vec<&str> = uid.split('-').collect();
    let valid = parts.len() == shape.len()
        && parts.iter().zip(shape).all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()));
    valid.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "1f2e3d4c-5b6a-4789-8abc-def012345678";

    fn found(path: &str) -> Option<(String, String)> {
        container(path).map(|c| (c.id, c.pod_uid))
    }

    #[test]
    fn every_runtime_and_driver_shape() {
        let uid_ = UID.replace('-', "_");
        let want = Some((ID.to_string(), UID.to_string()));
        for path in [
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
            ),
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{ID}.scope"),
            format!("/kubepods.slice/kubepods-pod{uid_}.slice/docker-{ID}.scope"),
            format!("/kubepods/burstable/pod{UID}/{ID}"),
            format!("/kubepods/pod{UID}/{ID}"),
            format!("/kubepods/besteffort/pod{UID}/{ID}"),
            format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
            ),
        ] {
            assert_eq!(found(&path), want, "{path}");
        }
    }

    #[test]
    fn host_processes_and_malformed_paths_have_no_container() {
        let uid_ = UID.replace('-', "_");
        for path in [
            "/".to_string(),
            String::new(),
            "/system.slice/sshd.service".to_string(),
            "/user.slice/user-0.slice/session-1.scope".to_string(),
            format!("/system.slice/docker-{ID}.scope"), // docker outside Kubernetes
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"), // the pod itself
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/crio-conmon-{ID}.scope"
            ),
            format!("/kubepods/burstable/pod{UID}/{}", &ID[..63]), // id too short
            format!("/kubepods/burstable/pod{UID}/{}", ID.to_uppercase()),
            format!("/kubepods/burstable/podnot-a-uid/{ID}"),
            format!("/kubepods/burstable/pod{}/{ID}", &UID[..35]),
            "/kubepods/burstable/pod/".to_string(),
            "////".to_string(),
            "/kubepods/burstable/podé€/x".to_string(),
        ] {
            assert_eq!(found(&path), None, "{path}");
        }
    }
}
