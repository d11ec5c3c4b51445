//! Byte offsets of the kernel struct fields the eBPF programs read.
//!
//! aya cannot emit CO-RE relocations from Rust, and struct layouts differ
//! between kernels (6.1 and 6.18 differ in `task_struct`, `sock`, `net`).
//! So userspace resolves each offset from the running kernel's BTF
//! (/sys/kernel/btf/vmlinux) at start, and hands them to the programs as the
//! `OFFSETS` global before loading. The programs then read fields with
//! `bpf_probe_read_kernel(base + offset)`, which works in every program type.

/// Offsets in bytes from the start of the named struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.group_leader` (pointer)
    pub task_group_leader: u32,
    /// `task_struct.comm` (char[16])
    pub task_comm: u32,
    /// `task_struct.files` (pointer)
    pub task_files: u32,
    /// `files_struct.fdt` (pointer)
    pub files_fdt: u32,
    /// `fdtable.max_fds` (unsigned int)
    pub fdtable_max_fds: u32,
    /// `fdtable.fd` (struct file **)
    pub fdtable_fd: u32,
    /// `file.private_data` (for a socket file: struct socket *)
    pub file_private_data: u32,
    /// `socket.sk` (pointer)
    pub socket_sk: u32,
    /// `sock.sk_protocol` (u16 since Linux 5.6)
    pub sock_protocol: u32,
    /// `sock.sk_err` (int)
    pub sock_err: u32,
    /// `sock.__sk_common.skc_family` (unsigned short)
    pub skc_family: u32,
    /// `sock.__sk_common.skc_state` (unsigned char, TCP_ESTABLISHED...)
    pub skc_state: u32,
    /// `sock.__sk_common.skc_num` (local port, host order)
    pub skc_num: u32,
    /// `sock.__sk_common.skc_dport` (remote port, network order)
    pub skc_dport: u32,
    /// `sock.__sk_common.skc_daddr` (IPv4 remote address)
    pub skc_daddr: u32,
    /// `sock.__sk_common.skc_v6_daddr` (IPv6 remote address)
    pub skc_v6_daddr: u32,
    /// `tcp_sock.write_seq` (u32): 0 until a connect() got a local port
    pub tcp_write_seq: u32,
    /// `tcp_sock.total_retrans` (u32): segments sent again; at the end of
    /// a handshake, its SYNs (or, for a listener's child, SYN-ACKs)
    pub tcp_total_retrans: u32,
    /// `sock.__sk_common.skc_net` (possible_net_t, a struct net *)
    pub skc_net: u32,
    /// `net.ns.inum`: the namespace inode number, as in /proc/PID/ns/net
    pub net_ns_inum: u32,
    /// `sock.sk_cgrp_data.cgroup`: the cgroup v2 of the task that created
    /// the socket (struct cgroup *); 0 where the kernel lacks it, then
    /// sockets of unknown owner get no cgroup.
    pub sock_cgroup: u32,
    /// `cgroup.kn` (struct kernfs_node *)
    pub cgroup_kn: u32,
    /// `kernfs_node.id` (u64): the cgroup id, as bpf_get_current_cgroup_id
    /// returns it
    pub kernfs_node_id: u32,
    /// `sock.sk_ack_backlog` (u32): connections in the accept queue
    pub sock_ack_backlog: u32,
    /// `sock.sk_max_ack_backlog` (u32): the listen() backlog, capped
    pub sock_max_ack_backlog: u32,
    /// `sock.sk_drops` (atomic_t): a listener's drops (`tcp_listendrop`)
    pub sock_drops: u32,
    /// `sock.__sk_common.skc_cookie` (u64): the socket cookie sock_diag
    /// reports (set the first time anyone asks, 0 before)
    pub skc_cookie: u32,
    /// `inet_connection_sock.icsk_accept_queue.qlen` (atomic_t): requests
    /// waiting for the handshake's last ACK (the SYN queue)
    pub icsk_syn_queue_len: u32,
    /// `sk_buff.protocol` (__be16, ETH_P_IP / ETH_P_IPV6)
    pub skb_protocol: u32,
    /// `sk_buff.cb` plus `tcp_skb_cb.tcp_tw_isn` (u32): non-zero for a
    /// SYN that matched a TIME_WAIT socket
    pub skb_tcp_tw_isn: u32,
    /// `net.ipv4.sysctl_tcp_syncookies` (u8)
    pub net_tcp_syncookies: u32,
    /// `inet_sock.inet_sport` (__be16): the local port, still set after
    /// the socket gave its port back at CLOSE (`skc_num` is 0 by then)
    pub inet_sport: u32,
    /// `sock.sk_socket` (struct socket *; NULL for a child not accepted)
    pub sock_socket: u32,
    /// From a `struct socket *` to its inode's number: `socket_alloc`'s
    /// `vfs_inode.i_ino` less its `socket` (unsigned long; the number
    /// /proc/PID/fd shows as `socket:[N]`); 0 where BTF lacks them
    pub socket_inode_ino: u32,
}

const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 136);
