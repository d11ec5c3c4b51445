//! `observer top`: the live view, for the human deciding what to cut.
use std::{io::IsTerminal as _, time::Duration};

use clap::Args;

use crate::top::{
    Source, screen,
    table::{self, SortBy},
};

/// A live ranking of the processes (with their pods) and destinations
/// behind the avalanche signals, refreshed every second, like top: per
/// second, EADDRNOTAVAIL and other connect() failures, sockets entering
/// TIME_WAIT, listen overflows, connects and accepts.
///
/// It reads a running observer's Prometheus endpoint (`observer run`, or
/// the DaemonSet's pod: `kubectl exec ... -- observer top`), so it costs
/// the node nothing more. Keys: e, r, t, o, c, a sort by the column of
/// that letter; q (or Esc, Ctrl-C) quits. Not on a terminal (or with
/// --once) it prints the table once, after one interval, and exits.
///
/// Example: `observer top --from http://127.0.0.1:9464 --sort connects`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// The daemon's endpoint (its --prometheus-listen address).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:9464")]
    pub from: String,

    /// Print the table once (two readings, one interval apart) and exit.
    #[arg(long)]
    pub once: bool,

    /// The order rows start in.
    #[arg(long, value_enum, default_value = "eaddrnotavail")]
    pub sort: SortBy,

    /// Time between readings (e.g. 1s, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,

    /// Rows of each section in the printed table.
    #[arg(long, value_name = "N", default_value = "20")]
    pub rows: usize,
}

impl TopArgs {
    /// Run the view (or print once); an endpoint that cannot be read at
    /// the start is an error, later ones are shown in the view.
    pub fn run(self) -> Result<(), String> {
        let source = Source::new(&self.from)?;
        let interval = self.interval.max(Duration::from_millis(100));
        if self.once || !std::io::stdout().is_terminal() {
            let before = source.read().map_err(|e| format!("reading {}: {e}", source.url()))?;
            std::thread::sleep(interval);
            let after = source.read().map_err(|e| format!("reading {}: {e}", source.url()))?;
            print!("{}", table::render(&after.rates_since(&before), self.sort, self.rows));
            return Ok(());
        }
        source.read().map_err(|e| format!("reading {} (is observer running there?): {e}", source.url()))?;
        let url = source.url().to_string();
        screen::run(|| source.read(), self.sort, interval, url).map_err(|e| format!("the terminal: {e}"))
    }
}
