//! Connections open now, and how long they lived: each socket that reaches
//! ESTABLISHED is noted with its owner, direction and far end
//! (`OPEN_CONNECTIONS`); when it leaves ESTABLISHED (a FIN sent or
//! received, a reset) its lifetime is counted under the same key. Userspace
//! keeps established - closed per key: the connections open now, exact for
//! those established while observer ran (the state changes of every TCP
//! socket pass `inet_sock_set_state`, state.rs).
use aya_ebpf::helpers::bpf_ktime_get_ns;
use observer_common::{Actor, ConnectionKey, ListenerKey, OpenConnection, direction, lost, tcp_state::*};

use crate::{
    counters::{Counted, bump_connection_closed, bump_connection_established, count_lost},
    kernel::{sock_cgroup_id, sock_destination, sock_family, sock_local_port, sock_netns, sock_owner},
    maps::{LISTENERS, OPEN_CONNECTIONS},
};

/// The socket entered ESTABLISHED from `old`: SYN_SENT, a connect() of
/// ours (the owner recorded at connect); SYN_RECV, a listener's new child,
/// charged to the listener's owner until accept() hands it on.
#[inline(always)]
pub fn connection_established(sk: u64, old: i32) {
    let family = sock_family(sk);
    let netns = sock_netns(sk);
    let key = if old == SYN_SENT {
        let (addr, port) = sock_destination(sk, family);
        ConnectionKey { actor: sock_owner(sk), addr, family, port, direction: direction::OUTBOUND, netns, _pad: 0 }
    } else {
        let port = sock_local_port(sk);
        let actor = match unsafe { LISTENERS.get(&ListenerKey { netns, port, family }) } {
            Some(owner) => *owner,
            None => Actor { cgroup_id: sock_cgroup_id(sk), ..Actor::default() },
        };
        ConnectionKey { actor, addr: [0; 16], family, port, direction: direction::INBOUND, netns, _pad: 0 }
    };
    // Noted first: a connection the map has no room for is left out
    // whole, so the counts of those followed stay exact. An entry already
    // there is an earlier socket at this address whose end a skipped run
    // missed: counted as ended now, so it is not left open for ever.
    let since = unsafe { bpf_ktime_get_ns() };
    let mut entry = OpenConnection { key, since };
    const BPF_NOEXIST: u64 = 1;
    if OPEN_CONNECTIONS.insert(&sk, &entry, BPF_NOEXIST).is_err() {
        connection_ended(sk);
        if OPEN_CONNECTIONS.insert(&sk, &entry, BPF_NOEXIST).is_err() {
            return count_lost(lost::OPEN_CONNECTIONS_FULL);
        }
    }
    match bump_connection_established(&mut entry.key) {
        Counted::AsIs => {}
        // Its end must go where its start went.
        Counted::Folded => {
            let _ = OPEN_CONNECTIONS.insert(&sk, &entry, 0);
        }
        Counted::No => {
            let _ = OPEN_CONNECTIONS.remove(&sk);
        }
    }
}

/// The socket left ESTABLISHED: count its end once.
#[inline(always)]
pub fn connection_ended(sk: u64) {
    let Some(&entry) = (unsafe { OPEN_CONNECTIONS.get(&sk) }) else { return };
    if OPEN_CONNECTIONS.remove(&sk).is_err() {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    bump_connection_closed(&entry.key, now.saturating_sub(entry.since));
}
