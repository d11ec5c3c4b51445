//! `observer top`: the live view, for the human deciding what to cut.
use std::{io::IsTerminal as _, time::Duration};

use clap::Args;

use crate::top::{
    Source, Wanted, screen,
    table::{self, SortBy},
};

/// A live ranking of the processes (with their pods) and destinations
/// behind the avalanche signals, refreshed every second, like top: per
/// second, EADDRNOTAVAIL and other connect() failures, sockets entering
/// TIME_WAIT, listen overflows, connects and accepts.
///
/// It reads a running observer's Prometheus endpoint (`observer run`, or
/// the DaemonSet's pod: `kubectl exec ... -- observer top`), so it costs
/// the node nothing more: the one at --from, else the local one at
/// http://127.0.0.1:9464 when it answers. Where no observer runs (or with
/// --own) it attaches its own programs as `observer run` would, with its
/// privileges (root; short of them, the error names the capabilities
/// missing), counting from its start. Keys: e, r, t, o, c, a sort by the
/// column of that letter; q (or Esc, Ctrl-C) quits. Not on a terminal (or
/// with --once) it prints the table once, after one interval, and exits.
///
/// Examples: `observer top`; `observer top --from http://10.0.0.7:9464
/// --sort connects`; `observer top --own --once`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// The daemon's endpoint to read (its --prometheus-listen address);
    /// an error when it cannot be read. Without it: the local daemon at
    /// http://127.0.0.1:9464 if one answers, else top's own programs.
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,

    /// Attach top's own programs, even where a daemon runs (they count
    /// from top's start; the daemon's counts are not read).
    #[arg(long, conflicts_with = "from")]
    pub own: bool,

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
        let interval = self.interval.max(Duration::from_millis(100));
        let wanted = match (&self.from, self.own) {
            (Some(from), _) => Wanted::Daemon(from),
            (None, true) => Wanted::Own,
            (None, false) => Wanted::Either,
        };
        let mut source = Source::open(wanted, interval)?;
        let described = source.describe();
        if self.once || !std::io::stdout().is_terminal() {
            let before = source.read().map_err(|e| format!("reading {described}: {e}"))?;
            std::thread::sleep(interval);
            let after = source.read().map_err(|e| format!("reading {described}: {e}"))?;
            print!("{}", table::render(&after.rates_since(&before), self.sort, self.rows, &described));
            return Ok(());
        }
        screen::run(|| source.read(), self.sort, interval, described).map_err(|e| format!("the terminal: {e}"))
    }
}
