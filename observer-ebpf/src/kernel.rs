//! Reads of kernel structs through the BTF-derived offsets (see
//! `observer_common::KernelOffsets`). Most reads go through
//! `bpf_probe_read_kernel`, which is allowed in every program type we use and
//! turns a bad pointer into an error instead of a fault. A socket's own
//! fields are read with plain loads where the verifier knows the pointer's
//! type (`Sock`).
use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
    bpf_probe_read_kernel, bpf_probe_read_kernel_buf,
};
use observer_common::{AF_INET, AF_INET6, Actor, TASK_COMM_LEN};

use crate::maps::{SOCK_OWNERS, offset};

pub const IPPROTO_TCP: u16 = 6;

/// Read a `T` at `base + offset` (a kernel address).
#[inline(always)]
pub unsafe fn read_at<T>(base: u64, offset: u32) -> Result<T, i64> {
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T).map_err(|e| e as i64) }
}

/// A kernel `struct sock *`, and how its own fields are read. Programs
/// that follow every connection read a handful of fields at each of its
/// ~10 state changes; a helper call per field was a large share of their
/// time (BENCHMARKS.md, history 22).
pub trait Sock: Copy {
    /// The socket's address: the key of the per-socket maps.
    fn addr(self) -> u64;

    /// Read a `T` at `offset` into `struct sock` itself (its
    /// `sock_common` included). Fields of the structs that embed it
    /// (`inet_sock`, `inet_connection_sock`, `tcp_sock`) go through
    /// `read_at(sk.addr(), ..)`: a typed pointer's loads are checked
    /// against `struct sock`'s BTF, which ends before them.
    unsafe fn sock_field<T: Copy>(self, offset: u32) -> Result<T, i64>;
}

/// A socket pointer whose type the verifier knows from the kernel's BTF:
/// an argument or return value of a tp_btf, fentry or fexit program, as
/// the context gave it (not one read back from a map, which is a plain
/// number). Its fields are plain loads: the verifier checks each against
/// the BTF (the offsets are read-only globals, constants to it) and the JIT
/// turns a fault into a zero, as `bpf_probe_read_kernel` would, without
/// the helper call.
#[derive(Clone, Copy)]
pub struct TypedSock(pub u64);

impl Sock for TypedSock {
    #[inline(always)]
    fn addr(self) -> u64 {
        self.0
    }

    #[inline(always)]
    unsafe fn sock_field<T: Copy>(self, offset: u32) -> Result<T, i64> {
        // Volatile: one load of exactly this field. The compiler must not
        // merge neighbouring fields into one wider load, which the
        // verifier would refuse as crossing a member's end.
        Ok(unsafe { core::ptr::read_volatile((self.0 + offset as u64) as *const T) })
    }
}

/// Any other socket pointer: a kprobe's argument, one found through the
/// fd table, one kept in a map. Read with `bpf_probe_read_kernel`.
#[derive(Clone, Copy)]
pub struct ProbedSock(pub u64);

impl Sock for ProbedSock {
    #[inline(always)]
    fn addr(self) -> u64 {
        self.0
    }

    #[inline(always)]
    unsafe fn sock_field<T: Copy>(self, offset: u32) -> Result<T, i64> {
        unsafe { read_at(self.0, offset) }
    }
}

/// The process running now: thread group, cgroup, and the group leader's
/// comm (a thread's own comm is often a worker name like "tokio-runtime-w").
#[inline(always)]
pub fn current_actor() -> Actor {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let mut comm = [0u8; TASK_COMM_LEN];
    let task = unsafe { bpf_get_current_task() };
    let leader: u64 = unsafe { read_at(task, offset!(task_group_leader)) }.unwrap_or(0);
    let read = leader != 0
        && unsafe { bpf_probe_read_kernel_buf((leader + offset!(task_comm) as u64) as *const u8, &mut comm) }.is_ok();
    if !read {
        comm = bpf_get_current_comm().unwrap_or_default();
    }
    Actor { tgid, owner_flags: 0, cgroup_id, comm }
}

/// Who a socket's events are charged to: its owner, recorded in process
/// context (a listener's at listen(), a socket's closer at its first FIN:
/// time_wait.rs); else (a listener older than observer, an owner the LRU
/// map forgot) tgid 0 in the socket's own cgroup, so it still names its
/// pod.
#[inline(always)]
pub fn sock_owner(sk: impl Sock) -> Actor {
    match unsafe { SOCK_OWNERS.get(&sk.addr()) } {
        Some(owner) => Actor { owner_flags: 0, ..*owner },
        None => unknown_owner(sk),
    }
}

/// The owner of a socket no process context was seen for: tgid 0 in the
/// socket's own cgroup, so it still names its pod.
#[inline(always)]
pub fn unknown_owner(sk: impl Sock) -> Actor {
    Actor { cgroup_id: sock_cgroup_id(sk), ..Actor::default() }
}

/// The `struct sock *` behind file descriptor `fd` of the current task, or 0.
/// task->files->fdt->fd[fd]->private_data (a struct socket *)->sk.
#[inline(always)]
pub fn sock_of_fd(fd: u64) -> ProbedSock {
    let task = unsafe { bpf_get_current_task() };
    unsafe {
        let none = ProbedSock(0);
        let Ok(files) = read_at::<u64>(task, offset!(task_files)) else { return none };
        let Ok(fdt) = read_at::<u64>(files, offset!(files_fdt)) else { return none };
        let Ok(max_fds) = read_at::<u32>(fdt, offset!(fdtable_max_fds)) else { return none };
        if fd >= max_fds as u64 {
            return none;
        }
        let Ok(fd_array) = read_at::<u64>(fdt, offset!(fdtable_fd)) else { return none };
        let Ok(file) = bpf_probe_read_kernel((fd_array + fd * 8) as *const u64) else { return none };
        if file == 0 {
            return none;
        }
        let Ok(socket) = read_at::<u64>(file, offset!(file_private_data)) else { return none };
        sock_of_socket(socket)
    }
}

/// The `struct sock *` of a `struct socket *` (socket->sk), or 0.
#[inline(always)]
pub fn sock_of_socket(socket: u64) -> ProbedSock {
    if socket == 0 {
        return ProbedSock(0);
    }
    ProbedSock(unsafe { read_at::<u64>(socket, offset!(socket_sk)) }.unwrap_or(0))
}

#[inline(always)]
pub fn sock_protocol(sk: impl Sock) -> u16 {
    unsafe { sk.sock_field::<u16>(offset!(sock_protocol)) }.unwrap_or(0)
}

/// True for an IPv4/IPv6 TCP socket, the only kind observer counts.
#[inline(always)]
pub fn is_tcp(sk: impl Sock) -> bool {
    sk.addr() != 0 && sock_protocol(sk) == IPPROTO_TCP && matches!(sock_family(sk), AF_INET | AF_INET6)
}

#[inline(always)]
pub fn sock_family(sk: impl Sock) -> u16 {
    unsafe { sk.sock_field::<u16>(offset!(skc_family)) }.unwrap_or(0)
}

/// The local port a socket was bound to, host byte order, even after
/// CLOSE gave it back (`inet_sport`; `sock_local_port` is 0 by then).
#[inline(always)]
pub fn sock_source_port(sk: impl Sock) -> u16 {
    // inet_sock's: past struct sock.
    u16::from_be(unsafe { read_at::<u16>(sk.addr(), offset!(inet_sport)) }.unwrap_or(0))
}

/// Local port, host byte order.
#[inline(always)]
pub fn sock_local_port(sk: impl Sock) -> u16 {
    unsafe { sk.sock_field::<u16>(offset!(skc_num)) }.unwrap_or(0)
}

/// Remote address (IPv4 in the first 4 bytes) and port (host order).
/// Set by tcp_v4_connect/tcp_v6_connect before the socket enters SYN_SENT.
#[inline(always)]
pub fn sock_destination(sk: impl Sock, family: u16) -> ([u8; 16], u16) {
    let mut daddr = [0u8; 16];
    read_destination_into(sk, family, &mut daddr);
    (daddr, sock_remote_port(sk))
}

/// The remote address (IPv4 in the first 4 bytes), read straight into
/// `daddr` (e.g. a ring buffer record: no copy on the stack).
#[inline(always)]
pub fn read_destination_into(sk: impl Sock, family: u16, daddr: &mut [u8; 16]) {
    *daddr = [0; 16];
    if family == AF_INET6 {
        // 16 bytes straight into the caller's buffer (maybe a ring record)
        // by helper, whatever the pointer's kind: IPv6 is the rare case.
        // SAFETY: a kernel read into memory of ours; left zero if it fails.
        let _ = unsafe {
            bpf_probe_read_kernel_buf((sk.addr() + offset!(skc_v6_daddr) as u64) as *const u8, &mut daddr[..])
        };
    } else if let Ok(v4) = unsafe { sk.sock_field::<u32>(offset!(skc_daddr)) } {
        // Network order in memory, kept as is.
        daddr[..4].copy_from_slice(&v4.to_ne_bytes());
    }
}

/// TCP state (TCP_ESTABLISHED, ...), as `observer_common::tcp_state`.
#[inline(always)]
pub fn sock_tcp_state(sk: impl Sock) -> i32 {
    unsafe { sk.sock_field::<u8>(offset!(skc_state)) }.map_or(0, i32::from)
}

/// Remote port, host byte order.
#[inline(always)]
pub fn sock_remote_port(sk: impl Sock) -> u16 {
    u16::from_be(unsafe { sk.sock_field::<u16>(offset!(skc_dport)) }.unwrap_or(0))
}

/// True once a connect() on this TCP socket got past choosing a local port
/// (the kernel then sets the first sequence number, `write_seq`; a
/// disconnect after a failure keeps it non-zero).
#[inline(always)]
pub fn tcp_attempted_connect(sk: impl Sock) -> bool {
    unsafe { read_at::<u32>(sk.addr(), offset!(tcp_write_seq)) }.unwrap_or(0) != 0
}

/// Segments this TCP socket sent again. At the end of a handshake these
/// are its SYNs; a listener's child starts with its request's SYN-ACKs.
#[inline(always)]
pub fn tcp_total_retrans(sk: impl Sock) -> u64 {
    unsafe { read_at::<u32>(sk.addr(), offset!(tcp_total_retrans)) }.map_or(0, u64::from)
}

#[inline(always)]
pub fn sock_err(sk: impl Sock) -> i32 {
    unsafe { sk.sock_field::<i32>(offset!(sock_err)) }.unwrap_or(0)
}

/// Inode number of the socket's network namespace (as /proc/PID/ns/net).
#[inline(always)]
pub fn sock_netns(sk: impl Sock) -> u32 {
    unsafe {
        match sk.sock_field::<u64>(offset!(skc_net)) {
            Ok(net) if net != 0 => read_at::<u32>(net, offset!(net_ns_inum)).unwrap_or(0),
            _ => 0,
        }
    }
}

/// The cgroup id of the socket: the cgroup v2 of the task that created it
/// (sk->sk_cgrp_data.cgroup->kn->id, the id bpf_get_current_cgroup_id gives
/// in process context), or 0 where this kernel lacks the field.
#[inline(always)]
pub fn sock_cgroup_id(sk: impl Sock) -> u64 {
    if offset!(sock_cgroup) == 0 {
        return 0;
    }
    unsafe {
        let Ok(cgroup) = sk.sock_field::<u64>(offset!(sock_cgroup)) else { return 0 };
        if cgroup == 0 {
            return 0;
        }
        let Ok(kn) = read_at::<u64>(cgroup, offset!(cgroup_kn)) else { return 0 };
        if kn == 0 {
            return 0;
        }
        read_at::<u64>(kn, offset!(kernfs_node_id)).unwrap_or(0)
    }
}
