//! One record of the kernel's, read and printed: its kind, its far end,
//! and the line (text or JSON) a human or a script reads.
use std::net::{IpAddr, SocketAddr};

use clap::ValueEnum;
use observer_common::{AF_INET6, TraceEvent, listener_drop, trace_event};

use crate::{
    export::errno_name,
    probes::{
        Attachment, Mode,
        hooks::{LISTEN_OVERFLOW, SYN_QUEUE_FULL},
    },
};

/// The kinds of events `observer trace --events` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Kind {
    /// connect() failed: the errno the caller saw.
    ConnectError,
    /// A socket entered TIME_WAIT: its local port is held for 60 s.
    TimeWait,
    /// A listener turned a connection away: accept queue full (overflow),
    /// or SYN queue full (a SYN cookie sent, or the SYN dropped).
    Overflow,
    /// connect() sent a SYN.
    Connect,
    /// accept() handed a connection to its process.
    Accept,
}

impl Kind {
    pub fn bit(self) -> u32 {
        match self {
            Kind::ConnectError => trace_event::CONNECT_ERROR,
            Kind::TimeWait => trace_event::TIME_WAIT,
            Kind::Overflow => trace_event::LISTENER_DROP,
            Kind::Connect => trace_event::CONNECT,
            Kind::Accept => trace_event::ACCEPT,
        }
    }

    /// What the first line says is traced.
    pub fn described(self) -> &'static str {
        match self {
            Kind::ConnectError => "connect() failures",
            Kind::TimeWait => "TIME_WAIT entries",
            Kind::Overflow => "connections listeners turned away",
            Kind::Connect => "connects",
            Kind::Accept => "accepts",
        }
    }

    /// The hooks (`observer_probe_info`'s names) its events come from.
    pub fn hooks(self) -> &'static [&'static str] {
        match self {
            Kind::ConnectError => &["inet_stream_connect", "inet_sock_set_state"],
            Kind::TimeWait => &["tcp_time_wait", "inet_sock_set_state"],
            Kind::Overflow => &[LISTEN_OVERFLOW, SYN_QUEUE_FULL],
            Kind::Connect => &["inet_stream_connect"],
            Kind::Accept => &["inet_csk_accept"],
        }
    }

    /// The hooks a trace of this kind attaches: those its events come from
    /// and those recording what the events need (none now: a TIME_WAIT
    /// entry's closer is noted by the state changes' program).
    /// `inet_sock_set_state` runs for every kind (`TRACE_ALWAYS`); the
    /// rest (and the process exits only the daemon reads) stay detached,
    /// so a trace costs what its kinds cost.
    pub fn needs(self) -> &'static [&'static str] {
        match self {
            Kind::ConnectError | Kind::Connect => &["inet_stream_connect"],
            Kind::TimeWait => &["tcp_time_wait"],
            Kind::Overflow => &[LISTEN_OVERFLOW, SYN_QUEUE_FULL],
            Kind::Accept => &["inet_csk_accept"],
        }
    }

    /// The `event` of a JSON line.
    fn json_name(kind: u32) -> &'static str {
        match kind {
            trace_event::CONNECT_ERROR => "connect_error",
            trace_event::TIME_WAIT => "time_wait",
            trace_event::LISTENER_DROP => "listener_drop",
            trace_event::CONNECT => "connect",
            trace_event::ACCEPT => "accept",
            _ => "unknown",
        }
    }
}

/// Attached for every kind: the state changes remember listeners' owners
/// (an overflow's), forget a closed socket's owner (so a new socket at the
/// same address is not charged to it), and see asynchronous connect
/// failures and, in the tracepoint mode, connects and TIME_WAIT entries.
const TRACE_ALWAYS: &str = "inet_sock_set_state";

/// The hooks a trace of `kinds` attaches, each once.
pub fn hooks_needed(kinds: &[Kind]) -> Vec<&'static str> {
    let mut hooks = vec![TRACE_ALWAYS];
    for hook in kinds.iter().flat_map(|k| k.needs()) {
        if !hooks.contains(hook) {
            hooks.push(hook);
        }
    }
    hooks
}

/// Why this kernel's hooks cannot give events of `kind` one by one, if
/// they cannot: listen overflows counted by the sweep (no fentry or kprobe
/// at the kernel's own count) are only totals.
pub fn unavailable(kind: Kind, attachments: &[Attachment]) -> Option<String> {
    if kind != Kind::Overflow {
        return None;
    }
    let overflow = attachments.iter().find(|a| a.hook == LISTEN_OVERFLOW)?;
    (!matches!(overflow.mode, Mode::Fentry | Mode::Kprobe)).then(|| {
        format!(
            "listen overflows are seen one by one only at the kernel's own count (fentry or kprobe on \
             tcp_v4_syn_recv_sock / tcp_conn_request), which this kernel or --attach-mode does not allow \
             (the hook runs in mode {}): the daemon reads each listener's drop total every round instead \
             (observer_tcp_listen_overflows_total, `observer top`)",
            overflow.mode
        )
    })
}

/// The `trace_event` bits of `kinds`.
pub fn bits(kinds: &[Kind]) -> u32 {
    kinds.iter().fold(0, |bits, k| bits | k.bit())
}

/// A record as the kernel wrote it (`TraceEvent`, observer-common's
/// layout, read in place: one definition of it for both sides).
pub fn parse(record: &[u8]) -> Option<TraceEvent> {
    (record.len() >= std::mem::size_of::<TraceEvent>())
        // SAFETY: long enough, and TraceEvent is plain data (aya::Pod).
        .then(|| unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<TraceEvent>()) })
}

/// The far end: a connect's destination, an accepted connection's client,
/// a TIME_WAIT socket's peer; none for a listener drop.
pub fn far_end(e: &TraceEvent) -> Option<SocketAddr> {
    if e.kind == trace_event::LISTENER_DROP {
        return None;
    }
    let addr = if e.family == AF_INET6 {
        IpAddr::from(e.daddr)
    } else {
        IpAddr::from([e.daddr[0], e.daddr[1], e.daddr[2], e.daddr[3]])
    };
    Some(SocketAddr::new(addr, e.dport))
}

/// Who an event is about, and when, as people read them.
pub struct Named {
    pub time: String,
    pub executable: String,
    pub pod: Option<String>,
}

fn meaning(errno: u32) -> &'static str {
    nix::errno::Errno::from_raw(errno as i32).desc()
}

/// A listener drop's reason: (JSON value, what it means).
fn drop_reason(reason: u32) -> (&'static str, &'static str) {
    match reason {
        listener_drop::OVERFLOW => ("overflow", "accept queue full: the connection was dropped"),
        listener_drop::SYN_COOKIE => ("syn_cookie", "SYN queue full: answered with a SYN cookie"),
        listener_drop::SYN_DROP => ("syn_drop", "SYN queue full: the SYN was dropped, the client resends in 1 s"),
        _ => ("unknown", "unknown reason"),
    }
}

fn local(e: &TraceEvent) -> String {
    if e.lport == 0 { "?".into() } else { format!(":{}", e.lport) }
}

pub fn text_line(e: &TraceEvent, who: &Named) -> String {
    let far = far_end(e).map(|a| a.to_string()).unwrap_or_default();
    let what = match e.kind {
        trace_event::CONNECT_ERROR => {
            format!("connect {far} {} ({})", errno_name(e.detail), meaning(e.detail))
        }
        trace_event::CONNECT => format!("connect {} -> {far}", local(e)),
        trace_event::ACCEPT => format!("accept {} <- {far}", local(e)),
        trace_event::TIME_WAIT => format!("time-wait {} -> {far} (port held 60 s)", local(e)),
        trace_event::LISTENER_DROP => {
            let (name, means) = drop_reason(e.detail);
            format!("{} {} ({means})", name.replace('_', "-"), local(e))
        }
        other => format!("unknown event kind {other}"),
    };
    format!(
        "{} pid {} {}{} {what}",
        who.time,
        e.actor.tgid,
        who.executable,
        who.pod.as_ref().map(|p| format!(" pod {p}")).unwrap_or_default(),
    )
}

pub fn json_line(e: &TraceEvent, who: &Named) -> String {
    let mut line = serde_json::json!({
        "time": who.time,
        "event": Kind::json_name(e.kind),
        "pid": e.actor.tgid,
        "executable": who.executable,
        "pod": who.pod,
    });
    let fields = line.as_object_mut().expect("an object");
    if let Some(far) = far_end(e) {
        let name = match e.kind {
            trace_event::ACCEPT => "peer",
            _ => "destination",
        };
        fields.insert(name.into(), far.to_string().into());
    }
    if e.lport != 0 {
        fields.insert("local_port".into(), e.lport.into());
    }
    match e.kind {
        trace_event::CONNECT_ERROR => {
            fields.insert("errno".into(), e.detail.into());
            fields.insert("error".into(), errno_name(e.detail).into());
            fields.insert("meaning".into(), meaning(e.detail).into());
        }
        trace_event::LISTENER_DROP => {
            let (name, means) = drop_reason(e.detail);
            fields.insert("reason".into(), name.into());
            fields.insert("meaning".into(), means.into());
        }
        _ => {}
    }
    line.to_string()
}

#[cfg(test)]
mod tests {
    use observer_common::AF_INET;

    use super::*;

    fn event(kind: u32, detail: u32) -> TraceEvent {
        let mut e = TraceEvent { kind, detail, family: AF_INET, dport: 27017, lport: 40001, ..TraceEvent::default() };
        e.daddr[..4].copy_from_slice(&[10, 0, 0, 5]);
        e.actor.tgid = 7;
        e
    }

    fn who() -> Named {
        Named { time: "T".into(), executable: "app".into(), pod: Some("shop/api-1".into()) }
    }

    #[test]
    fn each_kind_reads_as_what_happened() {
        let line = |kind, detail| text_line(&event(kind, detail), &who());
        assert_eq!(
            line(trace_event::CONNECT_ERROR, 99),
            "T pid 7 app pod shop/api-1 connect 10.0.0.5:27017 EADDRNOTAVAIL (Cannot assign requested address)"
        );
        assert_eq!(line(trace_event::CONNECT, 0), "T pid 7 app pod shop/api-1 connect :40001 -> 10.0.0.5:27017");
        assert_eq!(line(trace_event::ACCEPT, 0), "T pid 7 app pod shop/api-1 accept :40001 <- 10.0.0.5:27017");
        assert!(line(trace_event::TIME_WAIT, 0).ends_with("time-wait :40001 -> 10.0.0.5:27017 (port held 60 s)"));
        assert!(
            line(trace_event::LISTENER_DROP, listener_drop::SYN_DROP)
                .ends_with("syn-drop :40001 (SYN queue full: the SYN was dropped, the client resends in 1 s)")
        );
    }

    #[test]
    fn json_names_the_far_end_by_its_role_and_a_drop_by_its_reason() {
        let json = |kind, detail| -> serde_json::Value {
            serde_json::from_str(&json_line(&event(kind, detail), &who())).unwrap()
        };
        let accept = json(trace_event::ACCEPT, 0);
        assert_eq!((accept["event"].as_str(), accept["peer"].as_str()), (Some("accept"), Some("10.0.0.5:27017")));
        let error = json(trace_event::CONNECT_ERROR, 111);
        assert_eq!(
            (error["error"].as_str(), error["destination"].as_str()),
            (Some("ECONNREFUSED"), Some("10.0.0.5:27017"))
        );
        let dropped = json(trace_event::LISTENER_DROP, listener_drop::OVERFLOW);
        assert_eq!((dropped["reason"].as_str(), dropped["local_port"].as_u64()), (Some("overflow"), Some(40001)));
        assert!(dropped.get("destination").is_none(), "a listener drop has no far end");
        assert_eq!(bits(&[Kind::ConnectError, Kind::Accept]), trace_event::CONNECT_ERROR | trace_event::ACCEPT);
    }
}
