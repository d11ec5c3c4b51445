//! Whether a process still runs, as /proc shows it: the kernel's exit
//! notice comes from the thread-group leader, which can end
//! (`pthread_exit`) while the process goes on, and a notice can be missed.
//! And which process a pid is: its start time tells a reused pid apart.
use std::path::Path;

/// When process `pid` started (clock ticks after boot, `stat` field 22),
/// while any thread of it runs (None once it ended): a pid that shows a
/// new start time is another process.
pub fn started_at(proc_root: &Path, pid: u32) -> Option<u64> {
    let dir = proc_root.join(pid.to_string());
    let (state, started) = stat(&dir.join("stat"))?;
    runs(&dir, state).then_some(started?)
}

/// Whether the process of `dir`, its leader in `state`, has a thread left:
/// a process whose leader thread has exited shows as a zombie leader with
/// live threads beside it.
fn runs(dir: &Path, state: char) -> bool {
    match state {
        'Z' | 'X' => std::fs::read_dir(dir.join("task"))
            .map(|tasks| tasks.flatten().any(|t| !matches!(stat(&t.path().join("stat")), None | Some(('Z' | 'X', _)))))
            .unwrap_or(false),
        _ => true,
    }
}

/// The state letter and the start time of a `stat` file, in one read.
/// The command before them may hold spaces and parentheses: the last ')'
/// ends it; state is field 3, the start time field 22.
fn stat(path: &Path) -> Option<(char, Option<u64>)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut fields = text.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.nth(22 - 4).and_then(|f| f.parse().ok())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(root: &Path, pid: u32, leader: char, threads: &[char]) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("task")).unwrap();
        // Fields 4 to 21 as 1, the start time (22) 1000 + pid.
        let middle = vec!["1"; 18].join(" ");
        std::fs::write(dir.join("stat"), format!("{pid} (a (b) c) {leader} {middle} {} 7 8", 1000 + pid)).unwrap();
        for (i, s) in threads.iter().enumerate() {
            let task = dir.join("task").join((pid + i as u32).to_string());
            std::fs::create_dir_all(&task).unwrap();
            std::fs::write(task.join("stat"), format!("{pid} (a) {s} 1")).unwrap();
        }
    }

    #[test]
    fn a_zombie_leader_with_a_live_thread_still_runs() {
        let root = std::env::temp_dir().join(format!("observer-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        fake(&root, 10, 'S', &['S']);
        fake(&root, 11, 'Z', &['Z', 'S']);
        fake(&root, 12, 'Z', &['Z']);
        assert_eq!(started_at(&root, 10), Some(1010), "runs");
        assert_eq!(started_at(&root, 11), Some(1011), "leader gone, a thread runs on: the leader's start");
        assert_eq!(started_at(&root, 12), None, "all gone, not reaped yet");
        assert_eq!(started_at(&root, 13), None, "no such process");
        let _ = std::fs::remove_dir_all(&root);
    }
}
