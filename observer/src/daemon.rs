//! The daemon: attach probes, collect every interval, serve metrics.
//! `run` takes its shutdown signal as an argument (as mini-redis does), so
//! tests can run the whole daemon in-process and stop it.
use std::{
    future::Future,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use tracing::{info, warn};

use crate::{
    config::RunConfig,
    error::Error,
    export::{ExportStats, Metrics, http, otlp},
    health::{CollectorState, Health},
    node::sock_diag,
    probes::Probes,
    round::Rounds,
    snapshot::Published,
};

pub async fn run(config: RunConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), Error> {
    let listener = http::bind(config.prometheus_listen).await?;
    // Like the port, a bad OTLP setting is reported before any eBPF loads.
    let push_reader = config.otlp.as_ref().map(|o| o.reader());
    let pusher = match (&config.otlp, &push_reader) {
        (Some(otlp), Some(reader)) => Some(otlp::Pusher::new(otlp.clone(), reader.clone())?),
        _ => None,
    };
    let (probes, mut rounds) = attach(&config)?;
    let attachments = probes.attachments.clone();

    let published = Arc::new(Published::default());
    published.update(|s| s.kernel.attachments.clone_from(&attachments));
    let stats = Arc::new(ExportStats::default());
    let metrics =
        Arc::new(Metrics::new(published.clone(), stats.clone(), push_reader, config.limits.series_ceiling())?);
    let (stop_push, push_stopped) = tokio::sync::watch::channel(false);
    let pushing = pusher.map(|p| tokio::spawn(p.run(stats, push_stopped)));

    // A round does blocking work (map syscalls, a namespace-entering
    // thread for sock_diag), so rounds run on their own thread; the channel
    // both paces it and tells it to stop.
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let interval = config.interval;
    let health = Arc::new(Health::new(published.clone(), interval));
    let (guard, collector) = health.collector_guard();
    // Not joined: `collector` says when it ends (a thread stuck on a hung
    // filesystem must not hold the process at exit).
    std::thread::Builder::new()
        .name("observer-collect".into())
        .spawn({
            let published = published.clone();
            let durations = metrics.round_durations();
            move || {
                let _guard = guard;
                collect_loop(&mut rounds, &published, &durations, interval, &stop_rx);
            }
        })
        .map_err(|source| Error::System { what: "start the collector thread", source })?;

    info!(address = %config.prometheus_listen, interval = ?interval, "serving /metrics, /healthz, /readyz");
    let stopped = serve_until(listener, metrics.clone(), health, shutdown, collector.clone()).await;
    // Stop in order: the collector reads the kernel one last time, then the
    // final OTLP push carries those counts. A collector stuck on a hung
    // filesystem is not waited for past `LAST_ROUND`.
    let _ = stop_tx.send(());
    let mut collector = collector;
    let ended = tokio::time::timeout(LAST_ROUND, collector.wait_for(|c| *c != CollectorState::Running)).await;
    let last_round = match ended.map(|r| r.map(|c| *c)) {
        Ok(Ok(CollectorState::Ended)) => Ok(()),
        Ok(_) => Err(Error::CollectorGone),
        Err(_) => {
            warn!("the last collection round did not end within {LAST_ROUND:?}: exiting without its counts");
            Err(Error::CollectorStuck { waited: LAST_ROUND })
        }
    };
    let _ = stop_push.send(true);
    if let Some(pushing) = pushing {
        let _ = pushing.await;
    }
    metrics.shutdown();
    drop(probes);
    match stopped {
        Stopped::Asked => last_round,
        Stopped::CollectorGone => Err(Error::CollectorGone),
    }
}

/// The programs attached and the rounds that read them, as the daemon and
/// `observer top`'s own reading (`top::own`) both start them: the open
/// files limit raised for the sweep, sock_diag checked, the TIME_WAIT
/// check left out where the kernel cannot back it.
pub fn attach(config: &RunConfig) -> Result<(Probes, Rounds), Error> {
    raise_open_files_limit(config.max_namespaces);
    let (probes, maps) =
        Probes::load_with_btf(config.attach_mode, &config.kernel_btf, config.max_sockets, &config.proc_root)?;
    check_sock_diag()?;
    let mut rounds = Rounds::new(maps, probes.attachments.clone(), probes.programs.clone(), config);
    if !probes.time_wait_counted_at_entry {
        warn!(
            "this kernel counts TIME_WAIT sockets in TcpExtTW/TcpExtTWKilled only when they end (inet_timewait_sock \
             has tw_kill, as 5.10's does): observer cannot check its count of TIME_WAIT entries against the \
             kernel's, so observer_kernel_unseen_events_total is not exported"
        );
        rounds.without_time_wait_check();
    }
    Ok((probes, rounds))
}

/// How long shutdown waits for the last round.
const LAST_ROUND: Duration = Duration::from_secs(5);

/// Why the endpoint stopped serving.
#[derive(Debug, PartialEq, Eq)]
enum Stopped {
    /// SIGTERM/SIGINT (the `shutdown` future).
    Asked,
    /// The collector thread ended on its own: nothing is counted any more,
    /// so the daemon ends with an error and the DaemonSet restarts it.
    CollectorGone,
}

/// Serve until asked to stop or until the collector thread is gone.
async fn serve_until(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    mut collector: tokio::sync::watch::Receiver<CollectorState>,
) -> Stopped {
    let (why_tx, why) = tokio::sync::oneshot::channel();
    let stop = async move {
        let stopped = tokio::select! {
            () = shutdown => Stopped::Asked,
            _ = collector.wait_for(|c| *c != CollectorState::Running) => {
                tracing::error!("the collector thread has ended: stopping, so that observer is restarted");
                Stopped::CollectorGone
            }
        };
        let _ = why_tx.send(stopped);
    };
    http::serve(listener, metrics, health, stop).await;
    why.await.unwrap_or(Stopped::Asked)
}

/// A round every interval until asked to stop, then one more, so the
/// counts since the last one reach the final export.
fn collect_loop(
    rounds: &mut Rounds,
    published: &Published,
    durations: &opentelemetry::metrics::Histogram<f64>,
    interval: Duration,
    stop: &mpsc::Receiver<()>,
) {
    let mut failing = false;
    let mut stopping = false;
    loop {
        let started = Instant::now();
        // The tests' way to end this thread as a bug would (tests/health.rs).
        fail::fail_point!("collector-round");
        match rounds.run(started) {
            Ok(round) => {
                failing = false;
                durations.record(round.snapshot.rounds.seconds, &[]);
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

/// A margin of open files for everything but the namespaces' files.
const FILES_BESIDES: u64 = 1024;

/// The sweep holds files open in every namespace it reads: raise the soft
/// RLIMIT_NOFILE to the hard one (allowed without any capability), and say
/// so when even that is short of what --max-namespaces may need.
fn raise_open_files_limit(max_namespaces: usize) {
    use crate::node::sweep::FILES_PER_NAMESPACE;
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_err() {
        warn!(soft, hard, "cannot raise the open files limit (RLIMIT_NOFILE) to its hard limit");
    }
    let needed = max_namespaces as u64 * FILES_PER_NAMESPACE + FILES_BESIDES;
    if hard < needed {
        warn!(
            limit = hard,
            needed,
            "the open files limit may be short for --max-namespaces (each namespace holds {FILES_PER_NAMESPACE} \
             files open): namespaces beyond it are counted in observer_network_namespace_usage{{observer_reading=\"unread\"}}; raise \
             the hard RLIMIT_NOFILE (LimitNOFILE=, ulimit -Hn) or lower --max-namespaces"
        );
    }
}

/// The sweep reads listeners and sockets through sock_diag (and, where no
/// overflow hook attached, the listeners' drop counters): make sure it
/// answers here before starting.
fn check_sock_diag() -> Result<(), Error> {
    sock_diag::DiagSocket::open()
        .and_then(|mut diag| diag.listeners(0))
        .map(|_| ())
        .map_err(|e| Error::Attach { hook: "sock_diag", tried: format!("NETLINK_SOCK_DIAG: {e}") })
}
