//! A guest whose kernel locked a CPU: read from its console as the guest
//! runs, so the matrix stops it minutes after the lockup instead of at the
//! run's 40-minute guard, and prints the kernel's own report of it.
//!
//! Why it is needed: Debian's 6.1 once locked a CPU of the emulated guest
//! at the entry of inet_stream_connect (the call into its BPF trampoline)
//! while the trace tests attached their programs, and the guest sat there
//! until the guard killed it, 30 minutes of CI spent on nothing.

/// How long a CPU must have been stuck for the guest to count as hung.
/// Software emulation on a busy host makes the watchdog report short
/// lockups (20-60 s) that pass; a lockup that lasts two minutes has never
/// ended by itself here.
const HUNG_AFTER_SECS: u64 = 120;

/// The kernel's report of a soft lockup that has lasted `HUNG_AFTER_SECS`,
/// from its first line to the end of its call trace, if the console holds
/// one.
///
/// Kernels since 5.14 repeat the report while the lockup lasts, each time
/// with the total time stuck ("stuck for 48s!", "stuck for 74s!"); 5.10
/// says it once, after ~22 s, so its guests are left to the guard.
pub fn hung(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().collect();
    let start = lines.iter().position(|line| stuck_for(line).is_some_and(|secs| secs >= HUNG_AFTER_SECS))?;
    // The report: its header to the end of its stack ("</TASK>", since
    // 5.16), or 60 lines where there is no such end.
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

    const REPORT: &str = "\
[ 2350.1] watchdog: BUG: soft lockup - CPU#1 stuck for 134s! [observer-churn:812]
[ 2350.1] Modules linked in: 9p
[ 2350.1] RIP: 0010:inet_stream_connect+0x0/0x60
[ 2350.1] Call Trace:
[ 2350.1]  <TASK>
[ 2350.1]  __sys_connect+0xa4/0xd0
[ 2350.1]  </TASK>
[ 2351.0] after the report";

    #[test]
    fn a_lockup_of_two_minutes_is_a_hang_reported_from_its_header_to_its_stack() {
        let console = format!("[ 1.0] booting\n{REPORT}\n");
        let report = hung(&console).expect("a hang");
        assert!(report.starts_with("[ 2350.1] watchdog: BUG: soft lockup - CPU#1 stuck for 134s!"), "{report}");
        assert!(report.contains("RIP: 0010:inet_stream_connect") && report.ends_with("</TASK>"), "{report}");
        assert!(!report.contains("after the report") && !report.contains("booting"), "{report}");
    }

    #[test]
    fn a_short_lockup_that_emulation_makes_is_not_a_hang() {
        let console = REPORT.replace("134s", "48s");
        assert_eq!(hung(&console), None);
        assert_eq!(hung("[ 1.0] booting\n[ 2.0] MATRIX exit 0\n"), None);
    }

    #[test]
    fn the_first_report_past_two_minutes_is_the_one_printed() {
        let console =
            [REPORT.replace("134s", "22s"), REPORT.replace("134s", "120s"), REPORT.replace("134s", "146s")].join("\n");
        let report = hung(&console).unwrap();
        assert!(report.contains("stuck for 120s!") && !report.contains("146s") && !report.contains("22s"), "{report}");
    }
}
