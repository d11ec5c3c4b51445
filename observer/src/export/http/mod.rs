//! The pull endpoint: /metrics (Prometheus text format), /healthz, /readyz,
//! on connections bounded against hostile clients (`connections.rs`).
mod connections;

pub use connections::{ConnectionStats, MAX_CONNECTIONS};

use std::{future::Future, net::SocketAddr, sync::Arc};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio::net::TcpListener;

use super::Metrics;
use crate::{error::Error, health::Health};

/// Connections the kernel queues for the endpoint before it accepts them
/// (the kernel caps it at net.core.somaxconn). Above tokio's 1024: while
/// a flood of clients cycles through `MAX_CONNECTIONS`, a scraper's SYN
/// must find room, not wait for its retransmission a second later.
const BACKLOG: u32 = 4096;

/// Bind first, so a busy port is reported before any eBPF is loaded.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    let listen = || {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        // As std and tokio do: a restarted observer binds despite the
        // previous one's connections in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(BACKLOG)
    };
    listen().map_err(|source| Error::Listen { addr, source })
}

/// Serve until `shutdown` resolves; never waits on a client after that.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let stats = metrics.connection_stats();
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(move || healthz(health.clone())))
        // Ready once serving: the daemon serves only after every hook attached.
        .route("/readyz", get(|| async { "ready\n" }))
        .with_state(metrics);
    connections::serve(listener, app, stats, shutdown).await
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    match metrics.encode() {
        Ok(body) => {
            (StatusCode::OK, [("content-type", "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// 200 while counting goes on, 503 with the reason when it has stopped.
async fn healthz(health: Arc<Health>) -> impl IntoResponse {
    match health.problem() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(problem) => (StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {problem}\n")),
    }
}
