//! What a collection round hands to the exporters: one `Snapshot`, built
//! whole by the round and replaced whole, so the instruments never see a
//! half-updated round and never take a lock the round holds for long.
//!
//! Every process in it was named by the series store (`series::Who`), so
//! counters and gauges share one cap and one set of labels.
use std::sync::{Arc, Mutex};

use crate::{
    attribution::PodLabels,
    collect::MapFill,
    node::{NetnsUsage, files::OpenFiles, sock_diag::Listener, sweep::SweepCounts},
    probes::Attachment,
    series::{ConnectionSeries, SeriesStore, Who},
};

#[derive(Clone, Default)]
pub struct Snapshot {
    /// The counters: cumulative totals per series.
    pub series: SeriesStore,
    /// How the kernel side is doing: hooks, losses, map fill.
    pub kernel: KernelHealth,
    /// Gauges of the node: ceilings and their usage, accept queues, files.
    pub node: NodeGauges,
    pub rounds: RoundStats,
}

#[derive(Clone, Default)]
pub struct KernelHealth {
    /// Each hook and the mode it is attached in.
    pub attachments: Vec<Attachment>,
    /// Kernel updates lost to full maps, by map name, cumulative.
    pub lost: Vec<(&'static str, u64)>,
    /// Events the kernel counted that no program saw, by event, cumulative.
    pub unseen: Vec<(&'static str, u64)>,
    /// (hook, program, runs the kernel skipped), cumulative.
    pub missed: Vec<(&'static str, &'static str, u64)>,
    /// How full each kernel map is.
    pub maps: Vec<MapFill>,
}

#[derive(Clone, Default)]
pub struct NodeGauges {
    /// Each network namespace's ceilings and usage.
    pub namespaces: Vec<NamespaceGauge>,
    pub listeners: Vec<ListenerGauge>,
    /// The listeners beyond `--max-listeners` of each namespace, summed.
    pub folded_listeners: Vec<FoldedListeners>,
    /// Open files against RLIMIT_NOFILE of each process with series.
    pub open_files: Vec<(Who, OpenFiles)>,
    /// Connections established now, per process, direction and far end.
    pub open_connections: std::collections::BTreeMap<ConnectionSeries, u64>,
    /// The connection limits the user declared (`--connection-limits`).
    pub connection_limits: Arc<[crate::config::ConnectionLimit]>,
    /// The servers' limits nobody declared, as this node sees them turn
    /// new connections away (`inferred_limits.rs`).
    pub inferred_limits: Vec<crate::inferred_limits::InferredLimit>,
    /// Servers the inference could not follow (`LimitInference::unfollowed`).
    pub servers_unfollowed: u64,
    /// How the sweep read the namespaces.
    pub sweep: SweepCounts,
}

/// A network namespace: its name, its pod when it is one's, its usage.
#[derive(Clone, Debug)]
pub struct NamespaceGauge {
    pub name: String,
    pub pod: Option<Arc<PodLabels>>,
    pub usage: NetnsUsage,
    /// Its conntrack table's drops since observer watched it, by
    /// `DropReason::ALL`'s order (None: no table read).
    pub conntrack_drops: Option<[u64; 3]>,
}

/// One listener's accept queue, with the process that listens when known.
#[derive(Clone, Debug)]
pub struct ListenerGauge {
    pub netns: String,
    /// The namespace's pod (the owner's labels say it too, when known).
    pub pod: Option<Arc<PodLabels>>,
    pub listener: Listener,
    pub owner: Option<Who>,
}

/// A namespace's listeners beyond `--max-listeners`, their queues summed.
#[derive(Clone, Debug)]
pub struct FoldedListeners {
    pub netns: String,
    pub pod: Option<Arc<PodLabels>>,
    pub folded: crate::queues::Folded,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RoundStats {
    /// How long the last successful round took.
    pub seconds: f64,
    /// When the last successful round ended.
    pub completed_at: Option<std::time::Instant>,
    /// Rounds that failed (each retried at the next interval).
    pub failures: u64,
}

/// The latest snapshot: the round replaces it, the instruments read it.
#[derive(Default)]
pub struct Published(Mutex<Arc<Snapshot>>);

impl Published {
    pub fn publish(&self, snapshot: Snapshot) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(snapshot);
    }

    /// Change the latest snapshot in place (copied first if an instrument
    /// still reads it).
    pub fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        f(Arc::make_mut(&mut self.0.lock().unwrap_or_else(|p| p.into_inner())));
    }

    pub fn latest(&self) -> Arc<Snapshot> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
