//! The sockets older than observer, which no state change of ours saw
//! begin: a BPF iterator over a network namespace's TCP sockets
//! (`iter/tcp`, run by userspace in each namespace at start, after the
//! other programs are attached) writes out every full socket (not the
//! timewait and request minisockets), with the `struct sock *` that keys
//! `OPEN_CONNECTIONS` and `SOCK_OWNERS`, and whether a program follows it
//! as an established connection. Userspace enters the established ones no
//! program follows in `OPEN_CONNECTIONS` (`OpenConnection::OLDER`), so
//! their ends count like any other, and counts them open; and enters the
//! holder of each socket a process holds in `SOCK_OWNERS`, so its TIME_WAIT
//! entry names that process. Only an iterator gives the socket's address:
//! sock_diag and /proc/net/tcp do not.
use aya_ebpf::helpers::bpf_seq_write;
use observer_common::{IteratedSocket, OpenConnection, tcp_state::*};

use crate::{
    kernel::{
        ProbedSock, read_at, read_destination_into, sock_cgroup_id, sock_family, sock_local_port, sock_remote_port,
        sock_tcp_state,
    },
    maps::{OPEN_CONNECTIONS, offset},
};

/// `struct bpf_iter__tcp { struct bpf_iter_meta *meta; struct sock_common
/// *sk_common; uid_t uid; }`; `bpf_iter_meta` starts with its `seq_file *`.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub extern "C" fn older_connections(ctx: *const u64) -> i32 {
    // SAFETY: the context's layout above; the verifier checks each load.
    let (meta, sk) = unsafe { (*ctx, *ctx.add(1)) };
    // The last call, after the last socket, has none.
    if sk == 0 {
        return 0;
    }
    // The context's pointer is typed as `sock_common`, too short for
    // struct sock's fields: read them by helper.
    let sock = ProbedSock(sk);
    let state = sock_tcp_state(sock);
    if state == TIME_WAIT || state == NEW_SYN_RECV {
        return 0;
    }
    // Followed by the programs: not older. Entered by userspace (its second
    // pass asks which of those are still established): not followed.
    let followed = state == ESTABLISHED
        && unsafe { OPEN_CONNECTIONS.get(&sk) }.is_some_and(|entry| entry.handshaking != OpenConnection::OLDER);
    let family = sock_family(sock);
    let mut record = IteratedSocket {
        sk,
        inode: socket_inode(sk),
        cgroup_id: sock_cgroup_id(sock),
        family,
        local_port: sock_local_port(sock),
        state: state as u16,
        followed: followed as u16,
        ..IteratedSocket::default()
    };
    if state != LISTEN {
        read_destination_into(sock, family, &mut record.remote_addr);
        record.remote_port = sock_remote_port(sock);
    }
    // SAFETY: `meta` is the iterator's, its first field the seq_file.
    unsafe {
        let seq = *(meta as *const u64);
        bpf_seq_write(
            seq as *mut _,
            &record as *const IteratedSocket as *const _,
            core::mem::size_of::<IteratedSocket>() as u32,
        );
    }
    0
}

/// The socket's inode number (/proc/PID/fd's `socket:[N]`), 0 if it has no
/// `struct socket` (a child no accept() took) or the offsets are unknown.
#[inline(always)]
fn socket_inode(sk: u64) -> u64 {
    if offset!(socket_inode_ino) == 0 {
        return 0;
    }
    unsafe {
        match read_at::<u64>(sk, offset!(sock_socket)) {
            Ok(socket) if socket != 0 => read_at::<u64>(socket, offset!(socket_inode_ino)).unwrap_or(0),
            _ => 0,
        }
    }
}
