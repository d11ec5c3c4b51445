//! Whether a process still runs, as /proc shows it: the kernel's exit
//! notice comes from the thread-group leader, which can end
//! (`pthread_exit`) while the process goes on, and a notice can be missed.
//! And which process a pid is: its start time tells a reused pid apart.
use std::path::Path;

/// When process `pid` started (clock ticks after boot, `stat` field 22),
/// if it runs: a pid that shows a new start time is another process.
pub fn started_at(proc_root: &Path, pid: u32) -> Option<u64> {
    if !is_running(proc_root, pid) {
        return None;
    }
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // Fields after the command: state is field 3, start time field 22.
    text.rsplit_once(')')?.1.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// True while any thread of process `pid` runs. A process whose leader
/// thread has exited shows as a zombie leader with live threads beside it.
pub fn is_running(proc_root: &Path, pid: u32) -> bool {
    let dir = proc_root.join(pid.to_string());
    match state(&dir.join("stat")) {
        None => false,
        Some('Z' | 'X') => std::fs::read_dir(dir.join("task"))
            .map(|tasks| tasks.flatten().any(|t| !matches!(state(&t.path().join("stat")), None | Some('Z' | 'X'))))
            .unwrap_or(false),
        Some(_) => true,
    }
}

/// The state letter of a `stat` file (after the command, which may hold
/// spaces and parentheses: the last ')' ends it).
fn state(stat: &Path) -> Option<char> {
    let text = std::fs::read_to_string(stat).ok()?;
    text.rsplit_once(')')?.1.trim_start().chars().next()
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
        assert!(is_running(&root, 10));
        assert!(is_running(&root, 11), "leader gone, a thread runs on");
        assert!(!is_running(&root, 12), "all gone, not reaped yet");
        assert!(!is_running(&root, 13), "no such process");
        assert_eq!(started_at(&root, 10), Some(1010));
        assert_eq!(started_at(&root, 11), Some(1011), "the leader's, zombie or not");
        assert_eq!(started_at(&root, 12), None, "ended");
        let _ = std::fs::remove_dir_all(&root);
    }
}
