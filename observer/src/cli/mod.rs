//! Command line: one file per subcommand.
pub mod doctor;
pub mod run;

use clap::{Parser, Subcommand};

/// observer counts, per process, the kernel's TCP avalanche signals —
/// connect() failures by errno (EADDRNOTAVAIL: ephemeral ports exhausted),
/// sockets entering TIME_WAIT, listen-queue overflows — and the connects and
/// accepts around them, and exports them as OpenTelemetry metrics.
///
/// It needs root (or CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN and CAP_SYS_ADMIN
/// for entering network namespaces) and a kernel with BTF.
#[derive(Debug, Parser)]
#[command(name = "observer", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Run(Box<run::RunArgs>),
    Doctor(doctor::DoctorArgs),
}
