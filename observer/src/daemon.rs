//! The daemon: attach probes, collect every interval, serve metrics.
//! `run` takes its shutdown signal as an argument (as mini-redis does), so
//! tests can run the whole daemon in-process and stop it.
use std::{
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use tracing::{info, warn};

use crate::{
    error::Error,
    export::{ExportStats, Metrics, http, otlp, otlp::OtlpConfig},
    node::sock_diag,
    probes::{AttachMode, Attachment, Probes, hooks::Mode},
    round::{RoundSettings, Rounds},
    series::Limits,
    snapshot::Published,
};

/// The settings the daemon runs with, typed; made from the merged
/// `config::Settings` (`Settings::resolve`), where each one is defined.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub prometheus_listen: SocketAddr,
    pub interval: Duration,
    pub grace: Duration,
    pub attach_mode: AttachMode,
    pub limits: Limits,
    /// Capacity of the socket-owner map (SOCK_OWNERS).
    pub max_sockets: u32,
    /// The host's /proc (in a container: where the host's /proc is mounted).
    pub proc_root: PathBuf,
    /// The kernel's BTF (its own, or one from BTFHub for older kernels).
    pub kernel_btf: PathBuf,
    /// The cgroup v2 mount (None: found in /proc/self/mountinfo).
    pub cgroup_root: Option<PathBuf>,
    /// kubelet's pod log directory (pod names and namespaces).
    pub pod_logs: PathBuf,
    /// OTLP push, when an endpoint is set.
    pub otlp: Option<OtlpConfig>,
}

impl Default for RunConfig {
    /// Every setting at its default (config.rs has them).
    fn default() -> Self {
        crate::config::Settings::defaults().resolve()
    }
}

impl RunConfig {
    /// What each collection round needs of the settings.
    pub fn round_settings(&self) -> RoundSettings {
        RoundSettings {
            proc_root: self.proc_root.clone(),
            cgroup_root: self.cgroup_root.clone(),
            pod_logs: self.pod_logs.clone(),
            grace: self.grace,
            limits: self.limits,
        }
    }
}

pub async fn run(config: RunConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), Error> {
    let listener = http::bind(config.prometheus_listen).await?;
    // Like the port, a bad OTLP setting is reported before any eBPF loads.
    let push_reader = config.otlp.as_ref().map(|o| o.reader());
    let pusher = match (&config.otlp, &push_reader) {
        (Some(otlp), Some(reader)) => Some(otlp::Pusher::new(otlp.clone(), reader.clone())?),
        _ => None,
    };
    let (probes, maps) = Probes::load_with_btf(config.attach_mode, &config.kernel_btf, config.max_sockets)?;
    let mut attachments = probes.attachments.clone();
    attachments.push(check_sock_diag()?);

    let published = Arc::new(Published::default());
    published.update(|s| s.kernel.attachments.clone_from(&attachments));
    let stats = Arc::new(ExportStats::default());
    let metrics = Arc::new(Metrics::new(published.clone(), stats.clone(), push_reader)?);
    let (stop_push, push_stopped) = tokio::sync::watch::channel(false);
    let pushing = pusher.map(|p| tokio::spawn(p.run(stats, push_stopped)));

    // A round does blocking work (map syscalls, a namespace-entering
    // thread for sock_diag), so rounds run on their own thread; the channel
    // both paces it and tells it to stop.
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let mut rounds = Rounds::new(maps, attachments, probes.programs.clone(), config.round_settings());
    let interval = config.interval;
    let collecting = std::thread::Builder::new()
        .name("observer-collect".into())
        .spawn({
            let published = published.clone();
            move || collect_loop(&mut rounds, &published, interval, &stop_rx)
        })
        .map_err(|source| Error::System { what: "start the collector thread", source })?;

    info!(address = %config.prometheus_listen, interval = ?interval, "serving /metrics, /healthz, /readyz");
    let served = http::serve(listener, metrics.clone(), shutdown).await;
    // Stop in order: the collector reads the kernel one last time, then the
    // final OTLP push carries those counts.
    let _ = stop_tx.send(());
    let _ = tokio::task::spawn_blocking(move || collecting.join()).await;
    let _ = stop_push.send(true);
    if let Some(pushing) = pushing {
        let _ = pushing.await;
    }
    metrics.shutdown();
    drop(probes);
    served.map_err(|source| Error::System { what: "serve the metrics endpoint", source })
}

/// A round every interval until asked to stop, then one more, so the
/// counts since the last one reach the final export.
fn collect_loop(rounds: &mut Rounds, published: &Published, interval: Duration, stop: &mpsc::Receiver<()>) {
    let mut failing = false;
    let mut stopping = false;
    loop {
        let started = Instant::now();
        match rounds.run(started) {
            Ok(round) => {
                failing = false;
                published.publish(round.snapshot);
            }
            Err(e) => {
                let failures = rounds.failures();
                published.update(|s| s.rounds.failures = failures);
                // One log line per failure streak, not one per interval.
                if !failing {
                    warn!(error = %crate::error::report(&e), "collection failed; will retry every interval");
                    failing = true;
                }
            }
        }
        if stopping {
            return;
        }
        let next = interval.saturating_sub(started.elapsed());
        stopping = !matches!(stop.recv_timeout(next), Err(mpsc::RecvTimeoutError::Timeout));
        if stopping {
            rounds.last_round();
        }
    }
}

/// Listen overflows come from sock_diag; make sure it answers here before
/// claiming the hook is attached.
fn check_sock_diag() -> Result<Attachment, Error> {
    match sock_diag::dump_listeners(0) {
        Ok(_) => Ok(Attachment {
            hook: "listen_overflow",
            mode: Mode::SockDiag,
            target: "NETLINK_SOCK_DIAG sk_drops".into(),
            programs: Vec::new(),
        }),
        Err(e) => Err(Error::Attach { hook: "listen_overflow", tried: format!("sock_diag: {e}") }),
    }
}
