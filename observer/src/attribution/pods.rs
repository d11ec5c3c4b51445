//! Pod name, namespace and container name from the node itself: kubelet
//! keeps each pod's logs in `/var/log/pods/<namespace>_<pod>_<uid>/
//! <container>/`, so no API server access (and no RBAC) is needed.
//! Namespace and pod names are DNS labels and a uid has no underscore, so
//! the directory name splits unambiguously.
use std::{collections::HashMap, path::PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    /// The container's name, when the pod has a single container (the log
    /// directories do not say which container id is which).
    pub only_container: Option<String>,
}

pub struct PodLogs {
    root: PathBuf,
    by_uid: HashMap<String, PodMeta>,
}

impl PodLogs {
    pub fn new(root: PathBuf) -> Self {
        Self { root, by_uid: HashMap::new() }
    }

    pub fn get(&self, uid: &str) -> Option<&PodMeta> {
        self.by_uid.get(uid)
    }

    /// Read the directory again (pods come and go). A missing directory is
    /// an empty one: a host without kubelet.
    pub fn rescan(&mut self) {
        self.by_uid.clear();
        let Ok(entries) = std::fs::read_dir(&self.root) else { return };
        for entry in entries.flatten() {
            let Some(dir) = entry.file_name().to_str().map(str::to_string) else { continue };
            let Some((namespace, name, uid)) = split(&dir) else { continue };
            let containers: Vec<String> = std::fs::read_dir(entry.path())
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .filter_map(|e| e.file_name().to_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let only_container = (containers.len() == 1).then(|| containers[0].clone());
            self.by_uid
                .insert(uid.to_string(), PodMeta { namespace: namespace.into(), name: name.into(), only_container });
        }
    }
}

/// `<namespace>_<pod>_<uid>`.
fn split(dir: &str) -> Option<(&str, &str, &str)> {
    let mut parts = dir.split('_');
    let (namespace, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = parts.next().is_none() && !namespace.is_empty() && !name.is_empty() && uid.len() == 36;
    ok.then_some((namespace, name, uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_names_split_into_namespace_pod_and_uid() {
        assert_eq!(
            split("shop_payment-api-7d9f_1f2e3d4c-5b6a-4789-8abc-def012345678"),
            Some(("shop", "payment-api-7d9f", "1f2e3d4c-5b6a-4789-8abc-def012345678"))
        );
        for bad in ["", "shop", "shop_pod", "shop_pod_short", "_pod_1f2e3d4c-5b6a-4789-8abc-def012345678", "a_b_c_d"] {
            assert_eq!(split(bad), None, "{bad}");
        }
    }
}
