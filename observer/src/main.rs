//! Thin entry point: parse the command line, run, report errors plainly.
use std::process::ExitCode;

use observer::cli::Command;

fn main() -> ExitCode {
    // Test builds only: faults named in FAILPOINTS (see Cargo.toml).
    #[cfg(feature = "failpoints")]
    let _faults = fail::FailScenario::setup();
    let cli = observer::cli::parse();
    // The daemon says what it attached where; doctor prints its report only.
    // trace's stderr is for its own lines, and top's screen is its own
    // (a log line would tear the view): the loader's notes are the daemon's.
    let default_level = match cli.command {
        Command::Run(_) => "info",
        Command::Trace(_) | Command::Top(_) => "error",
        Command::Doctor(_) => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs shipped from a pod or a file must
        // stay greppable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Doctor(args) => {
            return match args.run() {
                Ok(verdict) => ExitCode::from(verdict.exit_code()),
                Err(e) => {
                    eprintln!("error: {}", observer::error::report(&e));
                    ExitCode::from(3)
                }
            };
        }
        Command::Top(args) => {
            return match args.run() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Trace(args) => trace(args.options()),
        Command::Run(args) => {
            let dry_run = args.dry_run;
            match args.settings() {
                Ok(settings) if dry_run => {
                    print!("{}", settings.to_toml());
                    Ok(())
                }
                Ok(settings) => run(settings.resolve()),
                Err(e) => Err(e),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", observer::error::report(&e));
            ExitCode::FAILURE
        }
    }
}

/// `observer trace` until Ctrl-C (or SIGTERM), then its last counts.
fn trace(options: observer::trace::Options) -> Result<(), observer::error::Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| observer::error::Error::System { what: "start the tokio runtime", source })?;
    runtime.block_on(async {
        let shutdown = shutdown_signal()
            .map_err(|source| observer::error::Error::System { what: "handle SIGINT/SIGTERM", source })?;
        let summary = observer::trace::run(options, shutdown).await?;
        eprintln!(
            "observer trace: {} events shown, {} left out (--rate), {} lost (ring buffer full), {} skipped by the \
             kernel{}, {} map entries evicted",
            summary.shown,
            summary.left_out,
            summary.lost,
            summary.skipped,
            if summary.skips_uncounted { " (more uncounted on this kernel)" } else { "" },
            summary.evicted
        );
        Ok(())
    })
}

fn run(config: observer::config::RunConfig) -> Result<(), observer::error::Error> {
    // Two worker threads: the HTTP endpoint is light; collection runs on its
    // own thread (see daemon.rs).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| observer::error::Error::System { what: "start the tokio runtime", source })?;
    runtime.block_on(async {
        let shutdown = shutdown_signal()
            .map_err(|source| observer::error::Error::System { what: "handle SIGINT/SIGTERM", source })?;
        observer::daemon::run(config, shutdown).await
    })
}

/// Resolves on SIGINT or SIGTERM (what Kubernetes sends on pod deletion).
/// SIGHUP, which would otherwise kill the daemon without its final export,
/// is answered with a log line: settings are read at start only, and the
/// counts simply go on (nothing reset, nothing counted twice).
///
/// The handlers are installed now, before anything is loaded, not when
/// the future is first polled: a signal that arrives while the probes load
/// must stop the daemon, not be lost (a shell starts background jobs with
/// SIGINT ignored, so until our handler exists it would vanish).
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    Ok(async move {
        loop {
            tokio::select! {
                _ = interrupt.recv() => break,
                _ = terminate.recv() => break,
                _ = hangup.recv() => tracing::info!(
                    "SIGHUP: nothing to reload, settings are read at start; restart observer to change them \
                     (counting goes on)"
                ),
            }
        }
        tracing::info!("shutting down");
    })
}
