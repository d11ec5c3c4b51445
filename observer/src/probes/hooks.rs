//! The hook table: for each kernel hook, the ways to attach it, best first.
//!
//! Preferred ways (fentry/fexit, then kprobes) run only where the event
//! happens and exist on most production kernels; the tracepoint ways work on
//! every kernel with BTF, including ones without kprobes or trampolines
//! (like our CI kernel). The loader takes the first way that attaches, and
//! reports which one it used.
use std::fmt;

use aya::{
    Btf, Ebpf,
    programs::{BtfTracePoint, FEntry, FExit, KProbe, TracePoint},
};
use observer_common::{Config, names::programs};

use super::{AttachMode, offsets::KernelFacts, write_config};
use crate::error::{Error, report};

/// How a hook ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    Fentry,
    Fexit,
    Kprobe,
    Kretprobe,
    Tracepoint,
    BtfTracepoint,
    SockDiag,
    /// Not counted: this kernel offers the hook no place to attach.
    Absent,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Fentry => "fentry",
            Mode::Fexit => "fexit",
            Mode::Kprobe => "kprobe",
            Mode::Kretprobe => "kretprobe",
            Mode::Tracepoint => "tracepoint",
            Mode::BtfTracepoint => "tp_btf",
            Mode::SockDiag => "sock_diag",
            Mode::Absent => "none",
        })
    }
}

/// One attached hook, as logged and exported (`observer_probe_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub hook: &'static str,
    pub mode: Mode,
    pub target: String,
    /// The eBPF programs doing this hook's counting (none when another
    /// hook's programs count for it).
    pub programs: Vec<&'static str>,
    /// Whether this kernel reports the runs of those programs it skips
    /// (`observer_kernel_missed_events_total`).
    pub skipped_runs: SkippedRuns,
}

impl Attachment {
    /// `hook` attached `way` to `target`; whether its skipped runs are
    /// counted is known once its programs are open (`Probes::load`).
    fn of(hook: &Hook, way: &Way, target: String) -> Self {
        Self {
            hook: hook.name,
            mode: way.mode(),
            target,
            programs: way.programs(),
            skipped_runs: SkippedRuns::NoProgram,
        }
    }
}

/// Whether the kernel counts the runs of a hook's programs it skips.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SkippedRuns {
    /// Counted: observer_kernel_missed_events_total has its series.
    Counted,
    /// Skipped silently by this kernel (too old for the program type).
    Uncounted,
    /// The hook has no programs of its own.
    #[default]
    NoProgram,
}

impl SkippedRuns {
    pub fn as_str(self) -> &'static str {
        match self {
            SkippedRuns::Counted => "counted",
            SkippedRuns::Uncounted => "uncounted",
            SkippedRuns::NoProgram => "no_program",
        }
    }
}

/// Config flags a tracepoint fallback turns on in the shared programs.
#[derive(Clone, Copy, Debug)]
enum Flag {
    ListenDropsFromSweep,
    SynQueueFromConnRequest,
}

/// What a way needs of this kernel besides its function: Err says why not.
type Precondition = fn(&KernelFacts) -> Result<(), String>;

/// One way to attach a hook.
#[derive(Debug)]
enum Way {
    Fentry {
        prog: &'static str,
        function: &'static str,
    },
    Fexit {
        prog: &'static str,
        function: &'static str,
        /// What the program needs of this kernel besides the function
        /// (checked before loading; the error says why it cannot run).
        needs: Option<Precondition>,
    },
    Kprobe {
        prog: &'static str,
        function: &'static str,
    },
    Kretprobe {
        prog: &'static str,
        function: &'static str,
    },
    /// A program where `function` starts and one where it returns: both
    /// attach, or neither.
    FentryFexit {
        entry: &'static str,
        exit: &'static str,
        function: &'static str,
    },
    /// The same with a kprobe and a kretprobe.
    KprobeKretprobe {
        entry: &'static str,
        exit: &'static str,
        function: &'static str,
    },
    /// One fentry program per function, (program, function): all attach,
    /// or none.
    Fentries {
        programs: &'static [(&'static str, &'static str)],
        needs: Option<Precondition>,
    },
    /// The same with kprobes.
    Kprobes {
        programs: &'static [(&'static str, &'static str)],
        needs: Option<Precondition>,
    },
    /// Classic tracepoints: (program, category, event).
    Tracepoints(&'static [(&'static str, &'static str, &'static str)]),
    BtfTracepoint {
        prog: &'static str,
        event: &'static str,
    },
    /// Counted by programs attached for other hooks (see `ALWAYS`), once
    /// this flag tells them to.
    SharedTracepoint {
        flag: Flag,
        mode: Mode,
        via: &'static str,
    },
    /// Counted from state changes by `sock_state` (attached for
    /// inet_sock_set_state) in every mode; `prog` on tp_btf `event` counts
    /// the runs of it the kernel skipped.
    StateChanges {
        via: &'static str,
        prog: &'static str,
        event: &'static str,
    },
    /// Counted by the listen_overflow hook's program at `tcp_conn_request`
    /// (the kernel's test repeated at its entry) once `flag` tells it to;
    /// only where that hook attached there (fentry or kprobe), in its mode.
    AtConnRequest {
        flag: Flag,
        via: &'static str,
    },
    /// The last resort of a hook that only a function can count (no
    /// tracepoint sees its event), allowed in every mode: where the
    /// function cannot be attached, the signal is absent and
    /// `observer_probe_info` says why (`mode="none"`), rather than the
    /// whole mode failing for one optional signal.
    Absent {
        why: &'static str,
    },
}

impl Way {
    fn allowed_in(&self, mode: AttachMode) -> bool {
        match mode {
            AttachMode::Auto => true,
            _ if matches!(self, Way::Absent { .. }) => true,
            AttachMode::Fentry | AttachMode::Kprobe if matches!(self, Way::AtConnRequest { .. }) => true,
            AttachMode::Fentry => {
                matches!(self, Way::Fentry { .. } | Way::Fexit { .. } | Way::FentryFexit { .. } | Way::Fentries { .. })
            }
            AttachMode::Kprobe => matches!(
                self,
                Way::Kprobe { .. } | Way::Kretprobe { .. } | Way::KprobeKretprobe { .. } | Way::Kprobes { .. }
            ),
            AttachMode::Tracepoint => matches!(
                self,
                Way::Tracepoints(_)
                    | Way::BtfTracepoint { .. }
                    | Way::SharedTracepoint { .. }
                    | Way::StateChanges { .. }
            ),
        }
    }

    /// Whether this way is for this kernel at all (checked before loading).
    fn runs_here(&self, kernel: &KernelFacts) -> Result<(), String> {
        match self {
            Way::Fexit { needs: Some(needs), .. }
            | Way::Fentries { needs: Some(needs), .. }
            | Way::Kprobes { needs: Some(needs), .. } => needs(kernel),
            _ => Ok(()),
        }
    }

    fn mode(&self) -> Mode {
        match self {
            Way::Fentry { .. } | Way::FentryFexit { .. } | Way::Fentries { .. } => Mode::Fentry,
            Way::Fexit { .. } => Mode::Fexit,
            Way::Kprobe { .. } | Way::KprobeKretprobe { .. } | Way::Kprobes { .. } => Mode::Kprobe,
            Way::Kretprobe { .. } => Mode::Kretprobe,
            Way::Tracepoints(_) => Mode::Tracepoint,
            Way::BtfTracepoint { .. } | Way::StateChanges { .. } => Mode::BtfTracepoint,
            Way::SharedTracepoint { mode, .. } => *mode,
            // The overflow program's mode, which `attach_all` reports.
            Way::AtConnRequest { .. } => Mode::Fentry,
            Way::Absent { .. } => Mode::Absent,
        }
    }

    fn programs(&self) -> Vec<&'static str> {
        match self {
            Way::FentryFexit { entry, exit, .. } | Way::KprobeKretprobe { entry, exit, .. } => vec![*entry, *exit],
            Way::Fentry { prog, .. }
            | Way::Fexit { prog, .. }
            | Way::Kprobe { prog, .. }
            | Way::Kretprobe { prog, .. }
            | Way::BtfTracepoint { prog, .. }
            | Way::StateChanges { prog, .. } => vec![*prog],
            Way::Tracepoints(list) => list.iter().map(|(prog, ..)| *prog).collect(),
            Way::Fentries { programs, .. } | Way::Kprobes { programs, .. } => {
                programs.iter().map(|(prog, _)| *prog).collect()
            }
            Way::SharedTracepoint { .. } | Way::AtConnRequest { .. } | Way::Absent { .. } => Vec::new(),
        }
    }
}

/// The hook counting listen-queue overflows (its mode decides where the
/// collector takes the counts from).
pub const LISTEN_OVERFLOW: &str = "listen_overflow";

/// The hook counting SYNs that met a full SYN queue.
pub const SYN_QUEUE_FULL: &str = "syn_queue_full";

pub struct Hook {
    pub name: &'static str,
    ways: &'static [Way],
}

/// Hooks with a choice of modes, attached first: their outcome decides the
/// flags the shared tracepoint programs need.
pub static HOOKS: &[Hook] = &[
    // connect() into TCP's socket layer, at its inner half
    // `__inet_stream_connect`, which TCP Fast Open's sendmsg() calls too.
    // Its programs also count connects (SYNs sent) at the call's return,
    // which knows whether the kernel found a local port, for a socket
    // `sock_state` saw enter SYN_SENT in the call: no program on
    // tcp_connect, one run fewer per connection (BENCHMARKS.md history 23).
    Hook {
        name: "inet_stream_connect",
        ways: &[
            Way::FentryFexit {
                entry: programs::CONNECT_CALL_FENTRY,
                exit: programs::CONNECT_CALL_FEXIT,
                function: "__inet_stream_connect",
            },
            Way::KprobeKretprobe {
                entry: programs::CONNECT_CALL_KPROBE,
                exit: programs::CONNECT_CALL_KRETPROBE,
                function: "__inet_stream_connect",
            },
            Way::Tracepoints(&[
                (programs::CONNECT_ENTER, "syscalls", "sys_enter_connect"),
                (programs::CONNECT_EXIT, "syscalls", "sys_exit_connect"),
            ]),
        ],
    },
    Hook {
        name: "inet_csk_accept",
        ways: &[
            // One program per prototype (observer-ebpf's accept.rs); the
            // one this kernel's BTF does not have is passed over.
            Way::Fexit {
                prog: programs::INET_CSK_ACCEPT_FEXIT,
                function: "inet_csk_accept",
                needs: Some(|o| accept_prototype(o, 2)),
            },
            Way::Fexit {
                prog: programs::INET_CSK_ACCEPT_FEXIT_4,
                function: "inet_csk_accept",
                needs: Some(|o| accept_prototype(o, 4)),
            },
            Way::Kretprobe { prog: programs::INET_CSK_ACCEPT_KRETPROBE, function: "inet_csk_accept" },
            Way::Tracepoints(&[
                (programs::ACCEPT4_EXIT, "syscalls", "sys_exit_accept4"),
                (programs::ACCEPT_EXIT, "syscalls", "sys_exit_accept"),
            ]),
        ],
    },
    // Where the kernel counts TcpExtListenOverflows (observer-ebpf's
    // overflow.rs); the fallback reads the listeners' drop counters.
    Hook {
        name: LISTEN_OVERFLOW,
        ways: &[
            Way::Fentries {
                programs: OVERFLOW_FENTRIES,
                needs: Some(|k| overflow_fields(k).and(trampolines_take_syn_recv_sock(k))),
            },
            Way::Kprobes { programs: OVERFLOW_KPROBES, needs: Some(overflow_fields) },
            Way::SharedTracepoint {
                flag: Flag::ListenDropsFromSweep,
                mode: Mode::SockDiag,
                via: "the listeners' sk_drops read by the sweep (NETLINK_SOCK_DIAG), and a closing listener's last \
                      one at inet_sock_set_state LISTEN->CLOSE, in sock_state",
            },
        ],
    },
    // Where the kernel counts TcpExtTCPReqQFullDoCookies/Drop
    // (observer-ebpf's syn_queue.rs). A static function: a kernel may have
    // inlined it, and no tracepoint sees the event.
    Hook {
        name: SYN_QUEUE_FULL,
        ways: &[
            Way::Fentry { prog: programs::SYN_QUEUE_FULL_FENTRY, function: "tcp_syn_flood_action" },
            Way::Kprobe { prog: programs::SYN_QUEUE_FULL_KPROBE, function: "tcp_syn_flood_action" },
            Way::AtConnRequest {
                flag: Flag::SynQueueFromConnRequest,
                via: "tcp_conn_request (tcp_syn_flood_action inlined: the kernel's SYN-queue test repeated at entry, \
                      in the listen_overflow program)",
            },
            Way::Absent {
                why: "SYNs meeting a full SYN queue are counted only at tcp_syn_flood_action (fentry or kprobe), \
                      which this kernel or --attach-mode does not allow; no tracepoint sees them",
            },
        ],
    },
];

const OVERFLOW_FENTRIES: &[(&str, &str)] = &[
    (programs::OVERFLOW_SYN_FENTRY, "tcp_conn_request"),
    (programs::OVERFLOW_ACK_V4_FENTRY, "tcp_v4_syn_recv_sock"),
    (programs::OVERFLOW_ACK_V6_FENTRY, "tcp_v6_syn_recv_sock"),
];

const OVERFLOW_KPROBES: &[(&str, &str)] = &[
    (programs::OVERFLOW_SYN_KPROBE, "tcp_conn_request"),
    (programs::OVERFLOW_ACK_V4_KPROBE, "tcp_v4_syn_recv_sock"),
    (programs::OVERFLOW_ACK_V6_KPROBE, "tcp_v6_syn_recv_sock"),
];

/// The overflow programs read fields whose offsets are optional in
/// `KernelOffsets`: they run only where this kernel's BTF has them all.
fn overflow_fields(kernel: &KernelFacts) -> Result<(), String> {
    let o = &kernel.offsets;
    let fields = [
        ("sock.sk_ack_backlog", o.sock_ack_backlog),
        ("sock.sk_max_ack_backlog", o.sock_max_ack_backlog),
        ("inet_connection_sock.icsk_accept_queue.qlen", o.icsk_syn_queue_len),
        ("sk_buff.protocol", o.skb_protocol),
        ("sk_buff.cb / tcp_skb_cb.tcp_tw_isn", o.skb_tcp_tw_isn),
        ("net.ipv4.sysctl_tcp_syncookies", o.net_tcp_syncookies),
    ];
    let missing: Vec<&str> = fields.iter().filter(|(_, offset)| *offset == 0).map(|(name, _)| *name).collect();
    if missing.is_empty() { Ok(()) } else { Err(format!("this kernel's BTF lacks {}", missing.join(", "))) }
}

/// x86-64 trampolines take functions of more than 6 parameters from Linux
/// 6.6; stable kernels before it (Debian's 6.1) got a 7th parameter in
/// `tcp_v4/v6_syn_recv_sock` by a backport, which their trampolines refuse
/// (ENOTSUPP). Kprobes count it there (`auto` picks them).
fn trampolines_take_syn_recv_sock(kernel: &KernelFacts) -> Result<(), String> {
    match kernel.syn_recv_sock_params {
        n if n > 6 && kernel.version < (6, 6) => Err(format!(
            "tcp_v4_syn_recv_sock takes {n} parameters on this kernel, and BPF trampolines take more than 6 only \
             from Linux 6.6 (kprobes count it here: --attach-mode auto or kprobe)"
        )),
        _ => Ok(()),
    }
}

/// Hooks that run in every mode: they are the fallbacks' shared programs
/// and the only source of some signals (state changes, process exits).
static ALWAYS: &[Hook] = &[
    Hook {
        name: "inet_sock_set_state",
        ways: &[Way::BtfTracepoint { prog: programs::SOCK_STATE, event: "inet_sock_set_state" }],
    },
    Hook {
        name: "sched_process_exit",
        ways: &[Way::Tracepoints(&[(programs::PROCESS_EXIT, "sched", "sched_process_exit")])],
    },
    // TIME_WAIT entries are counted from state changes in every mode (one
    // program on the state tracepoint, which runs anyway); the runs the
    // kernel skips are counted at the socket's destroy (observer-ebpf's
    // time_wait.rs). A program on tcp_time_wait cost a run more per
    // connection and, at fentry, a twin besides.
    Hook {
        name: "tcp_time_wait",
        ways: &[Way::StateChanges {
            via: "inet_sock_set_state FIN_WAIT2/CLOSING->CLOSE without error, in sock_state; the runs the kernel \
                  skipped, at tcp_destroy_sock",
            prog: programs::TIME_WAIT_MISSED,
            event: "tcp_destroy_sock",
        }],
    },
];

/// Attach every hook, or only those named in `only` (`observer trace`
/// attaches what its kinds need). A hook left out leaves its flag unset:
/// no other program counts in its place.
pub(super) fn attach_all(
    ebpf: &mut Ebpf,
    btf: &Btf,
    kernel: &KernelFacts,
    mode: AttachMode,
    only: Option<&[&str]>,
) -> Result<Vec<Attachment>, Error> {
    let wanted = |hook: &Hook| only.is_none_or(|names| names.contains(&hook.name));
    let mut attached: Vec<Attachment> = Vec::new();
    let mut config =
        Config { syn_queue_full_at_backlog: u32::from(kernel.syn_queue_full_at_backlog), ..Config::default() };
    for hook in HOOKS.iter().filter(|h| wanted(h)) {
        let (way, target) = attach_hook(ebpf, btf, kernel, hook, mode, &attached)?;
        let flag = match way {
            Way::SharedTracepoint { flag, .. } | Way::AtConnRequest { flag, .. } => Some(flag),
            _ => None,
        };
        match flag {
            Some(Flag::ListenDropsFromSweep) => config.listen_drops_from_sweep = 1,
            Some(Flag::SynQueueFromConnRequest) => config.syn_queue_from_conn_request = 1,
            None => {}
        }
        // Before the next hooks and the shared programs attach, so no
        // program runs without the flags of the hooks before it.
        write_config(ebpf, config)?;
        let mut attachment = Attachment::of(hook, way, target);
        if let Way::AtConnRequest { .. } = way {
            attachment.mode = overflow_programs_mode(&attached).unwrap_or(attachment.mode);
        }
        attached.push(attachment);
    }
    for hook in ALWAYS.iter().filter(|h| wanted(h)) {
        let (way, target) = attach_hook(ebpf, btf, kernel, hook, AttachMode::Auto, &[])?;
        attached.push(Attachment::of(hook, way, target));
    }
    Ok(attached)
}

/// Try the hook's ways allowed in `mode`, in order; the first that attaches
/// wins. All failures are kept for the error message.
fn attach_hook(
    ebpf: &mut Ebpf,
    btf: &Btf,
    kernel: &KernelFacts,
    hook: &'static Hook,
    mode: AttachMode,
    earlier: &[Attachment],
) -> Result<(&'static Way, String), Error> {
    let mut tried = Vec::new();
    // Ways for another kernel than this one (e.g. another prototype of the
    // function) are passed over without a word, unless none attaches.
    let mut not_here = Vec::new();
    for way in hook.ways.iter().filter(|w| w.allowed_in(mode)) {
        if let Err(why) = way.runs_here(kernel) {
            not_here.push(format!("{}: {why}", way.mode()));
            continue;
        }
        if matches!(way, Way::AtConnRequest { .. }) && overflow_programs_mode(earlier).is_none() {
            tried.push(format!("{LISTEN_OVERFLOW}'s programs: not attached at tcp_conn_request here"));
            continue;
        }
        match try_way(ebpf, btf, way) {
            Ok(target) => {
                if !tried.is_empty() {
                    let using = match way {
                        Way::AtConnRequest { .. } => overflow_programs_mode(earlier).unwrap_or(way.mode()),
                        _ => way.mode(),
                    };
                    tracing::info!(hook = hook.name, failed = %tried.join("; "), %using, "falling back");
                }
                return Ok((way, target));
            }
            Err(e) => tried.push(format!("{}: {}", way.mode(), super::explain::explain(&e))),
        }
    }
    tried.extend(not_here);
    if tried.is_empty() {
        return Err(Error::ModeUnavailable {
            mode: mode.to_string(),
            hook: hook.name,
            reason: "this hook has no way to attach in that mode".into(),
        });
    }
    if mode != AttachMode::Auto {
        return Err(Error::ModeUnavailable { mode: mode.to_string(), hook: hook.name, reason: tried.join("; ") });
    }
    Err(Error::Attach { hook: hook.name, tried: tried.join("; ") })
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, String>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = ebpf.program_mut(name).ok_or_else(|| format!("program {name} not in the object"))?;
    prog.try_into().map_err(|e: aya::programs::ProgramError| report(&e))
}

/// An inet_csk_accept fexit program reads the return value after `params`
/// arguments (observer-ebpf's accept.rs): it runs only where the kernel's
/// prototype has that many.
fn accept_prototype(kernel: &KernelFacts, params: u32) -> Result<(), String> {
    match kernel.inet_csk_accept_params {
        n if n == params => Ok(()),
        0 => Err("this kernel's BTF has no inet_csk_accept prototype".into()),
        n if n == 2 || n == 4 => Err(format!("this kernel's inet_csk_accept takes {n} parameters, not {params}")),
        n => Err(format!(
            "inet_csk_accept takes {n} parameters on this kernel; observer's fexit programs know the 2-parameter \
             (Linux 6.10+) and 4-parameter prototypes"
        )),
    }
}

fn try_way(ebpf: &mut Ebpf, btf: &Btf, way: &Way) -> Result<String, String> {
    let err = |e: aya::programs::ProgramError| report(&e);
    match *way {
        Way::Fentry { prog, function } => {
            let p: &mut FEntry = program(ebpf, prog)?;
            p.load(function, btf).map_err(err)?;
            p.attach().map_err(err)?;
            Ok(function.to_string())
        }
        Way::Fexit { prog, function, .. } => {
            let p: &mut FExit = program(ebpf, prog)?;
            p.load(function, btf).map_err(err)?;
            p.attach().map_err(err)?;
            Ok(function.to_string())
        }
        Way::FentryFexit { entry, exit, function } => {
            let p: &mut FEntry = program(ebpf, entry)?;
            p.load(function, btf).map_err(err)?;
            p.attach().map_err(err)?;
            let exit_attached = program::<FExit>(ebpf, exit).and_then(|p| {
                p.load(function, btf).map_err(err)?;
                p.attach().map(|_| ()).map_err(err)
            });
            if let Err(e) = exit_attached {
                // Never leave an entry program whose returns nobody sees.
                let _ = program::<FEntry>(ebpf, entry).map(|p| p.unload());
                return Err(format!("{exit}: {e}"));
            }
            Ok(function.to_string())
        }
        Way::KprobeKretprobe { entry, exit, function } => {
            for prog in [entry, exit] {
                let attached = program::<KProbe>(ebpf, prog).and_then(|p| {
                    p.load().map_err(err)?;
                    p.attach(function, 0).map(|_| ()).map_err(err)
                });
                if let Err(e) = attached {
                    let _ = program::<KProbe>(ebpf, entry).map(|p| p.unload());
                    return Err(format!("{prog}: {e}"));
                }
            }
            Ok(function.to_string())
        }
        Way::Kprobe { prog, function, .. } | Way::Kretprobe { prog, function } => {
            let p: &mut KProbe = program(ebpf, prog)?;
            p.load().map_err(err)?;
            p.attach(function, 0).map_err(err)?;
            Ok(function.to_string())
        }
        Way::Fentries { programs, .. } => attach_each(
            ebpf,
            programs,
            |p: &mut FEntry, function| {
                p.load(function, btf).map_err(err)?;
                p.attach().map(|_| ()).map_err(err)
            },
            |p| {
                let _ = p.unload();
            },
        ),
        Way::Kprobes { programs, .. } => attach_each(
            ebpf,
            programs,
            |p: &mut KProbe, function| {
                p.load().map_err(err)?;
                p.attach(function, 0).map(|_| ()).map_err(err)
            },
            |p| {
                let _ = p.unload();
            },
        ),
        Way::Tracepoints(list) => {
            for &(prog, category, event) in list {
                let p: &mut TracePoint = program(ebpf, prog)?;
                p.load().map_err(err)?;
                p.attach(category, event).map_err(|e| format!("{category}/{event}: {}", err(e)))?;
            }
            Ok(list.iter().map(|(_, c, e)| format!("{c}/{e}")).collect::<Vec<_>>().join(","))
        }
        Way::BtfTracepoint { prog, event } => {
            let p: &mut BtfTracePoint = program(ebpf, prog)?;
            p.load(event, btf).map_err(err)?;
            p.attach().map_err(err)?;
            Ok(event.to_string())
        }
        Way::SharedTracepoint { via, .. } => Ok(via.to_string()),
        Way::StateChanges { via, prog, event } => {
            try_way(ebpf, btf, &Way::BtfTracepoint { prog, event })?;
            Ok(via.to_string())
        }
        Way::AtConnRequest { via, .. } => Ok(via.to_string()),
        Way::Absent { why } => Ok(why.to_string()),
    }
}

/// The mode the listen_overflow hook's programs run in at
/// `tcp_conn_request`, if it attached there.
fn overflow_programs_mode(attached: &[Attachment]) -> Option<Mode> {
    attached.iter().find(|a| a.hook == LISTEN_OVERFLOW && matches!(a.mode, Mode::Fentry | Mode::Kprobe)).map(|a| a.mode)
}

/// Attach each (program, function) of `programs` with `attach`; if one
/// fails, `unload` those attached before it (a hook counts one way only).
fn attach_each<T>(
    ebpf: &mut Ebpf,
    programs: &[(&'static str, &'static str)],
    attach: impl Fn(&mut T, &str) -> Result<(), String>,
    unload: impl Fn(&mut T),
) -> Result<String, String>
where
    for<'a> &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    for (i, &(prog, function)) in programs.iter().enumerate() {
        if let Err(e) = program::<T>(ebpf, prog).and_then(|p| attach(p, function)) {
            for &(attached, _) in &programs[..i] {
                let _ = program::<T>(ebpf, attached).map(&unload);
            }
            return Err(format!("{prog} on {function}: {e}"));
        }
    }
    Ok(programs.iter().map(|(_, function)| *function).collect::<Vec<_>>().join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_with_a_choice_ends_in_a_tracepoint_way() {
        for hook in HOOKS {
            let last = hook.ways.last().unwrap();
            assert!(last.allowed_in(AttachMode::Tracepoint), "{} has no fallback", hook.name);
            assert!(hook.ways.iter().any(|w| w.allowed_in(AttachMode::Fentry)), "{}", hook.name);
            assert!(hook.ways.iter().any(|w| w.allowed_in(AttachMode::Kprobe)), "{}", hook.name);
        }
    }

    /// The table and observer-common's list of programs (which the bench
    /// reads) name the same programs.
    #[test]
    fn the_table_attaches_every_program_of_the_object() {
        let mut in_table: Vec<&str> = HOOKS.iter().chain(ALWAYS).flat_map(|h| h.ways).flat_map(Way::programs).collect();
        in_table.sort();
        in_table.dedup();
        let mut all = programs::ALL.to_vec();
        all.sort();
        assert_eq!(in_table, all);
    }

    #[test]
    fn forced_modes_filter_ways() {
        let fentry = Way::Fentry { prog: "p", function: "f" };
        assert!(fentry.allowed_in(AttachMode::Auto));
        assert!(fentry.allowed_in(AttachMode::Fentry));
        assert!(!fentry.allowed_in(AttachMode::Kprobe));
        assert!(!fentry.allowed_in(AttachMode::Tracepoint));
    }
}
