//! The attach fallback chain: each hook with a choice runs in the best mode
//! the kernel allows, forcing an unavailable mode is a clear error, and the
//! tracepoint fallbacks work everywhere.
mod common;

use std::{collections::BTreeMap, path::Path};

use observer::{
    error::Error,
    probes::{
        AttachMode, HOOKS, Probes, SkippedRuns,
        hooks::{self, Mode},
        stats::kernel_version,
    },
};

fn modes(probes: &Probes) -> BTreeMap<&'static str, Mode> {
    probes.attachments.iter().map(|a| (a.hook, a.mode)).collect()
}

/// Load in a forced mode: the mode of each hook, or the error.
fn forced(mode: AttachMode) -> Result<BTreeMap<&'static str, Mode>, Error> {
    Probes::load(mode).map(|(p, _)| modes(&p))
}

/// Forced fentry mode fails here only for the overflow hook, because this
/// kernel's trampolines cannot take its functions (Debian's 6.1: a 7th
/// parameter backported, trampolines take more than 6 from 6.6).
fn only_overflow_lacks_trampolines(fentry: &Result<BTreeMap<&'static str, Mode>, Error>) -> bool {
    matches!(fentry, Err(Error::ModeUnavailable { hook, reason, .. })
        if *hook == hooks::LISTEN_OVERFLOW && reason.contains("from Linux 6.6"))
}

#[test]
fn auto_picks_for_each_hook_the_first_mode_that_works_alone() {
    let (auto, _maps) = Probes::load(AttachMode::Auto).expect("auto mode always loads");
    let auto = modes(&auto);
    let tracepoint = forced(AttachMode::Tracepoint).expect("the tracepoint fallbacks load on every BTF kernel");
    let fentry = forced(AttachMode::Fentry);
    let kprobe = forced(AttachMode::Kprobe);
    // The kernel matrix boots kernels whose trampolines work: there auto
    // must take them, or a fentry program that stopped loading would fall
    // back unnoticed.
    if std::env::var_os("OBSERVER_TEST_TRAMPOLINES").is_some() {
        assert!(fentry.is_ok() || only_overflow_lacks_trampolines(&fentry), "fentry mode: {:?}", fentry.err());
    }
    let overflow_at = HOOKS.iter().position(|h| h.name == hooks::LISTEN_OVERFLOW).unwrap();
    for (i, hook) in HOOKS.iter().enumerate() {
        if only_overflow_lacks_trampolines(&fentry) && i < overflow_at {
            // Every hook before it attached on trampolines (those after it
            // are compared with the kprobe mode's, below).
            assert!(matches!(auto[hook.name], Mode::Fentry | Mode::Fexit), "hook {}: {:?}", hook.name, auto);
            continue;
        }
        let expected = [&fentry, &kprobe]
            .into_iter()
            .find_map(|r| r.as_ref().ok().map(|m| m[hook.name]))
            .unwrap_or(tracepoint[hook.name]);
        assert_eq!(auto[hook.name], expected, "hook {}", hook.name);
    }
    // Hooks without a choice are attached in every mode.
    for hook in ["inet_sock_set_state", "sched_process_exit"] {
        assert!(auto.contains_key(hook) && tracepoint.contains_key(hook), "{hook}");
    }
    // Where trampolines work (the kernel matrix).
    if let Ok((probes, _)) = Probes::load(AttachMode::Fentry) {
        assert_no_syscall_tracepoint(&probes);
    }
}

#[test]
fn on_a_kernel_without_kprobes_the_fallbacks_are_used_and_reported() {
    // This CI kernel has no kprobes (and fentry is refused with EPERM).
    // On kernels with kprobes this test checks the kprobe mode instead.
    let has_kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists();
    match Probes::load(AttachMode::Kprobe) {
        Ok((probes, _)) => {
            assert!(has_kprobes, "kprobe mode loaded on a kernel without kprobes");
            for a in probes.attachments.iter().filter(|a| HOOKS.iter().any(|h| h.name == a.hook)) {
                assert!(matches!(a.mode, Mode::Kprobe | Mode::Kretprobe), "{a:?}");
            }
            assert_no_syscall_tracepoint(&probes);
        }
        Err(e) => {
            assert!(!has_kprobes, "kprobe mode failed on a kernel with kprobes: {e}");
            let Error::ModeUnavailable { mode, hook, reason } = &e else { panic!("unexpected error: {e}") };
            assert_eq!(mode, "kprobe");
            assert_eq!(*hook, HOOKS[0].name, "the first hook names the failure");
            assert!(reason.contains("kprobe"), "the kernel's answer is kept: {reason}");
            assert!(reason.contains("this kernel has no kprobes"), "the missing feature is named: {reason}");
        }
    }
    if !has_kprobes {
        let (auto, _) = Probes::load(AttachMode::Auto).unwrap();
        let auto = modes(&auto);
        assert_eq!(auto["inet_csk_accept"], Mode::Tracepoint);
        assert_eq!(auto["inet_stream_connect"], Mode::Tracepoint);
        assert_eq!(auto["tcp_time_wait"], Mode::BtfTracepoint);
        assert_eq!(auto["listen_overflow"], Mode::SockDiag);
        // Only a kernel function sees a full SYN queue: absent, and said.
        assert_eq!(auto["syn_queue_full"], Mode::Absent);
    }
}

/// The preferred modes enable no syscall tracepoint: one would send every
/// syscall of the node through the kernel's slow path.
fn assert_no_syscall_tracepoint(probes: &Probes) {
    assert!(probes.attachments.iter().all(|a| !a.target.contains("syscalls/")), "{:?}", probes.attachments);
}

/// Each hook says whether this kernel counts the runs of its programs it
/// skips: fentry/fexit and tp_btf from Linux 5.12 (when the kernel's
/// program info gained the count), kprobes and tracepoints from 6.7. In
/// the matrix this covers 5.10 (nothing counted), 6.1 (kprobes not) and
/// 6.12; here 6.18.
#[test]
fn each_hook_says_whether_the_kernel_counts_its_skipped_runs() {
    let kernel = kernel_version();
    assert!(kernel >= (5, 8), "kernel version {kernel:?}");
    for mode in [AttachMode::Auto, AttachMode::Fentry, AttachMode::Kprobe, AttachMode::Tracepoint] {
        let Ok((probes, _)) = Probes::load(mode) else { continue };
        for a in &probes.attachments {
            let counted = match a.mode {
                Mode::Fentry | Mode::Fexit | Mode::BtfTracepoint => kernel >= (5, 12),
                Mode::Kprobe | Mode::Kretprobe | Mode::Tracepoint => kernel >= (6, 7),
                Mode::SockDiag | Mode::Absent => false,
            };
            let want = match (a.programs.is_empty(), counted) {
                (true, _) => SkippedRuns::NoProgram,
                (false, true) => SkippedRuns::Counted,
                (false, false) => SkippedRuns::Uncounted,
            };
            assert_eq!(a.skipped_runs, want, "{mode}: {a:?} on {kernel:?}");
        }
    }
}
