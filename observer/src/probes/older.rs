//! The sockets older than observer. The programs count a connection open
//! when it reaches ESTABLISHED; those already there at start would never
//! count: a restart (a DaemonSet rollout) would drop a database client's
//! 800 held connections from the gauge for as long as they live. So at
//! start, once the programs are attached, the TCP socket iterator
//! (observer-ebpf's older.rs) lists every namespace's full sockets, and
//! each established one the programs do not follow yet is entered in
//! `OPEN_CONNECTIONS` under the key a program would have given it
//! (`OpenConnection::OLDER`, no lifetime, its owner the process holding it
//! per /proc): its end then counts like any other, and the ledger starts
//! with them open. (Their TIME_WAIT entries need nothing of this: they are
//! charged to the process whose close sends the first FIN, seen then.)
//!
//! Exact at every step, against a socket that ends meanwhile:
//! - one the programs saw since they were attached has its entries
//!   already: the insert (no overwrite) fails and it is not counted here;
//! - one that ended between the iterator's read and the insert would leave
//!   an entry for ever: a second pass lists every socket still there, and
//!   an entry of ours whose socket is gone (for `OPEN_CONNECTIONS`: no
//!   longer established) is removed if it still holds what we wrote;
//!   removed by us, a connection was never counted ended, so it is not
//!   counted open either (removed by its end first, it was counted ended,
//!   and stays counted open).
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fs::File,
    io::Read as _,
    path::{Path, PathBuf},
    sync::Mutex,
    time::Duration,
};

use aya::{
    Btf, Ebpf,
    maps::{HashMap as AyaHashMap, MapData},
    programs::{Iter, iter::IterLink},
};
use observer_common::{
    Actor, ConnectionKey, IteratedSocket, ListenerKey, OpenConnection, direction,
    names::{maps, programs},
    tcp_state,
};
use tracing::{info, warn};

use crate::{
    collect::LeftOutAtStart,
    node::{netns, owners},
};

/// The connections entered, per key: the ledger's opening balance.
pub type Opening = Vec<(ConnectionKey, u64)>;

/// How long each pass over the namespaces may take before the start goes
/// on without the namespaces it has not read by then (a namespace that
/// blocks on open must not keep the daemon from serving).
const PASS_LIMIT: Duration = Duration::from_secs(5);

const BPF_NOEXIST: u64 = 1;

/// Enter every namespace's established connections that no program follows
/// into `OPEN_CONNECTIONS`, and count them per key; and how many it had no
/// room for, logged here and exported with the maps' lost updates. Never
/// fails the start: where the iterator cannot run (no BTF, before Linux
/// 5.9), the log says what is left out.
pub fn enter(
    ebpf: &mut Ebpf,
    btf: &Btf,
    listeners: &AyaHashMap<MapData, ListenerKey, Actor>,
    proc_root: &Path,
) -> (Opening, LeftOutAtStart) {
    match try_enter(ebpf, btf, listeners, proc_root) {
        Ok(entered) => entered,
        Err(reason) => {
            warn!(
                "the connections established before observer started are left out: they are not counted open \
                 (observer_tcp_connection_usage leaves them out until they end): {reason}"
            );
            let unread = netns::all(proc_root).into_keys().collect();
            (Vec::new(), LeftOutAtStart { unread, ..LeftOutAtStart::default() })
        }
    }
}

fn try_enter(
    ebpf: &mut Ebpf,
    btf: &Btf,
    listeners: &AyaHashMap<MapData, ListenerKey, Actor>,
    proc_root: &Path,
) -> Result<(Opening, LeftOutAtStart), String> {
    let started = std::time::Instant::now();
    let namespaces = netns::all(proc_root);
    let program: &mut Iter = ebpf
        .program_mut(programs::OLDER_CONNECTIONS)
        .ok_or("the TCP socket iterator is not in the object")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    program.load("tcp", btf).map_err(|e| format!("loading the TCP socket iterator (bpf_iter_tcp, Linux 5.9+): {e}"))?;

    let first = iterate(program, &namespaces)?;
    let mut unread = first.unread(&namespaces);
    if !unread.is_empty() {
        warn!(
            unread = unread.len(),
            namespaces = namespaces.len(),
            "the start-up pass read the connections older than observer in {} of {} network namespaces ({}): in \
             the others they are not counted open until they end, and their ledgers are not checked \
             (observer_kernel_unseen_events_total)",
            namespaces.len() - unread.len(),
            namespaces.len(),
            if first.timed_out {
                format!("the rest not within {PASS_LIMIT:?}")
            } else {
                "the rest could not be entered or read".to_string()
            }
        );
    }
    let first = first.sockets;
    let held: HashMap<u32, u32> = first
        .iter()
        .flat_map(|(netns, sockets)| sockets.iter().filter_map(|s| Some((u32::try_from(s.inode).ok()?, *netns))))
        .filter(|(inode, _)| *inode != 0)
        .collect();
    let owners = owners::owners_of_sockets(proc_root, &held);
    let listener_owner = |key: &ListenerKey| listeners.get(key, 0).ok();
    let wanted = entries(&first, &owners, listener_owner);

    let mut open: AyaHashMap<_, u64, OpenConnection> = ebpf
        .map_mut(maps::OPEN_CONNECTIONS)
        .ok_or("no OPEN_CONNECTIONS map")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    let mut entered = Vec::new();
    let mut full = 0u64;
    for (sk, entry) in wanted {
        match open.insert(sk, entry, BPF_NOEXIST) {
            Ok(()) => entered.push((sk, entry)),
            // EEXIST: a program follows it since (established after the
            // iterator read it: impossible; its address taken by a new
            // socket: that one is the program's). Else the map is full.
            Err(e) if is_errno(&e, nix::libc::EEXIST) => {}
            Err(_) => full += 1,
        }
    }

    // The second pass, over the namespaces the first read: the sockets
    // still there, and which are established.
    let program: &mut Iter =
        ebpf.program_mut(programs::OLDER_CONNECTIONS).ok_or("no iterator")?.try_into().map_err(|e| format!("{e}"))?;
    let found = namespaces.len();
    let read_first: BTreeMap<u32, PathBuf> =
        namespaces.into_iter().filter(|(inode, _)| first.contains_key(inode)).collect();
    // In a namespace not read again in time, none is known to be still
    // there, so every entry that can still be taken back is (exact, if
    // fewer counted or named), and the namespace joins the unread.
    let second = iterate(program, &read_first)?;
    let unread_second = second.unread(&read_first);
    if !unread_second.is_empty() {
        warn!(
            unread = unread_second.len(),
            "the second pass over the network namespaces did not read {} of them within {PASS_LIMIT:?}: taking \
             their entries back",
            unread_second.len()
        );
    }
    unread.extend(unread_second);
    let second = second.sockets;
    let alive: HashMap<u64, u16> = second.values().flatten().map(|s| (s.sk, s.state)).collect();
    let established = |sk: &u64| alive.get(sk).is_some_and(|&state| i32::from(state) == tcp_state::ESTABLISHED);
    let mut open: AyaHashMap<_, u64, OpenConnection> = ebpf
        .map_mut(maps::OPEN_CONNECTIONS)
        .ok_or("no OPEN_CONNECTIONS map")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    let mut counted: BTreeMap<ConnectionKey, u64> = BTreeMap::new();
    for (sk, entry) in entered {
        // The iterator lists the sockets of our entries that are still
        // established; ours is missing once its end took the entry, or if
        // it ended unseen before we entered it.
        let gone = !established(&sk) && open.get(&sk, 0).is_ok_and(|now| now == entry) && open.remove(&sk).is_ok();
        if !gone {
            *counted.entry(entry.key).or_default() += 1;
        }
    }
    let total: u64 = counted.values().sum();
    info!(
        connections = total,
        namespaces = found - unread.len(),
        took_ms = started.elapsed().as_millis() as u64,
        "counted open the connections established before observer started (their ends count as they come; \
         their lifetimes are unknown)"
    );
    if full > 0 {
        warn!(
            left_out = full,
            "OPEN_CONNECTIONS is full: {full} connections established before observer started are not counted open; \
             raise --max-sockets"
        );
    }
    let left_out = LeftOutAtStart { open_connections: full, unread };
    Ok((counted.into_iter().collect(), left_out))
}

/// Run the iterator once in each namespace: its listeners and the
/// established sockets no program follows, by namespace inode, for the
/// namespaces read within `PASS_LIMIT` (a namespace missing was not read:
/// in time, or at all); and whether the pass ran out of time.
fn iterate(program: &mut Iter, namespaces: &BTreeMap<u32, PathBuf>) -> Result<Pass, String> {
    // A link per namespace, made here (the program stays on this thread);
    // each is turned into its reader inside its namespace, which fixes the
    // namespace the iterator walks (the reader's, at creation).
    let mut links = HashMap::new();
    for &inode in namespaces.keys() {
        let id = program.attach().map_err(|e| format!("attaching the TCP socket iterator: {e}"))?;
        links.insert(inode, program.take_link(id).map_err(|e| format!("{e}"))?);
    }
    let links: Mutex<HashMap<u32, IterLink>> = Mutex::new(links);
    let (read, finished) = netns::in_each_namespace_within(namespaces.clone(), PASS_LIMIT, move |inode| {
        // A namespace that blocks the pass (tests/connections.rs).
        #[cfg(feature = "failpoints")]
        if fail::eval("older-pass-blocks", |arg| arg.and_then(|a| a.parse::<u32>().ok())) == Some(Some(inode)) {
            std::thread::sleep(PASS_LIMIT + Duration::from_secs(1));
        }
        let link = links.lock().ok()?.remove(&inode)?;
        let mut file: File = link.into_file().ok()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        Some((inode, parse(&bytes)))
    });
    Ok(Pass { sockets: read.into_iter().collect(), timed_out: !finished })
}

/// One pass of the iterator over the namespaces.
struct Pass {
    sockets: HashMap<u32, Vec<IteratedSocket>>,
    timed_out: bool,
}

impl Pass {
    /// The namespaces of `namespaces` it did not read.
    fn unread(&self, namespaces: &BTreeMap<u32, PathBuf>) -> BTreeSet<u32> {
        namespaces.keys().filter(|inode| !self.sockets.contains_key(inode)).copied().collect()
    }
}

/// The iterator's records, one `IteratedSocket` after another.
fn parse(bytes: &[u8]) -> Vec<IteratedSocket> {
    bytes
        .chunks_exact(size_of::<IteratedSocket>())
        // SAFETY: IteratedSocket is repr(C) of integers, any bytes valid.
        .map(|chunk| unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<IteratedSocket>()) })
        .collect()
}

/// The entry each established socket gets: the key a program would have
/// given it. Inbound (its local port a listener's in its namespace): the
/// listener's owner as the programs recorded it (else the socket's cgroup,
/// pid 0, as the programs do for a listener older than observer; userspace
/// charges it to the listener's owner like theirs). Outbound: the process
/// holding it (/proc), else the socket's cgroup.
fn entries(
    by_netns: &HashMap<u32, Vec<IteratedSocket>>,
    owners: &HashMap<u32, Actor>,
    listener_owner: impl Fn(&ListenerKey) -> Option<Actor>,
) -> Vec<(u64, OpenConnection)> {
    let mut out = Vec::new();
    for (&netns, sockets) in by_netns {
        let listening: HashSet<u16> =
            sockets.iter().filter(|s| i32::from(s.state) == tcp_state::LISTEN).map(|s| s.local_port).collect();
        for s in sockets.iter().filter(|s| i32::from(s.state) == tcp_state::ESTABLISHED && s.followed == 0) {
            let unknown = Actor { cgroup_id: s.cgroup_id, ..Actor::default() };
            let key = if listening.contains(&s.local_port) {
                let listener = ListenerKey { netns, port: s.local_port, family: s.family };
                ConnectionKey {
                    actor: listener_owner(&listener).unwrap_or(unknown),
                    addr: [0; 16],
                    family: s.family,
                    port: s.local_port,
                    direction: direction::INBOUND,
                    netns,
                    _pad: 0,
                }
            } else {
                let owner = u32::try_from(s.inode).ok().and_then(|inode| owners.get(&inode));
                let actor = owner.map_or(unknown, |o| Actor { cgroup_id: s.cgroup_id, ..*o });
                ConnectionKey {
                    actor,
                    addr: s.remote_addr,
                    family: s.family,
                    port: s.remote_port,
                    direction: direction::OUTBOUND,
                    netns,
                    _pad: 0,
                }
            };
            out.push((s.sk, OpenConnection { key, since: 0, handshaking: OpenConnection::OLDER, _pad: 0 }));
        }
    }
    out
}

fn is_errno(e: &aya::maps::MapError, errno: i32) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(errno))
}

#[cfg(test)]
mod tests {
    use observer_common::AF_INET;

    use super::*;

    fn socket(sk: u64, state: i32, local_port: u16, remote_port: u16, inode: u64) -> IteratedSocket {
        IteratedSocket {
            sk,
            inode,
            cgroup_id: 77,
            remote_addr: [10, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            family: AF_INET,
            local_port,
            remote_port,
            state: state as u16,
            ..IteratedSocket::default()
        }
    }

    #[test]
    fn a_socket_on_a_listening_port_is_inbound_and_the_others_outbound_to_their_far_end() {
        let sockets = vec![
            socket(1, tcp_state::LISTEN, 8080, 0, 10),
            socket(2, tcp_state::ESTABLISHED, 8080, 40000, 11),
            socket(3, tcp_state::ESTABLISHED, 40001, 27017, 12),
            socket(4, tcp_state::ESTABLISHED, 40002, 27017, 99),
        ];
        let by_netns = HashMap::from([(5, sockets)]);
        let mut client = Actor { tgid: 42, ..Actor::default() };
        client.comm[..6].copy_from_slice(b"client");
        let owners = HashMap::from([(12, client)]);
        let server = Actor { tgid: 7, cgroup_id: 3, ..Actor::default() };
        let mut got = entries(&by_netns, &owners, |k| (k.port == 8080 && k.netns == 5).then_some(server));
        got.sort_by_key(|(sk, _)| *sk);
        let keys: Vec<_> = got.iter().map(|(sk, e)| (*sk, e.key, e.handshaking)).collect();
        assert_eq!(keys.len(), 3, "the listener itself is no connection");
        let (_, inbound, older) = keys[0];
        assert_eq!(
            (inbound.direction, inbound.port, inbound.actor, inbound.addr),
            (direction::INBOUND, 8080, server, [0; 16])
        );
        assert_eq!(older, OpenConnection::OLDER);
        let (_, outbound, _) = keys[1];
        assert_eq!(
            (outbound.direction, outbound.port, outbound.addr[..4].to_vec()),
            (direction::OUTBOUND, 27017, vec![10, 0, 0, 5])
        );
        assert_eq!((outbound.actor.tgid, outbound.actor.cgroup_id, outbound.actor.comm_str()), (42, 77, "client"));
        let (_, unowned, _) = keys[2];
        assert_eq!((unowned.actor.tgid, unowned.actor.cgroup_id), (0, 77), "no process holds it: its cgroup, pid 0");
    }

    #[test]
    fn a_connection_the_programs_follow_is_not_entered_again() {
        let followed = IteratedSocket { followed: 1, ..socket(2, tcp_state::ESTABLISHED, 40000, 27017, 11) };
        let by_netns = HashMap::from([(5, vec![followed, socket(3, tcp_state::ESTABLISHED, 40001, 27017, 12)])]);
        let got: Vec<u64> = entries(&by_netns, &HashMap::new(), |_| None).iter().map(|(sk, _)| *sk).collect();
        assert_eq!(got, vec![3]);
    }

    #[test]
    fn records_are_read_whole() {
        let s = socket(9, tcp_state::ESTABLISHED, 1, 2, 3);
        // SAFETY: reading a repr(C) value's bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&s as *const IteratedSocket).cast::<u8>(), size_of::<IteratedSocket>())
        };
        let mut two = bytes.to_vec();
        two.extend_from_slice(bytes);
        two.extend_from_slice(&bytes[..5]);
        assert_eq!(parse(&two), vec![s, s]);
    }
}
