//! Pod churn on a node: the unknown owners of pods' old sockets must not
//! keep their process slots after the pods are gone. Its own test binary:
//! it counts process slots, which tests running beside it would take.
mod common;

use std::time::Duration;

use common::{
    daemon::{Daemon, scrape_until, start_daemon_with_env},
    pods::{
        Dirs, PodWithOldConnections, namespace_with_holding_server, scrape_time_wait_entries, time_wait_lines,
        wait_for_time_wait_entries,
    },
};
use observer_testing::{
    HoldingClient, Netns,
    http::{sample, sample_sum},
};

/// Every free process slot of `daemon` taken by a process of this test
/// holding one connection toward `to` in `ns`, kept until dropped: from
/// then on no slot is free, so a process new to the node (another tenant's,
/// a CI agent's) is folded into `other` rather than taking one, and a slot
/// frees only when this test frees one. The node's own processes that
/// hold slots already need not be known. Spawns holders until one is
/// folded (it holds no slot: dropped at once).
fn fill_process_slots(daemon: &Daemon, ns: &Netns, to: &str) -> Vec<HoldingClient> {
    let folded = |b: &str| sample_sum(b, "observer_series_folded_total", &[]);
    let mut holders = Vec::new();
    for _ in 0..SLOTS {
        let before = folded(&daemon.scrape());
        let holder = ns.client_holding(&["--to", to, "--count", "1"]);
        let own = format!("process_pid=\"{}\"", holder.pid());
        let has_slot = |b: &str| sample(b, "observer_tcp_connects_total", &[&own]).is_some();
        let body = scrape_until(daemon, Duration::from_secs(10), |b| has_slot(b) || folded(b) > before);
        if !has_slot(&body) {
            assert!(folded(&body) > before, "holder {} neither got a slot nor was folded", holder.pid());
            // Its own counts, not another process's fold: a round or two
            // more (a new process's series waits for its lookup).
            std::thread::sleep(Duration::from_secs(1));
            if !has_slot(&daemon.scrape()) {
                return holders;
            }
        }
        holders.push(holder);
    }
    panic!("{SLOTS} processes took a slot each and none was folded: is --max-processes {SLOTS}?");
}

/// Slots of the daemon: this test's processes fill those the node's own
/// do not take (`fill_process_slots`).
const SLOTS: usize = 24;

/// Pod churn: the unknown owner of each pod's old sockets (pid 0 in the
/// pod's cgroup: orphans that no process held at observer's start) has no
/// process that could exit, so it takes a process slot until it has been
/// idle for the grace period, as a removed pod's cgroup stays. With every
/// slot taken (`fill_process_slots`) and one freed (a holder ends), three
/// pods one after the other each get their own series, exact: only a
/// retired unknown owner can make room for the next. The test once sized
/// the slots for its own processes only, and failed when another process
/// on the node took the one left (issue 48).
#[test]
fn unknown_owners_of_removed_pods_give_their_process_slot_back() {
    let logs = std::env::temp_dir().join(format!("observer-pod-logs-churn-{}", std::process::id()));
    let mut log_dirs = Dirs(Vec::new());
    let names = ["churn-a-0", "churn-b-0", "churn-c-0"];
    // One namespace and server for all, which closes each pod's
    // connections in turn (they were opened in that order).
    let (ns, mut server) = namespace_with_holding_server();
    let _holders_server = ns.serve(&["--listen", "127.0.0.1:7001", "--hold"]);
    let mut pods: Vec<PodWithOldConnections> =
        names.iter().map(|name| PodWithOldConnections::open(name, &mut log_dirs, &logs, &ns, 2)).collect();
    for pod in &mut pods {
        pod.orphan_all(&ns);
    }
    // The pod's series lives --grace after its last count: long enough for
    // the scrapes below to find it on a slow machine (at 1 s the first
    // scrape sometimes came after it had ended).
    let daemon = start_daemon_with_env(
        &["--pod-logs", logs.to_str().unwrap(), "--max-processes", &SLOTS.to_string(), "--grace", "3s"],
        &[("RUST_LOG", "observer=debug")],
    );
    let mut holders = fill_process_slots(&daemon, &ns, "127.0.0.1:7001");
    // One slot freed: a holder ends, and is retired a grace period later.
    let freed = holders.pop().expect("at least one holder took a slot");
    let freed_labels = format!("process_pid=\"{}\"", freed.pid());
    freed.close();
    let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
        sample(b, "observer_tcp_connects_total", &[&freed_labels]).is_none()
    });
    assert_eq!(sample(&body, "observer_tcp_connects_total", &[&freed_labels]), None, "the holder was not retired");

    let mut entered_before = 0;
    let mut shells = Vec::new();
    for (pod, name) in pods.into_iter().zip(names) {
        server.close_oldest(2);
        wait_for_time_wait_entries(&ns, entered_before + 2);
        let entered = ns.time_wait_entered() - entered_before;
        entered_before += entered;
        assert_eq!(entered, 2, "{}", ns.ss_all());
        let owner = pod.unknown_owner(name);
        scrape_time_wait_entries(&daemon, &owner, entered, &format!("pod {name}"));
        let labels: Vec<&str> = owner.iter().map(String::as_str).collect();
        // The pod is deleted; its unknown owner is retired a grace period
        // after its last count.
        shells.push(pod.remove());
        let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
            sample(b, "observer_tcp_time_wait_entries_total", &labels).is_none()
        });
        assert_eq!(sample(&body, "observer_tcp_time_wait_entries_total", &labels), None, "{}", time_wait_lines(&body));
    }
}
