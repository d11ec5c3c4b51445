//! top's own programs: the daemon's pipeline in process (the same programs
//! attached, the same rounds, the same instruments), for a node where no
//! daemon runs. Each reading runs one round and reads the instruments as
//! the Prometheus exporter would render them, so both sources go through
//! the one parser (`Reading::parse`) and say the same thing.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::reading::Reading;
use crate::{
    config::RunConfig,
    daemon,
    error::{Error, report},
    export::{ExportStats, Metrics},
    probes::Probes,
    round::Rounds,
    snapshot::Published,
};

pub struct OwnPrograms {
    /// Attached while top runs; detached when dropped.
    probes: Probes,
    rounds: Rounds,
    published: Arc<Published>,
    metrics: Metrics,
}

impl OwnPrograms {
    /// Attach the programs as `observer run` would with its defaults
    /// (attach mode auto), reading the node every `interval`. Counting
    /// starts now: what happened before is not seen.
    pub fn attach(interval: Duration) -> Result<Self, Error> {
        let config = RunConfig { interval, ..RunConfig::default() };
        let (probes, rounds) = daemon::attach(&config)?;
        let published = Arc::new(Published::default());
        published.update(|s| s.kernel.attachments.clone_from(&probes.attachments));
        let metrics =
            Metrics::new(published.clone(), Arc::new(ExportStats::default()), None, config.limits.series_ceiling())?;
        Ok(Self { probes, rounds, published, metrics })
    }

    /// What the view's header names as its source.
    pub fn describe(&self) -> String {
        let modes: std::collections::BTreeSet<String> = self
            .probes
            .attachments
            .iter()
            .filter(|a| a.mode != crate::probes::hooks::Mode::Absent)
            .map(|a| a.mode.to_string())
            .collect();
        format!("its own programs ({})", modes.into_iter().collect::<Vec<_>>().join(", "))
    }

    /// One round, read as a scrape would read it.
    pub fn read(&mut self) -> Result<Reading, String> {
        let now = Instant::now();
        let round = self.rounds.run(now).map_err(|e| report(&e))?;
        self.published.publish(round.snapshot);
        let page = self.metrics.encode().map_err(|e| report(&e))?;
        Reading::parse(&page, now)
    }
}

impl Drop for OwnPrograms {
    fn drop(&mut self) {
        self.metrics.shutdown();
    }
}
