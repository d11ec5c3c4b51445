//! Command line: one file per subcommand.
pub mod doctor;
pub mod run;
pub mod top;
pub mod trace;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use crate::config::Settings;

/// observer counts, per process, the kernel's TCP avalanche signals —
/// connect() failures by errno (EADDRNOTAVAIL: ephemeral ports exhausted),
/// sockets entering TIME_WAIT, listen-queue overflows — and the connects and
/// accepts around them, and exports them as OpenTelemetry metrics.
///
/// It needs root (or the capabilities the README's Requirements list; a
/// missing one is named at start, with what it is for) and a kernel with
/// BTF.
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
    Top(top::TopArgs),
    Trace(trace::TraceArgs),
}

/// The command line, with each `observer run` setting's default added to
/// its help from `Settings::defaults` (not set as clap defaults: a flag
/// left out must leave the file's value in force).
pub fn command() -> clap::Command {
    Cli::command().mut_subcommand("run", |mut run| {
        for (key, default) in Settings::default_texts() {
            run = run.mut_arg(key.replace('-', "_"), |arg| {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                arg.help(format!("{help} [default: {default}]"))
            });
        }
        run
    })
}

/// The exit code of a command line observer cannot use (sysexits.h's
/// EX_USAGE): not clap's 2, which `observer doctor` means as "critical" to
/// the scripts that run it, nor any of doctor's 0-3.
pub const USAGE_EXIT: i32 = 64;

/// Parse this process's arguments: with clap's message and `USAGE_EXIT`
/// when they are wrong, or after --help/--version (exit 0).
pub fn parse() -> Cli {
    command().try_get_matches().and_then(|m| Cli::from_arg_matches(&m)).unwrap_or_else(|e| {
        if !e.use_stderr() {
            e.exit();
        }
        let _ = e.print();
        std::process::exit(USAGE_EXIT)
    })
}

pub fn try_parse_from(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>,
) -> Result<Cli, clap::Error> {
    Cli::from_arg_matches(&command().try_get_matches_from(args)?)
}
