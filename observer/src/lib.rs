//! observer: per-process TCP avalanche signals from eBPF, exported as
//! OpenTelemetry metrics. The data flows probes -> collect (kernel maps ->
//! deltas) -> attribution (pods) -> series -> snapshot -> export, one
//! `round` per interval, with `node` (namespaces, sockets, /proc) read in
//! the same round. The CLI (`cli`) drives it, the daemon (`daemon::run`)
//! wires it together; ARCHITECTURE.md tells the whole path.
pub mod attribution;
pub mod ceilings;
pub mod cli;
pub mod collect;
pub mod config;
pub mod conntrack_drops;
pub mod daemon;
pub mod error;
pub mod export;
pub mod health;
pub mod inferred_limits;
pub mod node;
pub mod probes;
pub mod queues;
pub mod round;
pub mod series;
pub mod snapshot;
pub mod top;
pub mod trace;
