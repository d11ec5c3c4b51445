//! Pod churn on a node: the unknown owners of pods' old sockets must not
//! keep their process slots after the pods are gone. Its own test binary:
//! it counts process slots, which tests running beside it would take.
mod common;

use std::time::Duration;

use common::{
    daemon::{scrape_until, start_daemon_with_env},
    pods::{
        Dirs, PodWithOldConnections, namespace_with_holding_server, scrape_time_wait_entries, time_wait_lines,
        wait_for_time_wait_entries,
    },
};
use observer_testing::http::{sample, sample_sum};

/// Pod churn: the unknown owner of each pod's old sockets (pid 0 in the
/// pod's cgroup: orphans that no process held at observer's start) has no
/// process that could exit, so it takes a process slot until it has been
/// idle for the grace period, as a removed pod's cgroup stays. With room
/// for four processes (observer itself, which accepts the scrapes, this
/// test, which makes them, one unknown owner and one more; the pods'
/// shells and their server have nothing to count), three pods one after
/// the other each get their own series, exact, none folded into `other`:
/// only a retired unknown owner can make room for the next.
#[test]
fn unknown_owners_of_removed_pods_give_their_process_slot_back() {
    const SLOTS: &str = "4";
    let logs = std::env::temp_dir().join(format!("observer-pod-logs-churn-{}", std::process::id()));
    let mut log_dirs = Dirs(Vec::new());
    let names = ["churn-a-0", "churn-b-0", "churn-c-0"];
    // One namespace and server for all, which closes each pod's
    // connections in turn (they were opened in that order).
    let (ns, mut server) = namespace_with_holding_server();
    let mut pods: Vec<PodWithOldConnections> =
        names.iter().map(|name| PodWithOldConnections::open(name, &mut log_dirs, &logs, &ns, 2)).collect();
    for pod in &mut pods {
        pod.orphan_all(&ns);
    }
    // The pod's series lives --grace after its last count: long enough for
    // the scrapes below to find it on a slow machine (at 1 s the first
    // scrape sometimes came after it had ended).
    let daemon = start_daemon_with_env(
        &["--pod-logs", logs.to_str().unwrap(), "--max-processes", SLOTS, "--grace", "3s"],
        &[("RUST_LOG", "observer=debug")],
    );
    let mut entered_before = 0;
    let mut shells = Vec::new();
    for (pod, name) in pods.into_iter().zip(names) {
        server.close_oldest(2);
        wait_for_time_wait_entries(&ns, entered_before + 2);
        let entered = ns.time_wait_entered() - entered_before;
        entered_before += entered;
        assert_eq!(entered, 2, "{}", ns.ss_all());
        let owner = pod.unknown_owner(name);
        let body = scrape_time_wait_entries(&daemon, &owner, entered, &format!("pod {name}"));
        let labels: Vec<&str> = owner.iter().map(String::as_str).collect();
        let other = sample_sum(&body, "observer_tcp_time_wait_entries_total", &["otel_metric_overflow=\"true\""]);
        assert_eq!(other, 0, "nothing folded into other:\n{}", time_wait_lines(&body));
        // The pod is deleted; its unknown owner is retired a grace period
        // after its last count.
        shells.push(pod.remove());
        let body = scrape_until(&daemon, Duration::from_secs(10), |b| {
            sample(b, "observer_tcp_time_wait_entries_total", &labels).is_none()
        });
        assert_eq!(sample(&body, "observer_tcp_time_wait_entries_total", &labels), None, "{}", time_wait_lines(&body));
    }
}
