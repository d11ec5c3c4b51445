//! A process's open files against its RLIMIT_NOFILE: at the limit, accept()
//! and connect()'s socket() fail with EMFILE, another way a connection
//! avalanche ends.
use std::path::Path;

/// Open files of one process, and its soft limit (the one that fails).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    pub open: u64,
    pub limit: u64,
}

/// None: the process is gone, out of reach, has no limit, or holds no
/// file at all (kernel threads have no file table: nothing to count, so
/// their limits are never read).
pub fn of_process(proc_root: &Path, pid: u32) -> Option<OpenFiles> {
    of(&procfs::process::Process::new_with_root(proc_root.join(pid.to_string())).ok()?, proc_root)
}

/// `of_process` for a process already open (one of `proc_root`'s).
pub fn of(process: &procfs::process::Process, proc_root: &Path) -> Option<OpenFiles> {
    // The count first: one stat, and a node's kernel threads (hundreds on
    // a large machine) end here.
    let open = count(&proc_root.join(process.pid.to_string()).join("fd")).filter(|n| *n > 0)?;
    let procfs::process::LimitValue::Value(limit) = process.limits().ok()?.max_open_files.soft_limit else {
        return None;
    };
    Some(OpenFiles { open, limit })
}

/// The descriptors of /proc/PID/fd (`dir`) the kernel counts taken. Since
/// Linux 6.2 the directory's size says it: one stat, where listing a
/// server's 15,000 connections took ~5 ms every round; it also counts a
/// descriptor reserved by a call still in progress (a server waiting in
/// accept() holds the number its next connection gets), which is taken
/// against RLIMIT_NOFILE too. Before 6.2, the entries as `ls` lists them
/// (not procfs's `fd_count`, whose fallback counts `.` and `..` too).
fn count(dir: &Path) -> Option<u64> {
    match std::fs::metadata(dir).ok()?.len() {
        0 => Some(std::fs::read_dir(dir).ok()?.count() as u64),
        size => Some(size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_open_file_counts_once_as_ls_lists_them() {
        // A child of our own that holds still: this test binary's other
        // threads open files while it runs. Besides stdin, stdout and
        // stderr it has what it inherited (a jobserver's pipe, say).
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let proc_dir = Path::new("/proc").join(child.id().to_string());
        // Until it sleeps its files move: before the exec it is a copy of
        // this process, files too, and after it the dynamic loader opens
        // and closes the libraries (a count then a listing once read 5 and
        // 6). glibc's nanosleep() is the clock_nanosleep system call.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let call = std::fs::read_to_string(proc_dir.join("syscall")).unwrap_or_default();
            if call.split_whitespace().next() == Some(&nix::libc::SYS_clock_nanosleep.to_string()) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "sleep never slept: /proc/PID/syscall `{call}`");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let dir = proc_dir.join("fd");
        let counted = count(&dir);
        let listed = std::fs::read_dir(&dir).unwrap().count() as u64;
        let _ = child.kill();
        let _ = child.wait();
        assert!(listed >= 3, "{listed}");
        assert_eq!(counted, Some(listed));
    }
}
