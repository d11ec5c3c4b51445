//! The daemon: attach probes, collect every interval, serve metrics.
//! `run` takes its shutdown signal as an argument (as mini-redis does), so
//! tests can run the whole daemon in-process and stop it.
use std::{
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use observer_common::{capacity, lost};
use tracing::{info, warn};

use crate::{
    attribution::Attributor,
    collect::{Collector, sock_diag},
    error::Error,
    export::{self, Limits, Metrics, SeriesStore, Shared, http, otlp, otlp::OtlpConfig},
    probes::{AttachMode, Attachment, Probes, ProgramHandle, hooks::Mode},
};

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
    fn default() -> Self {
        Self {
            prometheus_listen: "127.0.0.1:9464".parse().expect("valid address"),
            interval: Duration::from_secs(5),
            grace: Duration::from_secs(120),
            attach_mode: AttachMode::Auto,
            limits: Limits::default(),
            max_sockets: capacity::SOCK_OWNERS,
            proc_root: PathBuf::from("/proc"),
            kernel_btf: PathBuf::from(crate::probes::offsets::VMLINUX_BTF),
            cgroup_root: None,
            pod_logs: PathBuf::from("/var/log/pods"),
            otlp: None,
        }
    }
}

impl RunConfig {
    /// The settings as a configuration file (`observer run --dry-run`);
    /// header values are hidden, they are usually credentials.
    pub fn to_toml(&self) -> String {
        let otlp = match &self.otlp {
            None => "# otlp-endpoint: not set, no OTLP push\n".to_string(),
            Some(o) => format!(
                "otlp-endpoint = \"{}\"\notlp-protocol = \"{}\"\notlp-headers = \"{}\"\notlp-timeout = \"{}\"\n\
                 otlp-interval = \"{}\"\notlp-temporality = \"{}\"\n{}",
                o.endpoint,
                o.protocol,
                o.headers.iter().map(|(k, _)| format!("{k}=<hidden>")).collect::<Vec<_>>().join(","),
                humantime::format_duration(o.timeout),
                humantime::format_duration(o.interval),
                o.temporality,
                o.certificate.as_ref().map(|c| format!("otlp-certificate = \"{}\"\n", c.display())).unwrap_or_default(),
            ),
        };
        format!(
            "prometheus-listen = \"{}\"\ninterval = \"{}\"\ngrace = \"{}\"\nattach-mode = \"{}\"\n\
             max-processes = {}\nmax-destinations = {}\nmax-sockets = {}\nproc-root = \"{}\"\nkernel-btf = \"{}\"\n{}pod-logs = \"{}\"\n",
            self.prometheus_listen,
            humantime::format_duration(self.interval),
            humantime::format_duration(self.grace),
            self.attach_mode,
            self.limits.max_processes,
            self.limits.max_destinations,
            self.max_sockets,
            self.proc_root.display(),
            self.kernel_btf.display(),
            match &self.cgroup_root {
                Some(root) => format!("cgroup-root = \"{}\"\n", root.display()),
                None => "# cgroup-root: not set, the cgroup2 mount in /proc/self/mountinfo\n".to_string(),
            },
            self.pod_logs.display(),
        ) + &otlp
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

    let state: Shared = Arc::new(Mutex::new(export::State {
        series: SeriesStore::new(config.limits),
        attachments,
        ..Default::default()
    }));
    let metrics = Arc::new(Metrics::new(state.clone(), push_reader)?);
    let (stop_push, push_stopped) = tokio::sync::watch::channel(false);
    let pushing = pusher.map(|p| tokio::spawn(p.run(state.clone(), push_stopped)));

    // The collector does blocking work (map syscalls, a namespace-entering
    // thread for sock_diag), so it runs on its own thread; the channel both
    // paces it and tells it to stop.
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let attributor = Attributor::new(&config.proc_root, config.cgroup_root.clone(), config.pod_logs.clone());
    let mut collector = Collector::new(maps, config.proc_root.clone(), attributor);
    let programs = probes.programs.clone();
    let (interval, grace, proc_root) = (config.interval, config.grace, config.proc_root.clone());
    let collecting = std::thread::Builder::new()
        .name("observer-collect".into())
        .spawn(move || collect_loop(&mut collector, &programs, &state, interval, grace, &proc_root, &stop_rx))
        .map_err(|e| Error::Export(format!("cannot start the collector thread: {e}")))?;

    info!(address = %config.prometheus_listen, interval = ?interval, "serving /metrics, /healthz, /readyz");
    let served = http::serve(listener, metrics.clone(), shutdown).await;
    // Stop in order: the collector reads the kernel one last time, then the
    // final OTLP push carries those counts.
    let _ = stop_tx.send(());
    let collected = tokio::task::spawn_blocking(move || collecting.join().unwrap_or(Ok(()))).await.unwrap_or(Ok(()));
    let _ = stop_push.send(true);
    if let Some(pushing) = pushing {
        let _ = pushing.await;
    }
    metrics.shutdown();
    drop(probes);
    served.map_err(|e| Error::Export(format!("metrics endpoint failed: {e}")))?;
    collected
}

fn collect_loop(
    collector: &mut Collector,
    programs: &[ProgramHandle],
    state: &Shared,
    interval: Duration,
    grace: Duration,
    proc_root: &std::path::Path,
    stop: &mpsc::Receiver<()>,
) -> Result<(), Error> {
    let mut failing = false;
    let mut stopping = false;
    let mut port_trend = crate::ceilings::trend::PortTrend::default();
    loop {
        let started = Instant::now();
        let node = NodeReading::read(proc_root, state, &mut port_trend, started);
        let dumped: Vec<_> = node.listeners.iter().map(|(_, l)| *l).collect();
        match collector.collect_with_listeners(started, grace, &dumped) {
            Ok(deltas) => {
                failing = false;
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                publish(&mut st, deltas, node, programs);
                st.collection_seconds = started.elapsed().as_secs_f64();
            }
            Err(e) => {
                state.lock().unwrap_or_else(|p| p.into_inner()).collection_failures += 1;
                // One log line per failure streak, not one per interval.
                if !failing {
                    warn!(error = %e, "collection failed; will retry every interval");
                    failing = true;
                }
            }
        }
        if stopping {
            return Ok(());
        }
        let next = interval.saturating_sub(started.elapsed());
        // Asked to stop: one more round, so the counts since the last one
        // reach the final export.
        stopping = !matches!(stop.recv_timeout(next), Err(mpsc::RecvTimeoutError::Timeout));
        if stopping {
            collector.last_round();
        }
    }
}

/// What a round reads of the node besides the kernel maps, outside the
/// exporters' lock: every namespace's ceilings and listeners (one pass),
/// and the open files of the processes that had series at the last round.
struct NodeReading {
    ceilings: Vec<(String, crate::ceilings::usage::NetnsUsage)>,
    listeners: Vec<(String, sock_diag::Listener)>,
    open_files: Vec<(export::series::Who, crate::ceilings::files::OpenFiles)>,
}

impl NodeReading {
    fn read(
        proc_root: &std::path::Path,
        state: &Shared,
        trend: &mut crate::ceilings::trend::PortTrend,
        now: Instant,
    ) -> Self {
        let sweep = crate::ceilings::sweep(proc_root);
        let listeners = sweep.iter().flat_map(|n| n.listeners.iter().map(|l| (n.name.clone(), *l))).collect();
        let mut ceilings: Vec<_> = sweep.into_iter().filter_map(|n| Some((n.name, n.usage?))).collect();
        trend.update(now, &mut ceilings, export::TOP_DESTINATIONS);
        let processes: Vec<_> = state.lock().unwrap_or_else(|p| p.into_inner()).series.processes().collect();
        Self { ceilings, listeners, open_files: open_files_of(proc_root, processes) }
    }
}

/// Hand a round's results to the exporters.
fn publish(st: &mut export::State, deltas: crate::collect::Deltas, node: NodeReading, programs: &[ProgramHandle]) {
    st.series.apply(&deltas);
    st.lost = vec![
        ("PROC_COUNTERS", deltas.lost[lost::PROC_COUNTERS_FULL as usize]),
        ("CONNECT_ERRORS", deltas.lost[lost::CONNECT_ERRORS_FULL as usize]),
        ("INFLIGHT_CONNECTS", deltas.lost[lost::INFLIGHT_FULL as usize]),
    ];
    // Cumulative in the kernel: read as is, no delta needed.
    st.missed = programs.iter().filter_map(|p| p.stats().ok().map(|s| (p.hook, p.program, s.missed))).collect();
    // Owners whose pod labels are still being looked up are named from
    // the next round on, labels and all.
    st.listener_owners = deltas
        .listener_owners
        .iter()
        .filter_map(|(cookie, owner)| {
            let pod = deltas.pods.get(&crate::collect::pod_key(owner))?.clone();
            let who = export::series::Who::Process { pid: owner.tgid, name: owner.comm_str().into(), pod };
            Some((*cookie, who))
        })
        .collect();
    st.map_fill = deltas.map_fill;
    st.ceilings = node.ceilings;
    st.listeners = node.listeners;
    st.open_files = node.open_files;
}

/// Open files of each process; a process already gone has none to report.
fn open_files_of(
    proc_root: &std::path::Path,
    processes: Vec<(u32, Option<Arc<crate::attribution::PodLabels>>)>,
) -> Vec<(export::series::Who, crate::ceilings::files::OpenFiles)> {
    processes
        .into_iter()
        .filter_map(|(pid, pod)| {
            let files = crate::ceilings::files::of_process(proc_root, pid)?;
            Some((export::series::Who::Process { pid, name: files.name.clone(), pod }, files))
        })
        .collect()
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
