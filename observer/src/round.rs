//! One collection round, the same for the daemon and the kernel tests:
//! read the node (every namespace once), read the kernel maps into deltas
//! (exactly once each), charge them to series, name the gauges through the
//! same series store, and build the `Snapshot` the exporters read.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use observer_common::{lost, names::maps};

use crate::{
    attribution::Attributor,
    collect::{Collector, Deltas, KernelMaps},
    config::RunConfig,
    conntrack_drops::ConntrackDrops,
    error::Error,
    node::{NodeReading, files, sweep::Sweeper, trend::PortTrend},
    probes::{
        Attachment, ProgramHandle,
        hooks::{self, Mode},
    },
    queues,
    series::SeriesStore,
    snapshot::{FoldedListeners, KernelHealth, ListenerGauge, NamespaceGauge, NodeGauges, RoundStats, Snapshot},
};

/// What one round produced: the deltas it applied (the kernel tests sum
/// them) and the snapshot for the exporters.
pub struct RoundOutput {
    pub deltas: Deltas,
    pub snapshot: Snapshot,
}

/// The state that lasts from round to round.
pub struct Rounds {
    collector: Collector,
    sweeper: Sweeper,
    series: SeriesStore,
    trend: PortTrend,
    /// The host's /proc, where the node is read.
    proc_root: PathBuf,
    /// How long a process's series outlive it.
    grace: Duration,
    /// Rounds in --grace: a destination that counted nothing and had no
    /// connection open for as long frees its labels.
    destination_idle_rounds: u64,
    attachments: Vec<Attachment>,
    programs: Vec<ProgramHandle>,
    failures: u64,
    /// TIME_WAIT entries are checked against the kernel's count
    /// (`without_time_wait_check`).
    time_wait_check: bool,
    lost: LossLog,
    /// A namespace had more listeners than --max-listeners (logged once).
    listeners_folded_reported: bool,
    conntrack_drops: ConntrackDrops,
    connection_limits: std::sync::Arc<[crate::config::ConnectionLimit]>,
    limit_inference: crate::inferred_limits::LimitInference,
}

/// One warning per map each time the kernel side lost updates to it (a
/// full map), naming what to change; the metric keeps the number.
#[derive(Default)]
struct LossLog {
    reported: std::collections::HashMap<&'static str, u64>,
}

impl LossLog {
    /// Losses already logged where they happened.
    fn already_said(lost: &[(&'static str, u64)]) -> Self {
        Self { reported: lost.iter().copied().collect() }
    }

    /// The maps whose lost updates grew since the last call, with how many
    /// more, each logged.
    fn report(&mut self, lost: &[(&'static str, u64)]) -> Vec<(&'static str, u64)> {
        let mut grew = Vec::new();
        for &(map, total) in lost {
            let before = self.reported.insert(map, total).unwrap_or(0);
            if total > before {
                grew.push((map, total - before));
                tracing::warn!(
                    map,
                    lost = total - before,
                    total,
                    "kernel counter updates lost: {map} was full, counts are short by this many \
                     (observer_kernel_lost_updates_total); {}",
                    Self::remedy(map)
                );
            }
        }
        grew
    }

    fn remedy(map: &str) -> &'static str {
        match map {
            maps::PROC_COUNTERS
            | maps::CONNECT_ERRORS
            | maps::LISTEN_OVERFLOWS
            | maps::CLOSED_LISTENERS
            | maps::CONNECTIONS => "it holds one interval's keys: shorten --interval",
            maps::OPEN_CONNECTIONS => {
                "more connections were established at once than it follows: the newest are left out of \
                 observer_tcp_connection_usage and the connection counters; raise --max-sockets"
            }
            maps::QUEUED_ENDS => {
                "more connections ended with CONNECTIONS full within one interval than it queues (16,384): those \
                 stay counted open in observer_tcp_connection_usage; shorten --interval"
            }
            maps::INFLIGHT_CONNECTS => "more connect() calls were in flight at once than it holds (16,384)",
            maps::TIME_WAIT_BY_NETNS => "more network namespaces had TIME_WAIT entries than it holds (4,096)",
            _ => "see observer_map_usage against observer_map_limit",
        }
    }
}

impl Rounds {
    pub fn new(
        maps: KernelMaps,
        attachments: Vec<Attachment>,
        programs: Vec<ProgramHandle>,
        config: &RunConfig,
    ) -> Self {
        let attributor = Attributor::new(&config.proc_root, config.cgroup_root.clone(), config.pod_logs.clone());
        let left_out = maps.left_out_at_start.clone();
        let overflows_from_sweep =
            attachments.iter().any(|a| a.hook == hooks::LISTEN_OVERFLOW && a.mode == Mode::SockDiag);
        let mut sweeper = Sweeper::new(&config.proc_root, config.max_namespaces, config.interval);
        // Overflows counted by programs are checked against each
        // namespace's own count (the drop counters of the sweep's mode are
        // the kernel's, not a count to check).
        sweeper.check_overflows = !overflows_from_sweep;
        Self {
            collector: Collector::new(maps, config.proc_root.clone(), attributor, overflows_from_sweep),
            sweeper,
            series: SeriesStore::new(config.limits),
            trend: PortTrend::default(),
            proc_root: config.proc_root.clone(),
            grace: config.grace,
            destination_idle_rounds: (config.grace.as_secs_f64() / config.interval.as_secs_f64()).ceil() as u64,
            attachments,
            programs,
            failures: 0,
            time_wait_check: true,
            // The start-up pass logged what it left out.
            lost: LossLog::already_said(&[(maps::OPEN_CONNECTIONS, left_out.open_connections)]),
            listeners_folded_reported: false,
            conntrack_drops: ConntrackDrops::default(),
            connection_limits: config.connection_limits.clone().into(),
            limit_inference: Default::default(),
        }
    }

    /// The kernel counts TIME_WAIT sockets only when they end: no check of
    /// observer's count against it, and no `unseen` series (a zero would
    /// claim a check that is not made).
    pub fn without_time_wait_check(&mut self) {
        self.time_wait_check = false;
        self.sweeper.check_time_wait = false;
    }

    /// The next round is the last: let every count out, labelled or not.
    pub fn last_round(&mut self) {
        self.collector.last_round();
    }

    /// Rounds that failed so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// One round, started at `now`.
    pub fn run(&mut self, now: Instant) -> Result<RoundOutput, Error> {
        if self.sweeper.next_sweep_checks_time_wait()
            && let Err(e) = self.collector.before_time_wait_check()
        {
            self.failures += 1;
            return Err(e);
        }
        let mut node = self.sweeper.sweep();
        self.trend.update(now, &mut node);
        let sweeper = &self.sweeper;
        let deltas = match self.collector.collect(now, self.grace, &node, &|netns| sweeper.listen_overflows(netns)) {
            Ok(deltas) => deltas,
            Err(e) => {
                self.failures += 1;
                return Err(e);
            }
        };
        self.series.apply(&deltas);
        let mut gauges = self.gauges(node, &deltas);
        gauges.inferred_limits = self.limit_inference.update(now, &deltas.connections, &deltas.open_connections);
        gauges.servers_unfollowed = self.limit_inference.unfollowed() as u64;
        // After the gauges: a destination with a connection open is in use.
        self.series.recycle_destinations(self.destination_idle_rounds);
        let snapshot = Snapshot {
            series: self.series.clone(),
            kernel: {
                let kernel = self.kernel_health(&deltas);
                self.lost.report(&kernel.lost);
                kernel
            },
            node: gauges,
            rounds: RoundStats {
                seconds: now.elapsed().as_secs_f64(),
                completed_at: Some(Instant::now()),
                failures: self.failures,
            },
        };
        Ok(RoundOutput { deltas, snapshot })
    }

    /// The node's gauges, each process named by the series store.
    fn gauges(&mut self, node: NodeReading, deltas: &Deltas) -> NodeGauges {
        let mut listeners = Vec::new();
        let mut folded_listeners = Vec::new();
        let mut namespaces = Vec::new();
        let sweep = node.counts;
        let max_listeners = self.series.limits().max_listeners;
        self.conntrack_drops.update(&node);
        for netns in node.namespaces {
            let pod = deltas.namespace_pods.get(&netns.inode).cloned();
            let (kept, folded) = queues::fullest(netns.listeners, max_listeners);
            if let Some(folded) = folded {
                if !self.listeners_folded_reported {
                    self.listeners_folded_reported = true;
                    tracing::warn!(
                        network_namespace = %netns.name,
                        listeners = kept.len() as u64 + folded.listeners,
                        max = max_listeners,
                        "a network namespace has more listeners than --max-listeners: the accept queues of the \
                         least full are summed in one series marked otel_metric_overflow=\"true\"; raise \
                         --max-listeners to see each (logged once)"
                    );
                }
                folded_listeners.push(FoldedListeners { netns: netns.name.clone(), pod: pod.clone(), folded });
            }
            for listener in kept {
                // Owners whose pod labels are still being looked up are
                // named from the next round on, labels and all.
                let owner = deltas
                    .listener_owners
                    .get(&listener.cookie)
                    .and_then(|actor| self.series.owner(actor, &deltas.pods));
                listeners.push(ListenerGauge { netns: netns.name.clone(), pod: pod.clone(), listener, owner });
            }
            if let Some(usage) = netns.usage {
                let conntrack_drops = self.conntrack_drops.total(netns.inode);
                namespaces.push(NamespaceGauge { name: netns.name, pod, usage, conntrack_drops });
            }
        }
        let proc_root = &self.proc_root;
        let open_files = self
            .series
            .processes()
            .filter_map(|who| {
                let crate::series::Who::Process { pid, .. } = who else { return None };
                // A process already gone has none to report.
                Some((who, files::of_process(proc_root, pid)?))
            })
            .collect();
        let open_connections = self.series.open_connections(&deltas.open_connections, &deltas.pods);
        NodeGauges {
            namespaces,
            listeners,
            folded_listeners,
            open_files,
            open_connections,
            connection_limits: self.connection_limits.clone(),
            inferred_limits: Vec::new(),
            servers_unfollowed: 0,
            sweep,
        }
    }

    fn kernel_health(&self, deltas: &Deltas) -> KernelHealth {
        KernelHealth {
            attachments: self.attachments.clone(),
            lost: vec![
                (maps::PROC_COUNTERS, deltas.lost[lost::PROC_COUNTERS_FULL as usize]),
                (maps::CONNECT_ERRORS, deltas.lost[lost::CONNECT_ERRORS_FULL as usize]),
                (maps::INFLIGHT_CONNECTS, deltas.lost[lost::INFLIGHT_FULL as usize]),
                (maps::TIME_WAIT_BY_NETNS, deltas.lost[lost::TIME_WAIT_BY_NETNS_FULL as usize]),
                (maps::LISTEN_OVERFLOWS, deltas.lost[lost::LISTEN_OVERFLOWS_FULL as usize]),
                (maps::CLOSED_LISTENERS, deltas.lost[lost::CLOSED_LISTENERS_FULL as usize]),
                (
                    maps::OPEN_CONNECTIONS,
                    deltas.lost[lost::OPEN_CONNECTIONS_FULL as usize] + deltas.left_out_at_start.open_connections,
                ),
                (maps::CONNECTIONS, deltas.lost[lost::CONNECTIONS_FULL as usize]),
                (maps::QUEUED_ENDS, deltas.lost[lost::QUEUED_ENDS_FULL as usize]),
            ],
            unseen: [
                ("time_wait_entry", deltas.unseen_time_wait, self.time_wait_check),
                ("listen_overflow", deltas.unseen_overflows, self.sweeper.check_overflows),
                ("connection", deltas.unseen_connections, true),
            ]
            .into_iter()
            .filter(|(_, _, checked)| *checked)
            .map(|(event, n, _)| (event, n))
            .collect(),
            // Cumulative in the kernel: read as is, no delta needed.
            missed: self
                .programs
                .iter()
                .filter(|p| p.skips_counted)
                .filter_map(|p| p.stats().ok().map(|s| (p.hook, p.program, s.missed)))
                .collect(),
            maps: deltas.map_fill.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_growth_of_lost_updates_is_reported_once_with_what_grew() {
        let mut log = LossLog::default();
        assert!(log.report(&[(maps::PROC_COUNTERS, 0), (maps::CONNECT_ERRORS, 0)]).is_empty());
        assert_eq!(log.report(&[(maps::PROC_COUNTERS, 5), (maps::CONNECT_ERRORS, 0)]), [(maps::PROC_COUNTERS, 5)]);
        assert!(log.report(&[(maps::PROC_COUNTERS, 5), (maps::CONNECT_ERRORS, 0)]).is_empty(), "no news, no line");
        assert_eq!(log.report(&[(maps::PROC_COUNTERS, 7), (maps::CONNECT_ERRORS, 1)]).len(), 2);
        assert!(LossLog::remedy(maps::PROC_COUNTERS).contains("--interval"));
    }
}
