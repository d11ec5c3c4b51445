//! Who is behind a pid on a Kubernetes node: container id, pod uid, pod
//! name and namespace (and the container's name when it can be known),
//! from the cgroup id the kernel recorded with each event -> its cgroup
//! v2 path -> the container and pod uid in it -> kubelet's pod log
//! directories. No API server access. Host processes get no labels.
//!
//! Lookups run on their own thread (`resolver.rs`), never on the
//! collection loop, and touch the filesystem at most once per batch of
//! questions (one walk of the cgroup tree, one listing of the pod logs)
//! when a cgroup id or pod uid is new; known ones come from the cache. A
//! cgroup that is gone from the tree leaves the cache at the next walk.
mod cgroups;
mod parse;
mod pods;
pub mod resolver;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

pub use parse::{Container, container};

/// Whose pod labels an actor carries: a process's own (tgid, 0); for
/// events of sockets whose owner is unknown (tgid 0), the socket's cgroup
/// (0, cgroup id), so those still get their pod's labels.
pub type PodKey = (u32, u64);

pub fn pod_key(actor: &observer_common::Actor) -> PodKey {
    if actor.tgid == 0 { (0, actor.cgroup_id) } else { (actor.tgid, 0) }
}

/// The labels of a process in a pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodLabels {
    pub container_id: String,
    pub pod_uid: String,
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub container_name: Option<String>,
}

/// What a lookup learns about an actor: its pod (None: a host process),
/// and a process's executable name (None for an unknown owner, pid 0, or
/// a process already gone: its `comm` stands in).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub pod: Option<Arc<PodLabels>>,
    pub executable: Option<String>,
}

pub struct Attributor {
    cgroups: Option<cgroups::CgroupIndex>,
    pods: pods::PodLogs,
    proc_root: PathBuf,
    /// By cgroup id; None = not a container (a host process).
    cache: HashMap<u64, Option<Arc<PodLabels>>>,
    /// The filesystem was read in this round already.
    walked: bool,
}

impl Attributor {
    /// `cgroup_root`: the cgroup2 mount (found in /proc/self/mountinfo if
    /// None); `pod_logs`: kubelet's pod log directory.
    pub fn new(proc_root: &Path, cgroup_root: Option<PathBuf>, pod_logs: PathBuf) -> Self {
        let root = match cgroup_root {
            Some(given) => {
                let found = cgroups::v2_hierarchy(&given);
                match &found {
                    Some(v2) if *v2 != given => tracing::info!(
                        cgroup_root = %given.display(), cgroup2 = %v2.display(),
                        "a hybrid host: its cgroup v2 hierarchy is the unified/ below the one configured"
                    ),
                    Some(_) => {}
                    None => tracing::warn!(
                        cgroup_root = %given.display(),
                        "--cgroup-root is no cgroup v2 hierarchy (no cgroup.controllers in it or its unified/): \
                         no container or pod labels; mount the host's /sys/fs/cgroup there"
                    ),
                }
                found
            }
            None => cgroups::cgroup2_mount(Path::new("/proc")),
        };
        match &root {
            Some(r) => {
                tracing::info!(cgroup2 = %r.display(), pod_logs = %pod_logs.display(), "attributing to containers and pods")
            }
            None => tracing::warn!("no cgroup2 mount found: no container or pod labels (set --cgroup-root)"),
        }
        Self {
            cgroups: root.map(cgroups::CgroupIndex::new),
            pods: pods::PodLogs::new(pod_logs),
            proc_root: proc_root.to_path_buf(),
            cache: HashMap::new(),
            walked: false,
        }
    }

    /// A new batch of lookups: the filesystem may be read once more.
    pub fn next_round(&mut self) {
        self.walked = false;
    }

    /// Whether `cgroup_id` was missing from the last walk of the cgroup
    /// tree (a cgroup made since, e.g. a new pod's), so `labels` had no
    /// answer for it yet.
    pub fn unknown_cgroup(&self, cgroup_id: u64) -> bool {
        cgroup_id != 0 && !self.cache.contains_key(&cgroup_id)
    }

    /// Who `pid` is (0: an unknown owner in cgroup `cgroup_id`).
    pub fn identity(&mut self, cgroup_id: u64, pid: u32) -> Identity {
        let executable = if pid == 0 { None } else { crate::node::executable::name(&self.proc_root, pid) };
        Identity { pod: self.labels(cgroup_id, pid), executable }
    }

    /// The labels for a process, from the cgroup id the kernel recorded
    /// (0 when unknown: then from /proc/<pid>/cgroup if it still runs).
    pub fn labels(&mut self, cgroup_id: u64, pid: u32) -> Option<Arc<PodLabels>> {
        if cgroup_id == 0 {
            return self.labels_from_proc(pid);
        }
        if let Some(known) = self.cache.get(&cgroup_id) {
            return known.clone();
        }
        if !self.cgroups.as_ref()?.contains(cgroup_id) {
            if self.walked {
                return None; // unknown this round; asked again next round
            }
            self.walk();
        }
        let path = self.cgroups.as_ref()?.path(cgroup_id)?.to_string();
        let labels = self.labels_for_path(&path);
        self.cache.insert(cgroup_id, labels.clone());
        labels
    }

    fn walk(&mut self) {
        self.walked = true;
        if let Some(index) = &mut self.cgroups {
            index.rebuild();
            let index = &*index;
            self.cache.retain(|id, _| index.contains(*id));
        }
        self.pods.rescan();
    }

    fn labels_for_path(&mut self, path: &str) -> Option<Arc<PodLabels>> {
        let Container { id, pod_uid } = container(path)?;
        if self.pods.get(&pod_uid).is_none() && !self.walked {
            self.walked = true;
            self.pods.rescan();
        }
        let meta = self.pods.get(&pod_uid);
        Some(Arc::new(PodLabels {
            container_id: id,
            pod_name: meta.map(|m| m.name.clone()),
            namespace: meta.map(|m| m.namespace.clone()),
            container_name: meta.and_then(|m| m.only_container.clone()),
            pod_uid,
        }))
    }

    /// `0::/path` of /proc/<pid>/cgroup (the v2 line).
    fn labels_from_proc(&mut self, pid: u32) -> Option<Arc<PodLabels>> {
        let text = std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        let path = text.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
        self.labels_for_path(&path)
    }
}
