//! A process's executable name as the OpenTelemetry conventions mean
//! `process.executable.name`: the base name of the file it runs
//! (`/proc/PID/exe`). Not `comm`: the kernel cuts that at 15 bytes, and a
//! process or thread sets it to anything (`prctl(PR_SET_NAME)`).
use std::path::Path;

/// What the kernel appends to the link of an executable that was deleted
/// or replaced after the process started it (an upgrade in place).
const DELETED: &str = " (deleted)";

/// None: the process is gone, a kernel thread (no executable), or out of
/// reach (reading another process's `exe` needs CAP_SYS_PTRACE).
pub fn name(proc_root: &Path, pid: u32) -> Option<String> {
    let target = std::fs::read_link(proc_root.join(pid.to_string()).join("exe")).ok()?;
    let base = target.file_name()?.to_string_lossy();
    Some(base.strip_suffix(DELETED).unwrap_or(&base).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_name_of_the_file_the_process_runs() {
        let own = name(Path::new("/proc"), std::process::id()).unwrap();
        let exe = std::env::current_exe().unwrap();
        assert_eq!(own, exe.file_name().unwrap().to_string_lossy());
        assert!(own.len() > 15, "longer than comm can hold: {own}");
    }

    #[test]
    fn a_replaced_executable_keeps_its_name() {
        let root = std::env::temp_dir().join(format!("observer-exe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("42")).unwrap();
        std::os::unix::fs::symlink("/usr/sbin/nginx (deleted)", root.join("42/exe")).unwrap();
        assert_eq!(name(&root, 42).as_deref(), Some("nginx"));
        assert_eq!(name(&root, 43), None, "gone");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
