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
    /// The parameters of `inet_csk_accept` (4 before Linux 6.10, 2 since):
    /// userspace loads the fexit program that reads the return value after
    /// that many arguments (accept.rs). Not read by the programs.
    pub inet_csk_accept_params: u32,
}

const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 92);
