//! What an attach failure means for the user: the kernel feature that is
//! missing and the version that has it, added to the kernel's own words
//! (the verifier's text, an errno), which name neither.

/// BPF helpers newer than the oldest kernel observer supports, by number,
/// with the version that added them: an object built against newer headers
/// may call one (the verifier then says only `invalid func unknown#N`).
const HELPERS: &[(u32, &str, &str)] = &[
    (174, "bpf_ktime_get_coarse_ns", "5.11"),
    (183, "bpf_get_func_arg", "5.17"),
    (184, "bpf_get_func_ret", "5.17"),
    (185, "bpf_get_func_arg_cnt", "5.17"),
];

/// `error` (one way's failure, as reported) with the missing feature named
/// where it is recognised.
pub fn explain(error: &str) -> String {
    match why(error) {
        Some(why) => format!("{error} ({why})"),
        None => error.to_string(),
    }
}

fn why(error: &str) -> Option<String> {
    if let Some(n) = error.split("unknown#").nth(1).and_then(|r| {
        let digits: String = r.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    }) {
        return Some(match HELPERS.iter().find(|(id, ..)| *id == n) {
            Some((_, name, version)) => format!("this kernel lacks BPF helper {name} (#{n}), added in Linux {version}"),
            None => format!("this kernel lacks BPF helper #{n}: it is newer than this kernel"),
        });
    }
    if error.contains("kprobe/type") {
        return Some("this kernel has no kprobes (CONFIG_KPROBES off, or kernel lockdown forbids them)".into());
    }
    if error.contains("os error 524") || error.contains("Unknown error 524") {
        return Some(
            "this kernel cannot attach fentry/fexit: BPF trampolines need Linux 5.5+ on x86-64, 6.0+ on arm64".into(),
        );
    }
    if error.contains("Operation not permitted") && lockdown().is_some_and(|l| l != "none") {
        // Lockdown is one cause of EPERM for root, not the only one (an LSM
        // policy is another): named as a lead, not as the verdict.
        return Some(format!(
            "kernel lockdown is `{}` (/sys/kernel/security/lockdown), which can refuse these programs even to root",
            lockdown().unwrap_or_default()
        ));
    }
    None
}

/// The active lockdown mode, as the kernel shows it (`none [integrity]
/// confidentiality` -> integrity).
fn lockdown() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    text.split_whitespace().find_map(|w| w.strip_prefix('[')?.strip_suffix(']').map(String::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_helper_is_named_with_its_version() {
        let e = "fexit: the BPF_PROG_LOAD syscall returned Invalid argument (os error 22). Verifier output: 0: \
                 (85) call unknown#184\ninvalid func unknown#184";
        let text = explain(e);
        assert!(text.starts_with(e), "the kernel's own words stay: {text}");
        assert!(
            text.ends_with("(this kernel lacks BPF helper bpf_get_func_ret (#184), added in Linux 5.17)"),
            "{text}"
        );
        assert!(explain("invalid func unknown#250").contains("BPF helper #250: it is newer than this kernel"));
    }

    #[test]
    fn missing_kprobes_and_trampolines_are_named() {
        let kprobe = explain("kprobe: `/sys/bus/event_source/devices/kprobe/type`: No such file or directory");
        assert!(kprobe.contains("this kernel has no kprobes"), "{kprobe}");
        let fentry = explain("fentry: attach failed: Unknown error 524 (os error 524)");
        assert!(fentry.contains("BPF trampolines need Linux 5.5+"), "{fentry}");
        assert_eq!(explain("something else"), "something else");
    }
}
