//! Connections open now, how long their handshakes took and how long they
//! lived: each socket is noted with its owner, direction and far end
//! (`OPEN_CONNECTIONS`) when its connect() sends the SYN (outbound) or when
//! a listener's child reaches ESTABLISHED (inbound); reaching ESTABLISHED
//! counts its start (outbound, with the handshake's time), leaving it (a
//! FIN sent or received, a reset) its end and lifetime, under the same
//! key. Userspace keeps established - closed per key: the connections open
//! now, exact for those established while observer ran (the state changes
//! of every TCP socket pass `inet_sock_set_state`, state.rs).
use aya_ebpf::helpers::bpf_ktime_get_ns;
use observer_common::{
    Actor, ConnectionKey, InflightConnect, ListenerKey, OpenConnection, direction, lost, tcp_state::*,
};

use crate::{
    counters::{Counted, HandshakeEnd, bump_connection_closed, bump_handshake_end, count_lost},
    kernel::{
        Sock, current_actor, sock_cgroup_id, sock_destination, sock_family, sock_local_port, sock_netns,
        tcp_total_retrans, unknown_owner,
    },
    maps::{LISTENERS, OPEN_CONNECTIONS},
};

const BPF_NOEXIST: u64 = 1;

/// The socket sent its SYN (CLOSE -> SYN_SENT, in the connecting
/// process's context): note it, so its ESTABLISHED knows the handshake's
/// time. `noted`: who connects where, as a connect() call noted it (else
/// read here). With the map full it is not noted (nor counted lost: it
/// gets its entry at ESTABLISHED if there is room then, and is counted
/// lost there if not).
#[inline(always)]
pub fn connection_syn_sent(sk: impl Sock, noted: Option<&InflightConnect>) {
    let (actor, addr, family, port) = match noted {
        Some(c) => (c.actor, c.daddr, c.family, c.dport),
        None => {
            let family = sock_family(sk);
            let (addr, port) = sock_destination(sk, family);
            (current_actor(), addr, family, port)
        }
    };
    let key =
        ConnectionKey { actor, addr, family, port, direction: direction::OUTBOUND, netns: sock_netns(sk), _pad: 0 };
    let entry =
        OpenConnection { key, since: unsafe { bpf_ktime_get_ns() }, handshaking: OpenConnection::HANDSHAKING, _pad: 0 };
    note(sk, &entry, false);
}

/// The handshake failed (SYN_SENT -> CLOSE: refused, timed out, or given
/// up by its process): count the SYNs it sent again under the key noted at
/// its SYN, and forget the socket.
#[inline(always)]
pub fn connection_failed(sk: impl Sock) {
    let Some(&entry) = (unsafe { OPEN_CONNECTIONS.get(&sk.addr()) }) else { return };
    let _ = OPEN_CONNECTIONS.remove(&sk.addr());
    let retransmits = tcp_total_retrans(sk);
    if entry.handshaking == OpenConnection::HANDSHAKING && retransmits > 0 {
        let mut key = entry.key;
        bump_handshake_end(&mut key, HandshakeEnd::Failed { retransmits });
    }
}

/// The socket entered ESTABLISHED from `old`: SYN_SENT, a connect() of
/// ours, noted at its SYN (else, a SYN older than observer or the map full
/// then, noted now under its cgroup, pid 0: no process context here); SYN_RECV, a
/// listener's new child, charged to the listener's owner until accept()
/// hands it on.
#[inline(always)]
pub fn connection_established(sk: impl Sock, old: i32) {
    let now = unsafe { bpf_ktime_get_ns() };
    if old == SYN_SENT
        && let Some(entry) = OPEN_CONNECTIONS.get_ptr_mut(&sk.addr())
    {
        // SAFETY: this socket's entry; its state changes are serialized by
        // the socket's lock. Counted (and folded, if need be) in place.
        unsafe {
            if (*entry).handshaking == OpenConnection::HANDSHAKING {
                let handshake = now.saturating_sub((*entry).since);
                (*entry).handshaking = 0;
                (*entry).since = now;
                let end = HandshakeEnd::Established { took_ns: Some(handshake), retransmits: tcp_total_retrans(sk) };
                if let Counted::No = bump_handshake_end(&mut (*entry).key, end) {
                    let _ = OPEN_CONNECTIONS.remove(&sk.addr());
                }
                return;
            }
        }
    }
    let family = sock_family(sk);
    let netns = sock_netns(sk);
    let key = if old == SYN_SENT {
        let (addr, port) = sock_destination(sk, family);
        ConnectionKey { actor: unknown_owner(sk), addr, family, port, direction: direction::OUTBOUND, netns, _pad: 0 }
    } else {
        let port = sock_local_port(sk);
        let actor = match unsafe { LISTENERS.get(&ListenerKey { netns, port, family }) } {
            Some(owner) => *owner,
            None => Actor { cgroup_id: sock_cgroup_id(sk), ..Actor::default() },
        };
        ConnectionKey { actor, addr: [0; 16], family, port, direction: direction::INBOUND, netns, _pad: 0 }
    };
    let mut entry = OpenConnection { key, since: now, handshaking: 0, _pad: 0 };
    if !note(sk, &entry, true) {
        return;
    }
    // The SYNs (SYN_SENT) or SYN-ACKs (a child: its request's) sent again.
    let end = HandshakeEnd::Established { took_ns: None, retransmits: tcp_total_retrans(sk) };
    match bump_handshake_end(&mut entry.key, end) {
        Counted::AsIs => {}
        // Its end must go where its start went.
        Counted::Folded => {
            let _ = OPEN_CONNECTIONS.insert(&sk.addr(), &entry, 0);
        }
        Counted::No => {
            let _ = OPEN_CONNECTIONS.remove(&sk.addr());
        }
    }
}

/// Put the socket's entry in; false if the map is full (counted in `LOST`
/// if `final_chance`). An entry already there belongs to an earlier socket
/// at this address whose end a skipped run missed: ended now (if it was
/// established), so it is not left open for ever.
#[inline(always)]
fn note(sk: impl Sock, entry: &OpenConnection, final_chance: bool) -> bool {
    if OPEN_CONNECTIONS.insert(&sk.addr(), entry, BPF_NOEXIST).is_ok() {
        return true;
    }
    // Who closed that earlier one is unknown: not the peer, as far as
    // observer can say.
    connection_ended(sk, false);
    let _ = OPEN_CONNECTIONS.remove(&sk.addr());
    if OPEN_CONNECTIONS.insert(&sk.addr(), entry, BPF_NOEXIST).is_err() {
        if final_chance {
            count_lost(lost::OPEN_CONNECTIONS_FULL);
        }
        return false;
    }
    true
}

/// The socket left ESTABLISHED: count its end once (one established
/// before observer started, entered by userspace, without a lifetime);
/// `by_peer`: for CLOSE_WAIT, the far end's FIN came first.
#[inline(always)]
pub fn connection_ended(sk: impl Sock, by_peer: bool) {
    let Some(&entry) = (unsafe { OPEN_CONNECTIONS.get(&sk.addr()) }) else { return };
    if entry.handshaking == OpenConnection::HANDSHAKING || OPEN_CONNECTIONS.remove(&sk.addr()).is_err() {
        return;
    }
    let lived_ns = match entry.handshaking {
        OpenConnection::OLDER => None,
        _ => Some(unsafe { bpf_ktime_get_ns() }.saturating_sub(entry.since)),
    };
    bump_connection_closed(&entry.key, lived_ns, by_peer);
}
