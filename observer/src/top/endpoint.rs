//! A running daemon's Prometheus endpoint, read over HTTP: what the node's
//! DaemonSet serves, so reading it costs the node nothing more (`observer
//! top`, and doctor for what only the daemon knows).
use std::time::{Duration, Instant};

use super::reading::Reading;

/// Where `observer run` serves by default (config.rs's
/// `prometheus_listen`), and so where top looks first.
pub fn default_url() -> String {
    format!("http://{}", crate::config::RunConfig::default().prometheus_listen)
}

/// Reads a daemon's /metrics.
pub struct Endpoint {
    url: String,
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl Endpoint {
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
        Reading::parse(&self.page()?, Instant::now())
    }

    /// The page, as the daemon serves it now.
    pub fn page(&self) -> Result<String, String> {
        self.runtime.block_on(async {
            let response = self.client.get(&self.url).send().await.map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("HTTP {}", response.status()));
            }
            response.text().await.map_err(|e| e.to_string())
        })
    }
}
