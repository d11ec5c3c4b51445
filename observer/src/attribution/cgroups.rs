//! cgroup id -> cgroup v2 path. The kernel records each event's cgroup id
//! (`bpf_get_current_cgroup_id`: the id of the task's cgroup in the v2
//! hierarchy, which is the inode number of its directory in cgroup2fs).
//! We find the cgroup2 mount (on hybrid hosts it is
//! /sys/fs/cgroup/unified, not /sys/fs/cgroup) and index its directories
//! by inode.
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

/// The cgroup v2 hierarchy at or under `root`: `root` itself, or on a
/// hybrid host (v1 controllers at /sys/fs/cgroup, v2 at its `unified/`)
/// its `unified/`, so that one configuration (the DaemonSet's
/// /host/sys/fs/cgroup) fits both kinds of node. None: neither is one.
pub fn v2_hierarchy(root: &Path) -> Option<PathBuf> {
    // Only a cgroup2 directory has cgroup.controllers (v1 and tmpfs do not).
    [root.to_path_buf(), root.join("unified")].into_iter().find(|dir| dir.join("cgroup.controllers").exists())
}

/// The first cgroup2 mount in `proc_root`/self/mountinfo.
pub fn cgroup2_mount(proc_root: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(proc_root.join("self/mountinfo")).ok()?;
    text.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(unescape(mount_point)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out + rest
}

/// Directory inode -> path relative to the mount (e.g.
/// `/kubepods.slice/...`), rebuilt by walking the tree.
pub struct CgroupIndex {
    root: PathBuf,
    by_id: HashMap<u64, String>,
}

/// Deeper than any real hierarchy; guards against a pathological tree.
const MAX_DEPTH: usize = 16;

impl CgroupIndex {
    pub fn new(root: PathBuf) -> Self {
        Self { root, by_id: HashMap::new() }
    }

    pub fn path(&self, id: u64) -> Option<&str> {
        self.by_id.get(&id).map(String::as_str)
    }

    pub fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    pub fn rebuild(&mut self) {
        self.by_id.clear();
        let mut stack = vec![(self.root.clone(), String::new(), 0)];
        while let Some((dir, rel, depth)) = stack.pop() {
            if let Ok(meta) = std::fs::metadata(&dir) {
                self.by_id.insert(meta.ino(), if rel.is_empty() { "/".to_string() } else { rel.clone() });
            }
            if depth >= MAX_DEPTH {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    stack.push((entry.path(), format!("{rel}/{name}"), depth + 1));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hybrid_hosts_v1_tree_leads_to_its_unified_v2_hierarchy() {
        let dir = std::env::temp_dir().join(format!("observer-hybrid-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("v2")).unwrap();
        std::fs::write(dir.join("v2/cgroup.controllers"), "cpu memory\n").unwrap();
        std::fs::create_dir_all(dir.join("hybrid/unified")).unwrap();
        std::fs::create_dir_all(dir.join("hybrid/memory")).unwrap();
        std::fs::write(dir.join("hybrid/unified/cgroup.controllers"), "").unwrap();
        std::fs::create_dir_all(dir.join("v1-only/memory")).unwrap();
        assert_eq!(v2_hierarchy(&dir.join("v2")), Some(dir.join("v2")));
        assert_eq!(v2_hierarchy(&dir.join("hybrid")), Some(dir.join("hybrid/unified")));
        assert_eq!(v2_hierarchy(&dir.join("v1-only")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn finds_cgroup2_among_the_mounts() {
        let dir = std::env::temp_dir().join(format!("observer-mountinfo-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("self")).unwrap();
        std::fs::write(
            dir.join("self/mountinfo"),
            "22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
             25 22 0:23 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755\n\
             26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n\
             27 25 0:25 / /sys/fs/cgroup/cpu rw shared:11 - cgroup cgroup rw,cpu\n",
        )
        .unwrap();
        assert_eq!(cgroup2_mount(&dir), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        std::fs::write(dir.join("self/mountinfo"), "30 1 0:26 / /host\\040root/cgroup rw - cgroup2 none rw\n").unwrap();
        assert_eq!(cgroup2_mount(&dir), Some(PathBuf::from("/host root/cgroup")));
        std::fs::write(dir.join("self/mountinfo"), "garbage\n\n - \n").unwrap();
        assert_eq!(cgroup2_mount(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
