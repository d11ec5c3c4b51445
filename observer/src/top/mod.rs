//! `observer top`: a live ranking of processes and destinations by the
//! avalanche signals, read from a running daemon's Prometheus endpoint
//! (what the node's DaemonSet serves): per-second rates between two
//! readings.
pub mod reading;
pub mod screen;
pub mod table;

use std::time::{Duration, Instant};

use reading::Reading;

/// Reads a daemon's /metrics.
pub struct Source {
    url: String,
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl Source {
    /// `from`: the daemon's endpoint, `http://HOST:PORT` (its /metrics) or
    /// the full URL of the page.
    pub fn new(from: &str) -> Result<Self, String> {
        let url = url::Url::parse(from).map_err(|e| format!("--from {from}: {e}"))?;
        if url.scheme() != "http" {
            return Err(format!("--from {from}: observer's endpoint speaks http (http://HOST:PORT)"));
        }
        let url = if url.path() == "/" { url.join("/metrics").map_err(|e| e.to_string())? } else { url };
        // reqwest is built without a TLS provider of its own (see
        // export/otlp.rs); plain http needs one installed all the same.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| format!("an HTTP client: {e}"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a tokio runtime: {e}"))?;
        Ok(Self { url: url.to_string(), client, runtime })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// One reading, now.
    pub fn read(&self) -> Result<Reading, String> {
        let body = self.runtime.block_on(async {
            let response = self.client.get(&self.url).send().await.map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("HTTP {}", response.status()));
            }
            response.text().await.map_err(|e| e.to_string())
        })?;
        Reading::parse(&body, Instant::now())
    }
}
