//! A guest whose kernel failed: a CPU locked up, or an oops or a panic.
//! Read from the console as the guest runs, so the matrix stops such a
//! guest at once (instead of at the run's 40-minute guard, or after the
//! tests that ran on a broken kernel failed one after the other) and
//! prints the kernel's own report of it.
//!
//! Why it is needed: under software emulation Debian's kernels have failed
//! while code was being patched under running callers (trampolines,
//! kprobes, the tracepoints' static keys), each time in a kernel function
//! at a patched site, never in observer's programs (the verifier bounds
//! them): 6.1 locked a CPU at `inet_stream_connect`'s call into its BPF
//! trampoline while the trace tests attached; 6.12 (kprobe mode, while a
//! test attached a kretprobe to `inet_csk_accept` under a server blocked
//! in accept() and a churn of 1 ms connections) returned from accept()
//! to address 0 through the kretprobe trampoline, and took an int3 left
//! at `inet_sk_state_store`'s tracepoint jump. The tests running then
//! fail for the kernel's sake (a server killed by the oops).

/// How long a CPU must have been stuck for the guest to count as hung.
/// Software emulation on a busy host makes the watchdog report short
/// lockups (20-60 s) that pass; a lockup that lasts two minutes has never
/// ended by itself here.
const HUNG_AFTER_SECS: u64 = 120;

/// The kernel's report of its first failure on `console`, from its first
/// line to the end of its call trace: an oops (`BUG: ...` then `Oops: ...`,
/// or `Oops: int3`), a `kernel BUG at`, a panic, or a soft lockup that has
/// lasted `HUNG_AFTER_SECS`.
///
/// Kernels since 5.14 repeat a lockup's report while it lasts, each time
/// with the total time stuck ("stuck for 48s!", "stuck for 74s!"); 5.10
/// says it once, after ~22 s, so a 5.10 guest that only locks up is left
/// to the guard.
pub fn failure(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().collect();
    let at = lines.iter().position(|line| {
        line.contains("Oops: ")
            || line.contains("kernel BUG at ")
            || line.contains("Kernel panic - not syncing")
            || stuck_for(line).is_some_and(|secs| secs >= HUNG_AFTER_SECS)
    })?;
    // An oops's header comes a few lines before it ("BUG: kernel NULL
    // pointer dereference, address: ...", "#PF: ...").
    let start = (at.saturating_sub(4)..at).find(|&i| lines[i].contains("BUG: ")).unwrap_or(at);
    // To the end of its stack ("</TASK>", since 5.16), or 60 lines.
    let end = lines[start..]
        .iter()
        .position(|line| line.contains("</TASK>"))
        .map_or(lines.len().min(start + 60), |offset| start + offset + 1);
    Some(lines[start..end.min(start + 80)].join("\n"))
}

/// The seconds of `watchdog: BUG: soft lockup - CPU#1 stuck for 134s! [...]`.
fn stuck_for(line: &str) -> Option<u64> {
    let after = line.split("soft lockup - CPU#").nth(1)?.split(" stuck for ").nth(1)?;
    after.split("s!").next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKUP: &str = "\
[ 2350.1] watchdog: BUG: soft lockup - CPU#1 stuck for 134s! [observer-churn:812]
[ 2350.1] Modules linked in: 9p
[ 2350.1] RIP: 0010:inet_stream_connect+0x0/0x60
[ 2350.1] Call Trace:
[ 2350.1]  <TASK>
[ 2350.1]  __sys_connect+0xa4/0xd0
[ 2350.1]  </TASK>
[ 2351.0] after the report";

    /// As 6.12 said it under emulation.
    const OOPS: &str = "\
[   47.852301] BUG: kernel NULL pointer dereference, address: 0000000000000000
[   47.852582] #PF: supervisor instruction fetch in kernel mode
[   47.852632] #PF: error_code(0x0010) - not-present page
[   47.852712] PGD b929067 P4D 0
[   47.852865] Oops: Oops: 0010 [#1] PREEMPT SMP NOPTI
[   47.853343] RIP: 0010:0x0
[   47.854478] Call Trace:
[   47.854919]  <TASK>
[   47.855268]  do_accept+0xfa/0x190
[   47.860710]  </TASK>
[   47.860829] Modules linked in: tcp_diag inet_diag";

    #[test]
    fn a_lockup_of_two_minutes_is_reported_from_its_header_to_its_stack() {
        let console = format!("[ 1.0] booting\n{LOCKUP}\n");
        let report = failure(&console).expect("a hang");
        assert!(report.starts_with("[ 2350.1] watchdog: BUG: soft lockup - CPU#1 stuck for 134s!"), "{report}");
        assert!(report.contains("RIP: 0010:inet_stream_connect") && report.ends_with("</TASK>"), "{report}");
        assert!(!report.contains("after the report") && !report.contains("booting"), "{report}");
    }

    #[test]
    fn a_short_lockup_that_emulation_makes_is_no_failure() {
        assert_eq!(failure(&LOCKUP.replace("134s", "48s")), None);
        assert_eq!(failure("[ 1.0] booting\n[ 2.0] MATRIX exit 0\n"), None);
    }

    #[test]
    fn the_first_lockup_report_past_two_minutes_is_the_one_printed() {
        let console =
            [LOCKUP.replace("134s", "22s"), LOCKUP.replace("134s", "120s"), LOCKUP.replace("134s", "146s")].join("\n");
        let report = failure(&console).unwrap();
        assert!(report.contains("stuck for 120s!") && !report.contains("146s") && !report.contains("22s"), "{report}");
    }

    #[test]
    fn an_oops_is_reported_from_its_bug_line_to_its_stack() {
        let console = format!("[ 4.3] virtme-ng-init: starting script\n{OOPS}\n");
        let report = failure(&console).expect("an oops");
        assert!(report.starts_with("[   47.852301] BUG: kernel NULL pointer dereference"), "{report}");
        assert!(report.contains("RIP: 0010:0x0") && report.contains("do_accept") && report.ends_with("</TASK>"));
        let int3 = "[ 92.7] Oops: int3: 0000 [#3] PREEMPT SMP NOPTI\n[ 92.7] RIP: 0010:inet_sk_state_store+0x15/0x70";
        assert!(failure(int3).unwrap().starts_with("[ 92.7] Oops: int3"));
        let panic = "[ 92.7] Kernel panic - not syncing: Fatal exception in interrupt";
        assert_eq!(failure(panic).as_deref(), Some(panic));
    }
}
