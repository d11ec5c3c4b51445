//! TCP sockets through NETLINK_SOCK_DIAG: the listeners with their drop
//! counters and accept queues, and every socket for the ceilings.
//!
//! A listener's `sk_drops` (what `ss -tlnm` prints as `d<N>`) counts every
//! connection dropped because its accept queue (or SYN queue) was full; the
//! kernel bumps it together with TcpExtListenDrops/ListenOverflows on both
//! the SYN path and the 3rd-ACK path. sock_diag answers for the network
//! namespace the netlink socket was opened in: `DiagSocket::open` from a
//! thread inside that namespace (`netns::in_each_namespace`), then ask on
//! it from any thread, round after round.
use std::io;

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkBuffer, Parseable};
use netlink_packet_sock_diag::{
    constants::AF_INET,
    inet::{ExtensionFlags, InetResponse, InetResponseHeader, StateFlags, nlas::Nla},
};
use netlink_sys::{Socket, protocols::NETLINK_SOCK_DIAG};

/// One listening socket as sock_diag reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listener {
    pub netns: u32,
    pub family: u16,
    /// The address it listens on (0.0.0.0 or :: for every address).
    pub address: std::net::IpAddr,
    pub port: u16,
    pub cookie: u64,
    /// Socket inode, as in /proc/PID/fd/N -> socket:[inode].
    pub inode: u32,
    /// Connections dropped because a queue was full (`sk_drops`).
    pub drops: u32,
    /// Connections waiting in the accept queue now, and the queue's limit.
    pub queued: u32,
    pub backlog: u32,
}

/// A NETLINK_SOCK_DIAG socket bound to the network namespace it was opened
/// in. Each request carries its own sequence number, so the replies of a
/// dump cut short by an error are never read as the next dump's.
pub struct DiagSocket {
    socket: Socket,
    sequence: u32,
}

impl DiagSocket {
    /// A socket for the calling thread's network namespace. Neither bound
    /// nor connected: the first request binds it to a port id of its own
    /// (netlink's autobind) and goes to the kernel (port id 0) by default,
    /// three system calls fewer for every namespace read.
    pub fn open() -> io::Result<Self> {
        Ok(Self { socket: Socket::new(NETLINK_SOCK_DIAG)?, sequence: 0 })
    }

    /// All TCP listeners of the socket's namespace (`netns`). A dump of
    /// LISTEN alone walks only the kernel's listener hash, never the
    /// established one: it stays cheap however many connections the node
    /// holds.
    pub fn listeners(&mut self, netns: u32) -> io::Result<Vec<Listener>> {
        let mut out = Vec::new();
        self.dump(StateFlags::LISTEN, ExtensionFlags::SKMEMINFO, |payload| {
            let resp = InetResponse::parse(payload).map_err(invalid)?;
            let drops = resp
                .nlas
                .iter()
                .find_map(|nla| match nla {
                    Nla::MemInfo(m) => Some(m.drops),
                    _ => None,
                })
                .unwrap_or(0);
            out.push(Listener {
                netns,
                family: resp.header.family as u16,
                address: resp.header.socket_id.source_address,
                port: resp.header.socket_id.source_port,
                cookie: u64::from_ne_bytes(resp.header.socket_id.cookie),
                inode: resp.header.inode,
                drops,
                queued: resp.header.recv_queue,
                backlog: resp.header.send_queue,
            });
            Ok(())
        })?;
        Ok(out)
    }

    /// The TCP sockets in `states` (both families) of the socket's
    /// namespace, TIME_WAIT ones included (sock_diag lists them too), handed
    /// to `f` as they are parsed: a namespace may hold 100k sockets. Any
    /// state but LISTEN walks the node-wide established hash, every
    /// namespace's sockets, to pick this namespace's: the cost of a call
    /// grows with the node's sockets, not the namespace's.
    pub fn each_tcp(&mut self, states: StateFlags, mut f: impl FnMut(TcpSocket)) -> io::Result<()> {
        // No extensions asked for: the fixed header is the whole reply, and
        // parsing only it halves the parse of a 100k-socket dump.
        self.dump(states, ExtensionFlags::empty(), |payload| {
            let header = InetResponseHeader::parse(payload).map_err(invalid)?;
            let id = &header.socket_id;
            f(TcpSocket {
                state: header.state,
                local: (id.source_address, id.source_port).into(),
                remote: (id.destination_address, id.destination_port).into(),
                recv_queue: header.recv_queue,
                send_queue: header.send_queue,
                inode: header.inode,
            });
            Ok(())
        })
    }

    fn dump(
        &mut self,
        states: StateFlags,
        extensions: ExtensionFlags,
        mut each: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        self.sequence = self.sequence.wrapping_add(1);
        self.socket.send(&compat_request(self.sequence, states, extensions), 0)?;
        let mut recv = Vec::with_capacity(64 * 1024);
        loop {
            recv.clear();
            self.socket.recv(&mut recv, 0)?;
            let mut offset = 0;
            while offset < recv.len() {
                let msg = NetlinkBuffer::new_checked(&recv[offset..]).map_err(invalid)?;
                let len = msg.length() as usize;
                if msg.sequence_number() == self.sequence {
                    match msg.message_type() {
                        TCPDIAG_GETSOCK => each(msg.payload())?,
                        NLMSG_DONE => return Ok(()),
                        NLMSG_ERROR => {
                            let code =
                                msg.payload().get(..4).map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                            return Err(io::Error::from_raw_os_error(-code));
                        }
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                // Messages are 4-byte aligned (NLMSG_ALIGN).
                offset += len.next_multiple_of(4);
            }
        }
    }
}

/// One TCP socket as sock_diag reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    /// TCP state number (1 ESTABLISHED, 2 SYN_SENT, 6 TIME_WAIT, 10 LISTEN).
    pub state: u8,
    pub local: std::net::SocketAddr,
    pub remote: std::net::SocketAddr,
    /// Listeners: connections waiting to be accepted, and the backlog.
    pub recv_queue: u32,
    pub send_queue: u32,
    pub inode: u32,
}

/// TCPDIAG_GETSOCK, inet_diag's original request. Its dump covers both
/// address families in one walk of the kernel's TCP hash (the request has
/// no family: the kernel sets AF_UNSPEC), where SOCK_DIAG_BY_FAMILY walks
/// that hash once per family. The hash is shared by every network
/// namespace, so each namespace's dump visits every socket of the node:
/// one walk instead of two halves the cost of a sweep. The replies are the
/// usual inet_diag messages, parsed by netlink-packet-sock-diag; only the
/// request (which the crate does not offer in this form) is built here.
const TCPDIAG_GETSOCK: u16 = 18;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: {e}"))
}

/// struct nlmsghdr, then struct inet_diag_req (linux/inet_diag.h): family,
/// address lengths, extensions, the socket id (48 bytes; ignored by
/// dumps), the states, the tables (unused).
fn compat_request(sequence: u32, states: StateFlags, extensions: ExtensionFlags) -> [u8; 76] {
    let mut req = [0u8; 76];
    req[0..4].copy_from_slice(&76u32.to_ne_bytes());
    req[4..6].copy_from_slice(&TCPDIAG_GETSOCK.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&sequence.to_ne_bytes());
    req[16] = AF_INET;
    req[19] = extensions.bits();
    req[68..72].copy_from_slice(&states.bits().to_ne_bytes());
    req
}
