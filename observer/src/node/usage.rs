//! Ports per destination in one network namespace, from one sock_diag dump
//! of its TCP sockets (never /proc/net/tcp) and its settings.
use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
};

/// One lookup per socket of a dump (100k and more): foldhash instead of
/// the default SipHash, whose cost was a tenth of a dump's.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

use netlink_packet_sock_diag::inet::StateFlags;
use serde::Serialize;

use super::settings::NetSettings;
use super::sock_diag::{DiagSocket, Listener, TcpSocket};

/// Every state in which a connection still holds its local port: besides
/// ESTABLISHED, SYN_SENT and TIME_WAIT, the closing ones (a socket closed
/// first whose peer has not closed yet sits in FIN_WAIT2, as an orphan).
fn holds_port() -> StateFlags {
    StateFlags::ESTABLISHED
        | StateFlags::SYN_SENT
        | StateFlags::FIN_WAIT1
        | StateFlags::FIN_WAIT2
        | StateFlags::TIME_WAIT
        | StateFlags::CLOSE_WAIT
        | StateFlags::LAST_ACK
        | StateFlags::CLOSING
}

#[derive(Clone, Debug, Serialize)]
pub struct Destination {
    pub source: IpAddr,
    pub destination: SocketAddr,
    /// Local ports from the ephemeral range in use toward it, by sockets in
    /// any state that holds one (ESTABLISHED, SYN_SENT, TIME_WAIT, closing).
    pub used: u32,
    /// Of those, the connections open now (ESTABLISHED)...
    pub established: u32,
    /// ... and the ones this side closed first within the last minute
    /// (TIME_WAIT lasts 60 s): together, how much this side reuses its
    /// connections toward the destination.
    pub time_wait: u32,
    /// Seconds until none is left at the recent rate (see trend.rs); None
    /// when use is not growing or not tracked over time (doctor).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exhaustion_seconds: Option<f64>,
}

/// What one dump of a namespace's sockets tells.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SocketCounts {
    /// Ports in use per destination, most used first.
    pub destinations: Vec<Destination>,
    /// Sockets in TIME_WAIT (as `ss state time-wait` counts them).
    pub time_wait: u64,
    /// When these counts were last known to hold: their dump, or a later
    /// round that found the namespace unchanged since. A namespace waiting
    /// for its next dump exports its last counts, which the ports' trend
    /// must date right.
    #[serde(skip)]
    pub as_of: Option<std::time::Instant>,
    /// Sockets in ESTABLISHED, whatever their port (what observer's ledger
    /// of open connections is checked against, `collect::unseen_connections`).
    #[serde(skip)]
    pub established: u64,
}

/// Dump the namespace of `diag` (whose `listeners` and `settings` were just
/// read).
pub fn count(diag: &mut DiagSocket, settings: &NetSettings, listeners: &[Listener]) -> std::io::Result<SocketCounts> {
    let mut tally = Tally::new(settings, listeners);
    diag.each_tcp(holds_port(), |s| tally.add(&s))?;
    Ok(tally.finish())
}

const ESTABLISHED: u8 = 1;
const TIME_WAIT: u8 = 6;

/// Ports held per (source address, destination) and TIME_WAIT sockets,
/// counted one socket at a time.
struct Tally {
    /// One bit per port (8 KiB, kept in the L1 cache; a set's hash was a
    /// lookup per socket), set for the ephemeral ports: the range minus
    /// the reserved ports and the ports listened on (a server's accepted
    /// sockets have its listening port as their local port, even when the
    /// listener sits in the range).
    ephemeral: Vec<u64>,
    per_destination: FastMap<(IpAddr, SocketAddr), Held>,
    time_wait: u64,
    established: u64,
}

/// The sockets holding ports toward one destination.
#[derive(Default)]
struct Held {
    all: u32,
    established: u32,
    time_wait: u32,
}

impl Tally {
    fn new(settings: &NetSettings, listeners: &[Listener]) -> Self {
        let (low, high) = settings.ip_local_port_range;
        let mut ephemeral = vec![0u64; 65536 / 64];
        for port in (low..=high).filter(|p| settings.is_ephemeral(*p)) {
            ephemeral[usize::from(port / 64)] |= 1 << (port % 64);
        }
        for port in listeners.iter().map(|l| l.port) {
            ephemeral[usize::from(port / 64)] &= !(1 << (port % 64));
        }
        Self { ephemeral, per_destination: FastMap::default(), time_wait: 0, established: 0 }
    }

    fn add(&mut self, s: &TcpSocket) {
        match s.state {
            TIME_WAIT => self.time_wait += 1,
            ESTABLISHED => self.established += 1,
            _ => {}
        }
        let port = s.local.port();
        if self.ephemeral[usize::from(port / 64)] & (1 << (port % 64)) != 0 {
            let held = self.per_destination.entry((s.local.ip(), s.remote)).or_default();
            held.all += 1;
            match s.state {
                ESTABLISHED => held.established += 1,
                TIME_WAIT => held.time_wait += 1,
                _ => {}
            }
        }
    }

    fn finish(self) -> SocketCounts {
        let mut destinations: Vec<Destination> = self
            .per_destination
            .into_iter()
            .map(|((source, destination), held)| Destination {
                source,
                destination,
                used: held.all,
                established: held.established,
                time_wait: held.time_wait,
                exhaustion_seconds: None,
            })
            .collect();
        // Most used first; ties in a fixed order, so the top N is stable.
        destinations
            .sort_by(|a, b| b.used.cmp(&a.used).then((a.source, a.destination).cmp(&(b.source, b.destination))));
        SocketCounts {
            destinations,
            time_wait: self.time_wait,
            as_of: Some(std::time::Instant::now()),
            established: self.established,
        }
    }
}

/// A destination for tests: 10.0.0.1 -> 10.0.0.9:5432, `used` ports held
/// by connections open.
#[cfg(test)]
impl Destination {
    pub fn held(used: u32) -> Self {
        Destination {
            source: "10.0.0.1".parse().unwrap(),
            destination: "10.0.0.9:5432".parse().unwrap(),
            used,
            established: used,
            time_wait: 0,
            exhaustion_seconds: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summarize(settings: NetSettings, listeners: &[Listener], sockets: &[TcpSocket]) -> SocketCounts {
        let mut tally = Tally::new(&settings, listeners);
        sockets.iter().for_each(|s| tally.add(s));
        tally.finish()
    }

    const SYN_SENT: u8 = 2;

    fn sock(state: u8, local: &str, remote: &str) -> TcpSocket {
        TcpSocket {
            state,
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            recv_queue: 0,
            send_queue: 0,
            inode: 0,
        }
    }

    #[test]
    fn ports_are_counted_per_destination_within_the_range_only_reserved_and_listened_ones_left_out() {
        let settings = NetSettings {
            ip_local_reserved_ports: vec![(40003, 40004)],
            ..NetSettings::with_range((40000, 40009), 1000)
        };
        let sockets = [
            sock(ESTABLISHED, "10.0.0.1:40000", "10.0.0.9:5432"),
            sock(TIME_WAIT, "10.0.0.1:40001", "10.0.0.9:5432"),
            sock(SYN_SENT, "10.0.0.1:40002", "10.0.0.9:5432"),
            sock(ESTABLISHED, "10.0.0.1:40000", "10.0.0.9:80"), // same port, other destination
            sock(ESTABLISHED, "10.0.0.1:50000", "10.0.0.9:80"), // outside the range (bind())
            sock(ESTABLISHED, "10.0.0.1:40005", "10.0.0.7:33333"), // accepted by the listener
            sock(ESTABLISHED, "10.0.0.1:40004", "10.0.0.9:5432"), // a reserved port (bind())
        ];
        let listener = Listener {
            netns: 1,
            family: 2,
            address: "0.0.0.0".parse().unwrap(),
            port: 40005,
            cookie: 1,
            inode: 7,
            drops: 0,
            queued: 0,
            backlog: 128,
        };
        let counts = summarize(settings, &[listener], &sockets);
        let got: Vec<(String, u32, u32, u32)> = counts
            .destinations
            .iter()
            .map(|d| (d.destination.to_string(), d.used, d.established, d.time_wait))
            .collect();
        assert_eq!(got, [("10.0.0.9:5432".to_string(), 3, 1, 1), ("10.0.0.9:80".to_string(), 1, 1, 0)]);
        assert_eq!(counts.time_wait, 1);
        // Every ESTABLISHED socket, in the range or not.
        assert_eq!(counts.established, 5);
    }
}
