//! A namespace's connection tracking table, the ceiling the incidents did
//! not name: every connection through a namespace whose firewall or NAT
//! rules track connections takes an entry, and at `nf_conntrack_max`
//! entries the kernel drops the packets of new connections ("nf_conntrack:
//! table full, dropping packet"), which clients see as connect timeouts.
//!
//! The count is the namespace's own (`nf_conntrack_count`), held against
//! `nf_conntrack_max`, which the kernel checks against each namespace's
//! count (the value is the host's; other namespaces see it read-only). Its
//! statistics (`/proc/net/stat/nf_conntrack`, one row per CPU, hex) are the
//! namespace's too. Absent where nf_conntrack is not loaded.
use std::{fs::File, io, os::unix::fs::FileExt as _};

use serde::Serialize;

use super::netns::Dirs;

/// Why the table dropped something, as the statistics name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The table was full and no entry could be evicted: the packet of a
    /// new connection was dropped (`drop`).
    TableFull,
    /// A connection not yet answered was evicted to make room (`early_drop`).
    EarlyDrop,
    /// A new entry could not be inserted (a clash with another): the
    /// packet was dropped (`insert_failed`).
    InsertFailed,
}

impl DropReason {
    pub const ALL: [DropReason; 3] = [DropReason::TableFull, DropReason::EarlyDrop, DropReason::InsertFailed];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::TableFull => "table_full",
            DropReason::EarlyDrop => "early_drop",
            DropReason::InsertFailed => "insert_failed",
        }
    }

    /// The statistics file's column.
    fn column(self) -> &'static str {
        match self {
            DropReason::TableFull => "drop",
            DropReason::EarlyDrop => "early_drop",
            DropReason::InsertFailed => "insert_failed",
        }
    }
}

/// One reading of a namespace's table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Conntrack {
    /// Entries of this namespace now.
    pub entries: u64,
    /// nf_conntrack_max: at this many entries new connections are dropped.
    pub limit: u64,
    /// Drops since the namespace was created, by `DropReason::ALL`'s order;
    /// zeros in a one-shot reading (doctor), which does not read them.
    #[serde(skip)]
    pub drops: [u64; 3],
}

impl Conntrack {
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }
}

/// The table's files, opened in the namespace (like the settings, a
/// /proc/sys/net file answers for the namespace of the thread that opened
/// it, /proc/thread-self/net/... likewise).
pub struct ConntrackFiles {
    count: File,
    max: File,
    /// The drops, for who follows them from round to round.
    stat: Option<File>,
}

/// Files `ConntrackFiles` holds.
pub const FILES: u64 = 3;

impl ConntrackFiles {
    /// The files of the namespace `dirs` were opened in; None where
    /// nf_conntrack is not loaded. The drops' statistics (a row per CPU to
    /// read and parse, in every namespace) only with `follow_drops`.
    pub fn open(dirs: &Dirs, follow_drops: bool) -> Option<Self> {
        Some(Self {
            count: dirs.sysctl("netfilter/nf_conntrack_count").ok()?,
            max: dirs.sysctl("netfilter/nf_conntrack_max").ok()?,
            stat: if follow_drops { Some(dirs.proc_net("stat/nf_conntrack").ok()?) } else { None },
        })
    }

    pub fn read(&self) -> io::Result<Conntrack> {
        let drops = match &self.stat {
            Some(file) => {
                let stat = read_text(file)?;
                drops(&stat).ok_or_else(|| invalid(format!("/proc/net/stat/nf_conntrack: `{stat}`")))?
            }
            None => [0; 3],
        };
        Ok(Conntrack {
            entries: number(&self.count, "nf_conntrack_count")?,
            limit: number(&self.max, "nf_conntrack_max")?,
            drops,
        })
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// A file read whole from its start (files held open are read again each
/// round; the statistics have a row per CPU).
fn read_text(file: &File) -> io::Result<String> {
    let mut text = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = file.read_at(&mut chunk, text.len() as u64)?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(text).map_err(|_| invalid("not text".into()))
}

fn number(file: &File, name: &str) -> io::Result<u64> {
    let text = read_text(file)?;
    text.trim().parse().map_err(|_| invalid(format!("{name}: `{}` is not a number", text.trim())))
}

/// The drop columns of the statistics, summed over the CPUs' rows. The
/// columns differ between kernels (5.10 has `searched`, 6.x `clashres`),
/// so they are found by the header's names.
fn drops(stat: &str) -> Option<[u64; 3]> {
    let mut lines = stat.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let columns: Vec<usize> =
        DropReason::ALL.iter().map(|r| header.iter().position(|h| *h == r.column())).collect::<Option<_>>()?;
    let mut sums = [0u64; 3];
    for row in lines.filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = row.split_whitespace().collect();
        for (sum, column) in sums.iter_mut().zip(&columns) {
            *sum += u64::from_str_radix(fields.get(*column)?, 16).ok()?;
        }
    }
    Some(sums)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_columns_are_found_by_name_and_summed_over_the_cpus() {
        // Linux 6.x's columns.
        let six = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop \
                   icmp_error  expect_new expect_create expect_delete search_restart\n\
                   00000021  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 \
                   0000000a 00000002 00000000  00000000 00000000 00000000 00000000\n\
                   00000021  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 \
                   00000010 00000000 00000000  00000000 00000000 00000000 00000000\n";
        assert_eq!(drops(six), Some([0x1a, 2, 1]));
        // Linux 5.10's.
        let five = "entries  searched found new invalid ignore delete delete_list insert insert_failed drop \
                    early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
                    00000003  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 \
                    00000007 00000000 00000000  00000000 00000000 00000000 00000000\n";
        assert_eq!(drops(five), Some([7, 0, 0]));
        assert_eq!(drops("entries found\n00000001 00000000\n"), None, "no drop columns");
    }

    /// This host's own table (nf_conntrack is built into the test kernels).
    #[test]
    fn the_hosts_table_reads() {
        let dirs = Dirs::open().expect("/proc");
        let following = ConntrackFiles::open(&dirs, true).expect("nf_conntrack loaded").read().unwrap();
        let once = ConntrackFiles::open(&dirs, false).expect("nf_conntrack loaded").read().unwrap();
        assert!(following.limit > 0, "{following:?}");
        assert_eq!((once.limit, once.drops), (following.limit, [0; 3]), "a one-shot reading has no drops");
    }
}
