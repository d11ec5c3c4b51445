//! `observer top`: a live ranking of processes and destinations by the
//! avalanche signals: per-second rates between two readings, read from a
//! running daemon's Prometheus endpoint (what the node's DaemonSet serves)
//! or, where none runs, from top's own programs.
pub mod endpoint;
pub mod own;
pub mod reading;
pub mod screen;
pub mod table;

use std::time::Duration;

use endpoint::Endpoint;
use own::OwnPrograms;
use reading::Reading;

/// Where the readings come from.
pub enum Source {
    Daemon(Endpoint),
    Own(Box<OwnPrograms>),
}

/// What the command line asked for.
pub enum Wanted<'a> {
    /// `--from URL`: that daemon, or an error.
    Daemon(&'a str),
    /// `--own`: top's own programs, even beside a daemon.
    Own,
    /// Neither: the local daemon where one answers at its default
    /// address (it costs the node nothing more), else top's own programs.
    Either,
}

impl Source {
    /// The source asked for, checked: a daemon by one reading, top's own
    /// programs by attaching them (an error names what failed).
    pub fn open(wanted: Wanted, interval: Duration) -> Result<Self, String> {
        let own =
            || OwnPrograms::attach(interval).map(|o| Source::Own(Box::new(o))).map_err(|e| crate::error::report(&e));
        match wanted {
            Wanted::Daemon(from) => {
                let endpoint = Endpoint::new(from)?;
                endpoint.read().map_err(|e| format!("reading {} (is observer running there?): {e}", endpoint.url()))?;
                Ok(Source::Daemon(endpoint))
            }
            Wanted::Own => own(),
            Wanted::Either => {
                let endpoint = Endpoint::new(&endpoint::default_url())?;
                match endpoint.read() {
                    Ok(reading) if reading.from_observer => Ok(Source::Daemon(endpoint)),
                    answer => {
                        let why = match answer {
                            Ok(_) => "not an observer's page".to_string(),
                            Err(e) => e,
                        };
                        own().map_err(|e| {
                            format!(
                                "no observer answers at {} ({why}; --from names another), and top cannot attach \
                                 its own programs: {e}",
                                endpoint.url()
                            )
                        })
                    }
                }
            }
        }
    }

    /// One reading, now.
    pub fn read(&mut self) -> Result<Reading, String> {
        match self {
            Source::Daemon(endpoint) => endpoint.read(),
            Source::Own(own) => own.read(),
        }
    }

    /// What the view names as its source.
    pub fn describe(&self) -> String {
        match self {
            Source::Daemon(endpoint) => endpoint.url().to_string(),
            Source::Own(own) => own.describe(),
        }
    }
}
