//! The exporters' own counts (`observer_export_*{exporter}`): written by
//! the exporters as they scrape and push, not by the collection round.
use std::{collections::BTreeMap, sync::Mutex};

/// One exporter's attempts and what became of them.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExportCounts {
    pub attempts: u64,
    pub failures: u64,
    /// Batches waiting to be sent (OTLP only).
    pub pending: u64,
    /// Delta batches dropped because `otlp::MAX_PENDING` were waiting.
    pub dropped: u64,
}

/// By exporter: "prometheus" (scrapes), "otlp" (pushes).
#[derive(Default)]
pub struct ExportStats(Mutex<BTreeMap<&'static str, ExportCounts>>);

impl ExportStats {
    pub fn update(&self, exporter: &'static str, f: impl FnOnce(&mut ExportCounts)) {
        f(self.0.lock().unwrap_or_else(|p| p.into_inner()).entry(exporter).or_default());
    }

    pub fn all(&self) -> BTreeMap<&'static str, ExportCounts> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
