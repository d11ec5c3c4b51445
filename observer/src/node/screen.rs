//! A namespace's screen: the kernel's own per-namespace TCP counts, read
//! each round for a few microseconds, where a dump of its sockets walks
//! every socket of the node (`sock_diag::DiagSocket::each_tcp`).
//!
//! They answer two questions without a dump: *could* any destination be
//! near its port ceiling, or TIME_WAIT near its own (at most `in_use +
//! minisockets` sockets hold a port, whatever their destinations), and did
//! anything change since the last dump (every new socket bumps ActiveOpens
//! or PassiveOpens; every socket that goes changes `in_use` or
//! `minisockets`). netstat's count of TIME_WAIT entries, a larger file, is
//! read apart, for observer's check of its own (`collect::unseen`).
use std::{
    fs::File,
    io::{self, BufReader, Seek as _},
    os::unix::fs::FileExt as _,
};

use procfs::FromBufRead as _;

use super::netns::Dirs;

/// The files, opened in the namespace (a /proc/thread-self/net file
/// answers for the namespace of the thread that opened it).
pub struct ScreenFiles {
    sockstat: File,
    /// Absent when the kernel has no IPv6.
    sockstat6: Option<File>,
    /// Absent when changes are not followed (one reading: doctor).
    snmp: Option<File>,
    /// Likewise.
    netstat: Option<File>,
}

/// One reading of the counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Screen {
    /// TCP sockets in the kernel's hashes, both families (sockstat's and
    /// sockstat6's `inuse`): listeners, connections and closing sockets,
    /// everything but TIME_WAIT.
    pub in_use: u64,
    /// The kernel's TIME_WAIT minisockets (sockstat's `tw`): sockets in
    /// TIME_WAIT and orphaned ones in FIN_WAIT2 (a closed socket waiting
    /// for its peer's FIN becomes one), what tcp_max_tw_buckets bounds.
    pub minisockets: u64,
    /// Connections opened so far by connect() (snmp's ActiveOpens), the
    /// only way a socket comes to hold an ephemeral port toward a
    /// destination, and by accepting (PassiveOpens): they only ever grow.
    /// 0 when changes are not followed.
    pub active_opens: u64,
    pub passive_opens: u64,
}

/// A namespace's TCP segments so far (snmp's InSegs, OutSegs, RetransSegs
/// and OutRsts). The same traffic and the same screen at two readings mean
/// no socket of the namespace changed state between them: every change
/// sends or receives a segment (a connect, an accept, a FIN, a reset), but
/// a timer's close of a connection that gave up, which unhashes the socket
/// (`in_use` moves). Kept apart from `Screen`, which decides dumps: a
/// connection carrying data is no reason to dump its namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Traffic {
    segments: [u64; 4],
}

/// Traffic of `n` segments in all, for tests.
#[cfg(test)]
impl Traffic {
    pub fn segments(n: u64) -> Self {
        Traffic { segments: [n, 0, 0, 0] }
    }
}

/// A namespace's own counts of what observer's programs count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounts {
    /// TcpExtTW + TcpExtTWKilled.
    pub time_wait_entered: u64,
    /// TcpExtListenOverflows.
    pub listen_overflows: u64,
}

impl Screen {
    /// No destination can have more of this namespace's ports than this.
    pub fn port_holders(&self) -> u64 {
        self.in_use + self.minisockets
    }
}

impl ScreenFiles {
    /// The files of the namespace `dirs` were opened in; `follow_changes`
    /// for readings that are compared round after round.
    pub fn open(dirs: &Dirs, follow_changes: bool) -> io::Result<Self> {
        let net = |name: &str| dirs.proc_net(name);
        let (snmp, netstat) = if follow_changes { (Some(net("snmp")?), Some(net("netstat")?)) } else { (None, None) };
        Ok(Self { sockstat: net("sockstat")?, sockstat6: net("sockstat6").ok(), snmp, netstat })
    }

    /// The screen, and the namespace's traffic so far where changes are
    /// followed (`Traffic`).
    pub fn read(&self) -> io::Result<(Screen, Option<Traffic>)> {
        let sockstat = read_text(&self.sockstat)?;
        let (in_use, minisockets) =
            sockstat_tcp(&sockstat, "TCP:").ok_or_else(|| invalid(format!("sockstat: no TCP line in `{sockstat}`")))?;
        let in_use6 = match &self.sockstat6 {
            Some(file) => sockstat_tcp(&read_text(file)?, "TCP6:").map_or(0, |(in_use, _)| in_use),
            None => 0,
        };
        let (active_opens, passive_opens, traffic) = match &self.snmp {
            Some(file) => {
                // procfs parses snmp; a seq file must be read from its start.
                let mut snmp = file;
                snmp.rewind()?;
                let snmp = procfs::net::Snmp::from_buf_read(BufReader::new(snmp))
                    .map_err(|e| invalid(format!("snmp: {e}")))?;
                let segments = [snmp.tcp_in_segs, snmp.tcp_out_segs, snmp.tcp_retrans_segs, snmp.tcp_out_rsts];
                (snmp.tcp_active_opens, snmp.tcp_passive_opens, Some(Traffic { segments }))
            }
            None => (0, 0, None),
        };
        Ok((Screen { in_use: in_use + in_use6, minisockets, active_opens, passive_opens }, traffic))
    }

    /// The namespace's own counts that observer checks its programs'
    /// against (TcpExt, /proc/net/netstat); None where the file is not
    /// held (doctor).
    pub fn kernel_counts(&self) -> io::Result<Option<KernelCounts>> {
        let Some(file) = &self.netstat else { return Ok(None) };
        let mut text = String::new();
        let mut netstat = file;
        netstat.rewind()?;
        io::Read::read_to_string(&mut netstat, &mut text)?;
        let counters = tcp_ext(&text).ok_or_else(|| invalid("netstat: no TcpExt lines".to_string()))?;
        Ok(Some(KernelCounts {
            // Bumped when a socket's TIME_WAIT timer is first set (full
            // wait or short one): on entry, on the kernels that check.
            time_wait_entered: counters("TW").unwrap_or(0) + counters("TWKilled").unwrap_or(0),
            listen_overflows: counters("ListenOverflows").unwrap_or(0),
        }))
    }
}

fn read_text(file: &File) -> io::Result<String> {
    let mut buf = [0u8; 1024];
    let n = file.read_at(&mut buf, 0)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// netstat's `TcpExt:` counters by name: a line of names, then a line of
/// values (procfs parses snmp but not netstat).
pub(crate) fn tcp_ext(text: &str) -> Option<impl Fn(&str) -> Option<u64> + '_> {
    let mut lines = text.lines().filter_map(|l| l.strip_prefix("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    Some(move |name: &str| {
        let at = names.split_whitespace().position(|n| n == name)?;
        values.split_whitespace().nth(at)?.parse().ok()
    })
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// `inuse` and `tw` of sockstat's TCP line (`TCP: inuse 3 orphan 0 tw 7
/// alloc 9 mem 1`; sockstat6 has `TCP6: inuse 1`, no `tw`: both families'
/// TIME_WAIT sockets are in sockstat's). procfs has no parser for these
/// files; the format is one line of name-value pairs.
fn sockstat_tcp(text: &str, prefix: &str) -> Option<(u64, u64)> {
    let line = text.lines().find_map(|l| l.strip_prefix(prefix))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let value = |name: &str| words.chunks(2).find(|kv| kv[0] == name).and_then(|kv| kv.get(1)?.parse().ok());
    Some((value("inuse")?, value("tw").unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockstat_lines_give_in_use_and_minisockets() {
        let v4 = "sockets: used 211\nTCP: inuse 9 orphan 0 tw 19 alloc 47 mem 22\nUDP: inuse 2 mem 0\n";
        assert_eq!(sockstat_tcp(v4, "TCP:"), Some((9, 19)));
        assert_eq!(sockstat_tcp("TCP6: inuse 4\nUDP6: inuse 1\n", "TCP6:"), Some((4, 0)));
        assert_eq!(sockstat_tcp("UDP: inuse 2 mem 0\n", "TCP:"), None);
    }

    #[test]
    fn netstat_counters_are_found_by_name() {
        let text = "TcpExt: SyncookiesSent TW TWRecycled TWKilled\nTcpExt: 0 120 0 3\n\
                    IpExt: InNoRoutes\nIpExt: 0\n";
        let counters = tcp_ext(text).unwrap();
        assert_eq!((counters("TW"), counters("TWKilled"), counters("Nope")), (Some(120), Some(3), None));
    }
}
