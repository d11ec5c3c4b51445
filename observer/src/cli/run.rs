//! `observer run`: the daemon.
use std::path::PathBuf;

use clap::Args;

use crate::{config::Settings, error::Error};

/// Attach the probes and serve metrics until SIGINT/SIGTERM.
///
/// Example: `observer run --prometheus-listen 0.0.0.0:9464 --interval 10s`,
/// then `curl localhost:9464/metrics | grep observer_tcp_connect_errors_total`
/// shows who fails to connect, to where, with which errno.
///
/// Every setting comes from, in order: its flag, its environment variable,
/// the configuration file (--config; its keys are the flag names, e.g.
/// `interval = "10s"`), the default. `--dry-run` prints the result.
///
/// OTLP push is on when an endpoint is set (--otlp-endpoint or the standard
/// OTEL_EXPORTER_OTLP_ENDPOINT); the Prometheus endpoint always serves.
/// Example: `observer run --otlp-endpoint http://otel-collector:4317
/// --otlp-protocol grpc`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Configuration file (TOML), checked whole at start: an unknown key or
    /// a bad value is an error naming the key and the line.
    #[arg(long, value_name = "FILE", env = "OBSERVER_CONFIG")]
    pub config: Option<PathBuf>,

    /// Check the configuration, print the settings in effect (as a
    /// configuration file) and exit, without loading anything.
    #[arg(long)]
    pub dry_run: bool,

    #[command(flatten)]
    pub settings: Settings,
}

impl RunArgs {
    /// The settings in effect: flag or environment (clap has already
    /// preferred the flag), else the file, else the default.
    pub fn settings(self) -> Result<Settings, Error> {
        Settings::load(self.settings, self.config.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        cli::{Cli, Command},
        probes::AttachMode,
    };

    fn parse(args: &[&str]) -> Result<RunArgs, String> {
        let mut argv = vec!["observer", "run"];
        argv.extend_from_slice(args);
        match crate::cli::try_parse_from(argv) {
            Ok(Cli { command: Command::Run(a) }) => Ok(*a),
            Ok(other) => Err(format!("not `run`: {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let c = parse(&[]).unwrap().settings().unwrap().resolve();
        assert_eq!(c.prometheus_listen, "127.0.0.1:9464".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.attach_mode, AttachMode::Auto);
    }

    #[test]
    fn durations_parse_and_are_bounded() {
        let interval = parse(&["--interval", "500ms"]).unwrap().settings.interval.map(|i| i.0);
        assert_eq!(interval, Some(Duration::from_millis(500)));
        let e = parse(&["--interval", "five"]).unwrap_err();
        assert!(e.contains("not a duration"), "{e}");
        let e = parse(&["--interval", "1ms"]).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn bad_address_and_mode_are_rejected() {
        let e = parse(&["--prometheus-listen", "localhost"]).unwrap_err();
        assert!(e.contains("--prometheus-listen"), "{e}");
        let e = parse(&["--attach-mode", "uprobe"]).unwrap_err();
        assert!(e.contains("possible values"), "{e}");
    }

    /// `--help` shows each default, taken from the one place they are
    /// written (config.rs).
    #[test]
    fn help_shows_the_defaults() {
        let mut cmd = crate::cli::command();
        let run = cmd.find_subcommand_mut("run").unwrap();
        let help = run.render_help().to_string();
        for want in [
            "[default: 127.0.0.1:9464]",
            "[default: 5s]",
            "[default: 2m]",
            "[default: 65536]",
            "[default: no OTLP push]",
        ] {
            assert!(help.contains(want), "{want} missing:\n{help}");
        }
    }
}
