//! TCP state changes (tp_btf `inet_sock_set_state`), available on every
//! kernel with BTF. One program does all the per-socket bookkeeping:
//! - CLOSE -> SYN_SENT: inside a connect() call, note who connects where
//!   and the socket's owner (connect.rs);
//! - SYN_SENT -> ESTABLISHED/CLOSE: the outcome of a connect still going
//!   on when its connect() call returned;
//! - -> LISTEN: record the listener's owner for userspace;
//! - LISTEN -> CLOSE: where the sweep reads listeners' drop counters (no
//!   overflow hook), queue the listener's last one for userspace;
//! - -> FIN_WAIT1: the socket sent the first FIN, so its CLOSE will be a
//!   TIME_WAIT entry (time_wait.rs);
//! - FIN_WAIT2/CLOSING -> CLOSE: a TIME_WAIT entry (time_wait.rs);
//! - CLOSE -> SYN_SENT, -> ESTABLISHED, ESTABLISHED ->: a connection's
//!   SYN, start and end (connections.rs);
//! - -> CLOSE: forget the socket's owner.
use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use observer_common::{ClosedListener, ListenerKey, lost, lru, tcp_state::*};

use crate::{
    connect::{connect_settled, syn_sent_in_connect},
    connections::{connection_ended, connection_established, connection_failed, connection_syn_sent},
    counters::{count_lost, lru_insert, lru_remove_if_there},
    kernel::{
        IPPROTO_TCP, Sock, TypedSock, current_actor, sock_family, sock_local_port, sock_netns, sock_owner,
        sock_protocol,
    },
    maps::{CLOSED_LISTENERS, INFLIGHT_CONNECTS, LISTENERS, SOCK_OWNERS, config, offset},
    time_wait::{closed_first, count_time_wait, is_time_wait_entry, take_owner},
};

/// TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn sock_state(ctx: BtfTracePointContext) -> i32 {
    let old: i32 = ctx.arg(1);
    let new: i32 = ctx.arg(2);
    // The closing transitions after the first (FIN_WAIT1 -> FIN_WAIT2 ->
    // ...) need nothing here; leave before reading the socket (this
    // program runs ~10 times per connection).
    if !(old == SYN_SENT
        || new == SYN_SENT
        || new == LISTEN
        || new == CLOSE
        || new == ESTABLISHED
        || old == ESTABLISHED
        || new == FIN_WAIT1)
    {
        return 0;
    }
    let sk = TypedSock(ctx.arg(0));
    if sock_protocol(sk) != IPPROTO_TCP {
        return 0;
    }
    if new == ESTABLISHED {
        connection_established(sk, old);
    } else if old == ESTABLISHED {
        connection_ended(sk, new == CLOSE_WAIT);
    }
    match (old, new) {
        (CLOSE, SYN_SENT) => {
            let noted = syn_sent_in_connect(sk);
            connection_syn_sent(sk, noted);
        }
        (SYN_SENT, _) => {
            connect_settled(sk, new == CLOSE);
            if new == CLOSE {
                connection_failed(sk);
            }
        }
        (_, LISTEN) => record_listener(sk),
        (LISTEN, CLOSE) if config().listen_drops_from_sweep == 1 => record_closed_listener(sk),
        (_, FIN_WAIT1) => closed_first(sk),
        _ => {}
    }
    if new == CLOSE {
        // The socket's owner is forgotten here: an entry left at its
        // destroy tells `time_wait_missed` this run was skipped. Only a
        // listener and a socket that sent the first FIN have one: the
        // passive closer's LAST_ACK -> CLOSE looks for none (a lookup is
        // ~50 ns of this program's ~360 a run).
        let owner = match old {
            FIN_WAIT1 | FIN_WAIT2 | CLOSING | LISTEN => take_owner(sk),
            _ => None,
        };
        if is_time_wait_entry(sk, old, new) {
            count_time_wait(sk, owner);
        }
        if old != SYN_SENT {
            // Normally gone already; never let an entry outlive its socket,
            // since a new socket may get the same address.
            lru_remove_if_there(&INFLIGHT_CONNECTS, lru::INFLIGHT_CONNECTS, &sk.addr());
        }
    }
    0
}

/// listen(): process context, so the current task owns the listener.
#[inline(always)]
fn record_listener(sk: impl Sock) {
    let actor = current_actor();
    let key = ListenerKey { netns: sock_netns(sk), port: sock_local_port(sk), family: sock_family(sk) };
    let _ = lru_insert(&LISTENERS, lru::LISTENERS, &key, &actor);
    let _ = lru_insert(&SOCK_OWNERS, lru::SOCK_OWNERS, &sk.addr(), &actor);
}

/// A listener closes: its drop counter goes with it, so queue its last
/// value (and its cookie, by which the sweep knows it) for userspace. The
/// listener is unhashed in this same state change: no SYN finds it after.
#[inline(always)]
fn record_closed_listener(sk: impl Sock) {
    let owner = sock_owner(sk);
    let closed = ClosedListener {
        cookie: unsafe { sk.sock_field::<u64>(offset!(skc_cookie)) }.unwrap_or(0),
        listener: ListenerKey { netns: sock_netns(sk), port: sock_local_port(sk), family: sock_family(sk) },
        drops: unsafe { sk.sock_field::<u32>(offset!(sock_drops)) }.unwrap_or(0),
        _pad: 0,
        owner,
    };
    if CLOSED_LISTENERS.push(&closed, 0).is_err() {
        count_lost(lost::CLOSED_LISTENERS_FULL);
    }
}
