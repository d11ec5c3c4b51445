//! The endpoint's connections, bounded whatever the clients do: any pod
//! may reach the metrics port (the DaemonSet binds it on the pod network),
//! so a client that never finishes its request, never reads its answer or
//! opens thousands of connections must not cost the daemon its memory, its
//! scrapes or its shutdown.
//!
//! - A request's headers must arrive within `HEADER_TIMEOUT` and fit in
//!   `MAX_HEADER_BYTES` (hyper answers 431 beyond and closes).
//! - At most `MAX_CONNECTIONS` are open. A new one at the cap takes the
//!   place of the oldest connection that has not sent a whole request yet
//!   (a client that never finishes its headers), else of the oldest one
//!   between requests (an idle keep-alive, or a client that does not read
//!   its answer: the answer is hyper's to write by then), else of one whose
//!   request has been in the handler for longer than `ANSWER_TIMEOUT`; only
//!   when every connection is serving a fresh request is the new one
//!   refused. A scraper sends its request at once, so a flood of clients
//!   that never finish does not take its place.
//! - On shutdown, requests in flight get `SHUTDOWN_GRACE`, then every
//!   connection is closed: shutdown never waits on a client.
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, body::Body, response::Response};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, task::JoinSet};
use tower::ServiceExt as _;

/// Prometheus servers keep one connection each; the rest of the room is
/// headroom, so that a client that does send its request is read long
/// before it could become the oldest (~20 KiB of memory each at most).
pub const MAX_CONNECTIONS: usize = 512;
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Connections the cap closed to make room, and new ones it refused
/// (`observer_http_connections_closed_total{reason}`).
#[derive(Default)]
pub struct ConnectionStats {
    pub evicted: AtomicU64,
    pub refused: AtomicU64,
}

/// What a connection is doing, for `make_room`.
#[derive(Default)]
struct Activity {
    /// Since when a request is in the handler (ms since the endpoint's
    /// start, at least 1); 0 when none is.
    busy_since: AtomicU64,
    /// Requests received whole so far.
    requests: AtomicU64,
}

struct Open {
    task: tokio::task::Id,
    abort: tokio::task::AbortHandle,
    activity: Arc<Activity>,
}

/// Serve `app` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    stats: Arc<ConnectionStats>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let epoch = Instant::now();
    let mut warned_at: Option<Instant> = None;
    let mut tasks = JoinSet::new();
    // Oldest first.
    let mut open: Vec<Open> = Vec::new();
    let mut accept_failing = false;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let id = match done { Ok((id, ())) => id, Err(e) => e.id() };
                open.retain(|c| c.task != id);
            }
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => { accept_failing = false; stream }
                    Err(e) => {
                        // EMFILE and the like: the open connections are
                        // bounded, so this passes; do not spin meanwhile.
                        if !accept_failing {
                            tracing::warn!(error = %e, "metrics endpoint cannot accept connections; retrying");
                            accept_failing = true;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if open.len() >= MAX_CONNECTIONS {
                    // One line a minute at most while at the cap.
                    if warned_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                        tracing::warn!(
                            "metrics endpoint at its cap of {MAX_CONNECTIONS} open connections (clients that never \
                             finish a request?): closing the oldest without a request to make room; \
                             observer_http_connections_closed_total counts them"
                        );
                        warned_at = Some(Instant::now());
                    }
                    if make_room(&mut open, epoch) {
                        stats.evicted.fetch_add(1, Ordering::Relaxed);
                    } else {
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        continue; // `stream` is dropped: the client sees a close
                    }
                }
                let activity = Arc::new(Activity::default());
                let abort = tasks.spawn(connection(stream, app.clone(), activity.clone(), epoch));
                open.push(Open { task: abort.id(), abort, activity });
            }
        }
    }
    // In-flight answers get a moment; then every connection is closed.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while open.iter().any(|c| c.activity.busy_since.load(Ordering::Relaxed) != 0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// Close one connection to make room for a new one (see the module's
/// comment for which); false if every connection serves a fresh request.
fn make_room(open: &mut Vec<Open>, epoch: Instant) -> bool {
    let now = epoch.elapsed().as_millis() as u64;
    let busy_since = |c: &Open| c.activity.busy_since.load(Ordering::Relaxed);
    let unfinished = |c: &Open| c.activity.requests.load(Ordering::Relaxed) == 0 && busy_since(c) == 0;
    let victim =
        open.iter().position(unfinished).or_else(|| open.iter().position(|c| busy_since(c) == 0)).or_else(|| {
            let (i, oldest) = open.iter().enumerate().min_by_key(|(_, c)| busy_since(c))?;
            (now.saturating_sub(busy_since(oldest)) > ANSWER_TIMEOUT.as_millis() as u64).then_some(i)
        });
    match victim {
        Some(i) => {
            open.remove(i).abort.abort();
            true
        }
        None => false,
    }
}

async fn connection(stream: tokio::net::TcpStream, app: Router, activity: Arc<Activity>, epoch: Instant) {
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let busy = Busy::enter(&activity, epoch);
        let app = app.clone();
        async move {
            let response: Response = app.oneshot(request.map(Body::new)).await.unwrap_or_else(|e| match e {});
            drop(busy);
            Ok::<_, Infallible>(response)
        }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "metrics endpoint connection ended");
    }
}

/// Marks the connection busy while its request is in the handler.
struct Busy(Arc<Activity>);

impl Busy {
    fn enter(activity: &Arc<Activity>, epoch: Instant) -> Self {
        activity.requests.fetch_add(1, Ordering::Relaxed);
        activity.busy_since.store((epoch.elapsed().as_millis() as u64).max(1), Ordering::Relaxed);
        Self(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy_since.store(0, Ordering::Relaxed);
    }
}
