//! observer: per-process TCP avalanche signals from eBPF, exported as
//! OpenTelemetry metrics. The data flows probes -> collect -> export; the
//! CLI (`cli`) drives it, the daemon (`daemon::run`) wires it together.
pub mod attribution;
pub mod ceilings;
pub mod cli;
pub mod collect;
pub mod config;
pub mod daemon;
pub mod error;
pub mod export;
pub mod probes;
