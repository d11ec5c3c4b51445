//! Resolve `KernelOffsets` from the running kernel's BTF.
//!
//! This is our stand-in for CO-RE (which aya cannot emit from Rust): each
//! field the eBPF programs read is looked up by name, through anonymous
//! unions and nested structs, so one object runs on every kernel with BTF.
use std::{cell::RefCell, collections::HashMap, io::Write as _, os::fd::AsRawFd as _, path::Path};

use btf_rs::{Backend, Btf, Type};
use observer_common::KernelOffsets;

use crate::error::Error;

/// Where the kernel publishes its BTF (CONFIG_DEBUG_INFO_BTF=y).
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The kernel's BTF at `path`, mapped rather than parsed whole: observer
/// looks up ~20 structs and 2 functions among a vmlinux's ~130k types, and
/// btf-rs's parse of all of them (its `Cache` backend) took ~36 MiB, the
/// daemon's peak, and most of its own start-up time (seconds in the
/// matrix's emulated VMs). Linux 6.16+ lets /sys/kernel/btf/vmlinux itself
/// be mapped; older kernels refuse, and its bytes are copied into a memfd
/// mapped the same way (the size of the file, ~6 MB, while it is read).
pub fn load_btf(path: &Path) -> Result<Btf, Error> {
    if !path.exists() {
        return Err(Error::NoBtf { path: path.to_owned() });
    }
    if let Ok(btf) = Btf::from_file_with_backend(path, Backend::Mmap) {
        return Ok(btf);
    }
    let failed = |source: crate::error::Cause| Error::Btf { path: path.to_owned(), source };
    let bytes = std::fs::read(path).map_err(|e| failed(e.into()))?;
    mapped_copy(&bytes).map_err(failed)
}

/// `bytes` (a BTF blob) in a memfd, mapped by btf-rs through its path.
fn mapped_copy(bytes: &[u8]) -> Result<Btf, crate::error::Cause> {
    let memfd = rustix::fs::memfd_create("observer-btf", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(memfd);
    file.write_all(bytes)?;
    // The mapping keeps the memfd's pages once this file is closed.
    Ok(Btf::from_file_with_backend(format!("/proc/self/fd/{}", file.as_raw_fd()), Backend::Mmap)?)
}

pub fn resolve(btf: &Btf) -> Result<KernelOffsets, Error> {
    let r = Resolver::new(btf);
    let offsets = KernelOffsets {
        task_group_leader: r.offset("task_struct", "group_leader")?,
        task_comm: r.offset("task_struct", "comm")?,
        task_files: r.offset("task_struct", "files")?,
        files_fdt: r.offset("files_struct", "fdt")?,
        fdtable_max_fds: r.offset("fdtable", "max_fds")?,
        fdtable_fd: r.offset("fdtable", "fd")?,
        file_private_data: r.offset("file", "private_data")?,
        socket_sk: r.offset("socket", "sk")?,
        sock_protocol: r.offset("sock", "sk_protocol")?,
        sock_err: r.offset("sock", "sk_err")?,
        skc_family: r.offset("sock", "__sk_common.skc_family")?,
        skc_state: r.offset("sock", "__sk_common.skc_state")?,
        skc_num: r.offset("sock", "__sk_common.skc_num")?,
        skc_dport: r.offset("sock", "__sk_common.skc_dport")?,
        skc_daddr: r.offset("sock", "__sk_common.skc_daddr")?,
        skc_v6_daddr: r.offset("sock", "__sk_common.skc_v6_daddr")?,
        tcp_write_seq: r.offset("tcp_sock", "write_seq")?,
        tcp_total_retrans: r.offset("tcp_sock", "total_retrans")?,
        skc_net: r.offset("sock", "__sk_common.skc_net")?,
        net_ns_inum: r.offset("net", "ns.inum")?,
        // Optional: the socket's cgroup attributes TIME_WAIT entries of
        // sockets whose owner is unknown to a pod; without it (kernels
        // without CONFIG_SOCK_CGROUP_DATA, or before 5.15's layout) they
        // simply get no pod labels.
        sock_cgroup: r.offset("sock", "sk_cgrp_data.cgroup").unwrap_or(0),
        cgroup_kn: r.offset("cgroup", "kn").unwrap_or(0),
        kernfs_node_id: r.offset("kernfs_node", "id").unwrap_or(0),
        // Optional, for the overflow programs (observer-ebpf's overflow.rs):
        // without them the overflow hook runs here in the sweep's mode
        // (`hooks::overflow_fields`).
        sock_ack_backlog: r.offset("sock", "sk_ack_backlog").unwrap_or(0),
        sock_max_ack_backlog: r.offset("sock", "sk_max_ack_backlog").unwrap_or(0),
        sock_drops: r.offset("sock", "sk_drops").unwrap_or(0),
        skc_cookie: r.offset("sock", "__sk_common.skc_cookie").unwrap_or(0),
        icsk_syn_queue_len: r.offset("inet_connection_sock", "icsk_accept_queue.qlen").unwrap_or(0),
        skb_protocol: r.offset("sk_buff", "protocol").unwrap_or(0),
        skb_tcp_tw_isn: r
            .offset("sk_buff", "cb")
            .and_then(|cb| Ok(cb + r.offset("tcp_skb_cb", "tcp_tw_isn")?))
            .unwrap_or(0),
        net_tcp_syncookies: r.offset("net", "ipv4.sysctl_tcp_syncookies").unwrap_or(0),
        inet_sport: r.offset("inet_sock", "inet_sport")?,
        // Optional, for the start-up iterator's owners (older.rs): without
        // them connections older than observer count under pid 0.
        sock_socket: r.offset("sock", "sk_socket").unwrap_or(0),
        socket_inode_ino: r
            .offset("socket_alloc", "vfs_inode.i_ino")
            .and_then(|ino| Ok(ino - r.offset("socket_alloc", "socket")?))
            .unwrap_or(0),
    };
    if offsets.sock_cgroup == 0 || offsets.cgroup_kn == 0 {
        tracing::info!(
            "this kernel's BTF has no sock.sk_cgrp_data.cgroup or cgroup.kn: sockets of unknown owner get no pod labels"
        );
        return Ok(KernelOffsets { sock_cgroup: 0, ..offsets });
    }
    Ok(offsets)
}

/// What the loader needs to know of this kernel besides the offsets the
/// programs read: which ways of attaching a hook can work here.
#[derive(Clone, Debug)]
pub struct KernelFacts {
    pub offsets: KernelOffsets,
    /// Major and minor version, for what BTF does not show (trampolines
    /// for functions of more than 6 parameters: Linux 6.6).
    pub version: (u32, u32),
    /// The parameters of `inet_csk_accept` (4 before Linux 6.10, 2 since;
    /// 0: not in BTF): the fexit program that reads the return value after
    /// that many arguments is the one loaded (observer-ebpf's accept.rs).
    pub inet_csk_accept_params: u32,
    /// The parameters of `tcp_v4_syn_recv_sock` (6; 7 where a stable
    /// backport added one, as Debian's 6.1 and 6.12 have; 0: not in BTF).
    pub syn_recv_sock_params: u32,
    /// Whether the SYN queue is full at its backlog (`>=`) rather than above
    /// it, as this kernel answered (`syn_queue_test`).
    pub syn_queue_full_at_backlog: bool,
}

impl KernelFacts {
    pub fn read(btf: &Btf, version: (u32, u32)) -> Result<Self, Error> {
        let r = Resolver::new(btf);
        Ok(Self {
            offsets: resolve(btf)?,
            version,
            inet_csk_accept_params: r.parameters("inet_csk_accept").unwrap_or(0),
            syn_recv_sock_params: r.parameters("tcp_v4_syn_recv_sock").unwrap_or(0),
            syn_queue_full_at_backlog: super::syn_queue_test::full_at_backlog().unwrap_or_else(|why| {
                tracing::warn!(
                    "could not ask this kernel when a SYN queue is full ({why}; it needs CAP_SYS_ADMIN to make a \
                     network namespace): taking the test of Linux 6.13 and the 2025 stable kernels (above the \
                     backlog); on an older kernel, a SYN dropped at a full SYN queue is then missed by \
                     observer_tcp_syn_queue_full_total where that is counted at tcp_conn_request, and counted as \
                     a listen overflow"
                );
                false
            }),
        })
    }
}

/// Whether this kernel counts a TIME_WAIT socket in TcpExtTW/TWKilled when
/// it enters TIME_WAIT, as observer's check of its own count needs
/// (`collect::unseen`). Kernels that count it when it ends (5.10) keep the
/// kind of end in `inet_timewait_sock.tw_kill` until then; those that count
/// on entry decide it on the spot and have no such member.
pub fn time_wait_counted_at_entry(btf: &Btf) -> bool {
    let r = Resolver::new(btf);
    r.struct_named("inet_timewait_sock").is_some_and(|s| r.find_member(&s, "tw_kill").is_none())
}

struct Resolver<'a> {
    btf: &'a Btf,
    /// Structs by name, as found: each lookup scans every type's name in
    /// the mapped BTF, and `sock` alone is asked for ~20 times.
    structs: RefCell<HashMap<String, Option<btf_rs::Struct>>>,
}

impl<'a> Resolver<'a> {
    fn new(btf: &'a Btf) -> Self {
        Self { btf, structs: RefCell::default() }
    }

    /// Byte offset of `path` (members separated by '.') inside `struct_name`.
    fn offset(&self, struct_name: &str, path: &str) -> Result<u32, Error> {
        let missing = |what: &str| Error::BtfLayout(format!("struct {struct_name}: {what} (field path {path})"));
        let mut current = self.struct_named(struct_name).ok_or_else(|| missing("struct not found in BTF"))?;
        let mut bits = 0u32;
        let fields: Vec<&str> = path.split('.').collect();
        for (i, field) in fields.iter().enumerate() {
            let (member_bits, member_type) =
                self.find_member(&current, field).ok_or_else(|| missing(&format!("no member `{field}`")))?;
            bits += member_bits;
            if i + 1 < fields.len() {
                current = self.as_struct(member_type).ok_or_else(|| missing(&format!("`{field}` is not a struct")))?;
            }
        }
        if !bits.is_multiple_of(8) {
            return Err(missing("field is a bitfield; this kernel is too old (Linux 5.6+ needed)"));
        }
        Ok(bits / 8)
    }

    /// How many parameters kernel function `name` takes.
    fn parameters(&self, name: &str) -> Option<u32> {
        self.btf.resolve_types_by_name(name).ok()?.into_iter().find_map(|t| match t {
            Type::Func(func) => match self.btf.resolve_chained_type(&func).ok()? {
                Type::FuncProto(proto) => Some(proto.parameters.len() as u32),
                _ => None,
            },
            _ => None,
        })
    }

    fn struct_named(&self, name: &str) -> Option<btf_rs::Struct> {
        if let Some(found) = self.structs.borrow().get(name) {
            return found.clone();
        }
        let found = self.btf.resolve_types_by_name(name).ok().and_then(|types| {
            types.into_iter().find_map(|t| match t {
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
        });
        self.structs.borrow_mut().insert(name.to_string(), found.clone());
        found
    }

    /// Find `name` among `s`'s members, descending into anonymous members.
    /// Returns the bit offset from the start of `s` and the member's type.
    fn find_member(&self, s: &btf_rs::Struct, name: &str) -> Option<(u32, Type)> {
        for m in &s.members {
            let member_name = self.btf.resolve_name(m).unwrap_or_default();
            let ty = self.btf.resolve_chained_type(m).ok()?;
            if member_name == name {
                if m.bitfield_size().unwrap_or(0) != 0 {
                    return Some((m.bit_offset() + 1, ty)); // marks "not byte aligned"
                }
                return Some((m.bit_offset(), ty));
            }
            if member_name.is_empty()
                && let Some(inner) = self.as_struct(ty)
                && let Some((off, t)) = self.find_member(&inner, name)
            {
                return Some((m.bit_offset() + off, t));
            }
        }
        None
    }

    /// Follow typedefs and qualifiers to a struct or union.
    fn as_struct(&self, mut ty: Type) -> Option<btf_rs::Struct> {
        for _ in 0..16 {
            match ty {
                Type::Struct(s) | Type::Union(s) => return Some(s),
                Type::Typedef(_) | Type::Const(_) | Type::Volatile(_) | Type::Restrict(_) | Type::TypeTag(_) => {
                    let next = ty.as_btf_type()?;
                    ty = self.btf.resolve_chained_type(next).ok()?;
                }
                _ => return None,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's BTF resolves every field, and the offsets agree
    /// with what is fixed by the kernel ABI or by layout rules.
    #[test]
    fn resolves_all_fields_on_this_kernel() {
        let btf = load_btf(Path::new(VMLINUX_BTF)).expect("this machine has BTF");
        let off = resolve(&btf).expect("all fields resolve");
        // sock_common is the first member of sock: its fields sit in the
        // first cache lines, family right after the addresses/hash/ports.
        assert!(off.skc_family < 64, "{off:?}");
        assert!(off.skc_v6_daddr > off.skc_family, "{off:?}");
        assert!(off.sock_protocol > off.skc_v6_daddr, "{off:?}");
        assert_ne!(off.task_comm, off.task_group_leader);
        // tcp_sock begins with inet_connection_sock, which begins with sock.
        assert!(off.tcp_total_retrans > off.sock_protocol, "{off:?}");
        // skc_daddr is the very first field of sock_common (a union member).
        assert_eq!(off.skc_daddr, 0);
        // The socket's cgroup: deep inside sock, after sock_common.
        assert!(off.sock_cgroup > off.skc_v6_daddr, "{off:?}");
        assert!(off.cgroup_kn > 0, "{off:?}");
        // What the overflow programs read: all inside their structs.
        for (name, field) in [
            ("sk_ack_backlog", off.sock_ack_backlog),
            ("sk_max_ack_backlog", off.sock_max_ack_backlog),
            ("sk_drops", off.sock_drops),
            ("icsk_accept_queue.qlen", off.icsk_syn_queue_len),
            ("net.ipv4.sysctl_tcp_syncookies", off.net_tcp_syncookies),
        ] {
            assert!(field > off.skc_v6_daddr, "{name}: {off:?}");
        }
        assert!(off.skc_cookie > off.skc_family && off.skc_cookie < off.sock_drops, "{off:?}");
        // The start-up iterator's inode read: sock -> socket -> its inode.
        assert!(off.sock_socket > off.skc_v6_daddr && off.socket_inode_ino > 0, "{off:?}");
        // Neither is the first field of sk_buff (a list head is).
        assert!(off.skb_tcp_tw_isn > 0 && off.skb_protocol > 0, "{off:?}");
    }

    /// The mapped BTF (the kernel's file, or a memfd copy where the kernel
    /// refuses to map it) reads as the whole parse does.
    #[test]
    fn mapped_btf_reads_as_the_whole_parse() {
        let bytes = std::fs::read(VMLINUX_BTF).expect("this machine has BTF");
        let parsed = Btf::from_bytes(&bytes).unwrap();
        let copied = mapped_copy(&bytes).unwrap();
        let loaded = load_btf(Path::new(VMLINUX_BTF)).unwrap();
        let facts = |btf: &Btf| {
            let r = Resolver::new(btf);
            (resolve(btf).unwrap(), r.parameters("inet_csk_accept"), r.parameters("tcp_v4_syn_recv_sock"))
        };
        let whole = facts(&parsed);
        assert!(whole.1.is_some() && whole.2.is_some(), "{whole:?}");
        assert_eq!(facts(&copied), whole);
        assert_eq!(facts(&loaded), whole);
        assert_eq!(time_wait_counted_at_entry(&copied), time_wait_counted_at_entry(&parsed));
    }

    #[test]
    fn missing_struct_is_a_clear_error() {
        let btf = load_btf(Path::new(VMLINUX_BTF)).expect("this machine has BTF");
        let err = Resolver::new(&btf).offset("no_such_struct_xyz", "a").unwrap_err();
        assert!(err.to_string().contains("no_such_struct_xyz"), "{err}");
    }
}
