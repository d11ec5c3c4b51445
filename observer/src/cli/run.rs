//! `observer run`: the daemon.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;

use crate::{daemon::RunConfig, export::Limits, probes::AttachMode};

/// Attach the probes and serve metrics until SIGINT/SIGTERM.
///
/// Example: `observer run --prometheus-listen 0.0.0.0:9464 --interval 10s`,
/// then `curl localhost:9464/metrics | grep observer_tcp_connect_errors_total`
/// shows who fails to connect, to where, with which errno.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address of the Prometheus endpoint (/metrics, /healthz, /readyz).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub prometheus_listen: SocketAddr,

    /// How often the kernel counters are read (e.g. 500ms, 5s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_interval)]
    pub interval: Duration,

    /// How long a process's series stay after it exits, so a scrape after a
    /// short-lived client still sees its counts.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_grace)]
    pub grace: Duration,

    /// Force an attach mode for the hooks that have a choice (auto tries
    /// fentry, then kprobe, then tracepoints).
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    pub attach_mode: AttachMode,

    /// Processes that get their own series; more are counted as "other".
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_processes as u32, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_processes: u32,

    /// Destinations (address, port) that get their own series; more are
    /// counted as "other".
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_destinations as u32, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_destinations: u32,

    /// The host's /proc, to find every network namespace (set it when
    /// running in a container with the host's /proc mounted elsewhere).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// The running kernel's BTF; point it at a BTFHub file on kernels built
    /// without CONFIG_DEBUG_INFO_BTF.
    #[arg(long, value_name = "FILE", default_value = crate::probes::offsets::VMLINUX_BTF)]
    pub kernel_btf: PathBuf,
}

impl RunArgs {
    pub fn into_config(self) -> RunConfig {
        RunConfig {
            prometheus_listen: self.prometheus_listen,
            interval: self.interval,
            grace: self.grace,
            attach_mode: self.attach_mode,
            limits: Limits {
                max_processes: self.max_processes as usize,
                max_destinations: self.max_destinations as usize,
            },
            proc_root: self.proc_root,
            kernel_btf: self.kernel_btf,
        }
    }
}

fn parse_duration(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration ({e}); write e.g. 500ms, 5s or 1m"))?;
    if d < min || d > max {
        return Err(format!(
            "{s} is out of range: use between {} and {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_duration(s, Duration::from_millis(100), Duration::from_secs(3600))
}

fn parse_grace(s: &str) -> Result<Duration, String> {
    parse_duration(s, Duration::ZERO, Duration::from_secs(24 * 3600))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<RunArgs, String> {
        let mut argv = vec!["observer", "run"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv) {
            Ok(Cli { command: Command::Run(a) }) => Ok(a),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let c = parse(&[]).unwrap().into_config();
        assert_eq!(c.prometheus_listen, "127.0.0.1:9464".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.attach_mode, AttachMode::Auto);
    }

    #[test]
    fn durations_parse_and_are_bounded() {
        assert_eq!(parse(&["--interval", "500ms"]).unwrap().interval, Duration::from_millis(500));
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
}
