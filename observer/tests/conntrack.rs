//! The connection tracking table, the ceiling the incidents did not name:
//! a namespace whose rules track connections fills its table, and the
//! kernel drops new connections' SYNs. Its own test binary: it lowers the
//! host's nf_conntrack_max (the kernel holds every namespace's count
//! against it), which tests running beside it must not meet.
mod common;

use std::time::Duration;

use common::daemon::{scrape_until, start_daemon};
use observer_testing::{Netns, http::sample, netns::run};

const MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

/// nf_conntrack_max set for the test, given back on drop (a failing test
/// too).
struct TableLimit(String);

impl TableLimit {
    fn set(limit: u64) -> Self {
        let before = std::fs::read_to_string(MAX).expect("nf_conntrack is loaded (built into the test kernels)");
        std::fs::write(MAX, limit.to_string()).unwrap();
        Self(before.trim().to_string())
    }
}

impl Drop for TableLimit {
    fn drop(&mut self) {
        let _ = std::fs::write(MAX, &self.0);
    }
}

/// The namespace's own view of its table: (entries, drops by table_full,
/// early_drop, insert_failed), as the kernel's files give them.
fn kernel_table(ns: &Netns) -> (u64, [u64; 3]) {
    let entries = run(ns.command("cat").arg("/proc/sys/net/netfilter/nf_conntrack_count")).trim().parse().unwrap();
    let stat = run(ns.command("cat").arg("/proc/net/stat/nf_conntrack"));
    let mut lines = stat.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let mut drops = [0u64; 3];
    for row in lines {
        let fields: Vec<&str> = row.split_whitespace().collect();
        for (sum, column) in drops.iter_mut().zip(["drop", "early_drop", "insert_failed"]) {
            let at = header.iter().position(|h| *h == column).unwrap();
            *sum += u64::from_str_radix(fields[at], 16).unwrap();
        }
    }
    (entries, drops)
}

/// A pod-like namespace whose firewall tracks connections runs out of
/// conntrack entries: every connection past nf_conntrack_max loses its SYN.
/// observer's gauges equal the namespace's nf_conntrack_count and the
/// limit, its drop counters the namespace's own statistics, all of them
/// (the namespace was created while observer ran).
#[test]
fn a_full_conntrack_table_and_its_drops_equal_the_kernels() {
    let daemon = start_daemon(&[]);
    let ns = Netns::new();
    // A rule that needs conntrack makes the kernel track this namespace.
    run(ns.command("iptables").args(["-A", "OUTPUT", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"]));
    let _server = ns.serve(&["--listen", "127.0.0.1:9100"]);
    let host_entries: u64 =
        std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count").unwrap().trim().parse().unwrap();
    // The kernel holds each namespace's own count against the limit:
    // above the host's, so the host's connections never meet it.
    let limit = host_entries + 30;
    let _limit = TableLimit::set(limit);

    // 30 connections more than the limit, each closed by the client at
    // once (its entry stays, in TIME_WAIT, for two minutes); each one past
    // the limit loses its SYN and gives up 50 ms later, before the SYN is
    // sent again.
    let count = (limit + 30).to_string();
    ns.client(&["--to", "127.0.0.1:9100", "--count", &count, "--nonblocking", "50ms"]);
    let (entries, drops) = kernel_table(&ns);
    assert!(drops[0] > 0, "the scenario must fill the table: {entries} entries, drops {drops:?}");
    assert_eq!(entries, limit, "the table holds what the limit allows");

    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(ns.path()).unwrap());
    let netns = format!("observer_network_namespace=\"{inode}\"");
    let reason = |r: &str| format!("observer_conntrack_drop_reason=\"{r}\"");
    let counted = |b: &str| {
        sample(b, "observer_conntrack_usage", &[&netns]) == Some(entries)
            && sample(b, "observer_conntrack_drops_total", &[&netns, &reason("table_full")]) == Some(drops[0])
    };
    let body = scrape_until(&daemon, Duration::from_secs(10), counted);
    let lines: Vec<&str> = body.lines().filter(|l| l.starts_with("observer_conntrack") && l.contains(&netns)).collect();
    assert_eq!(sample(&body, "observer_conntrack_usage", &[&netns]), Some(entries), "{lines:#?}");
    assert_eq!(sample(&body, "observer_conntrack_limit", &[&netns]), Some(limit), "{lines:#?}");
    for (i, r) in ["table_full", "early_drop", "insert_failed"].iter().enumerate() {
        assert_eq!(sample(&body, "observer_conntrack_drops_total", &[&netns, &reason(r)]), Some(drops[i]), "{r}");
    }

    // observer doctor names the full table, critical (exit code 2).
    let path = ns.path();
    let out = std::process::Command::new(common::daemon::OBSERVER)
        .args(["doctor", "--json", "--netns"])
        .arg(&path)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let finding = report["findings"].as_array().unwrap().iter().find(|f| f["check"] == "conntrack").expect("a finding");
    assert_eq!((&finding["used"], &finding["limit"]), (&entries.into(), &limit.into()), "{finding}");
    assert_eq!((&finding["verdict"], out.status.code()), (&"critical".into(), Some(2)), "{finding}");
}
