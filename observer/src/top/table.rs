//! The ranking `observer top` shows: processes sorted by the chosen signal,
//! then the destinations and listeners behind them; as lines of text
//! (`--once`, and the full-screen view's rows alike, so both say the same).
use std::{cmp::Ordering, fmt::Write as _};

use super::reading::{Counts, Rates};

/// What the rows are sorted by (the key that picks it in the view).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// connect() failing with EADDRNOTAVAIL: ephemeral ports exhausted (e).
    Eaddrnotavail,
    /// connect() failures of any errno (r).
    Errors,
    /// Sockets entering TIME_WAIT (t).
    TimeWait,
    /// Listen-queue overflows (o).
    Overflows,
    /// Connects (c).
    Connects,
    /// Accepts (a).
    Accepts,
}

impl SortBy {
    /// The view's key for each order.
    pub fn from_key(key: char) -> Option<SortBy> {
        Some(match key {
            'e' => SortBy::Eaddrnotavail,
            'r' => SortBy::Errors,
            't' => SortBy::TimeWait,
            'o' => SortBy::Overflows,
            'c' => SortBy::Connects,
            'a' => SortBy::Accepts,
            _ => return None,
        })
    }

    fn value(self, c: &Counts) -> f64 {
        match self {
            SortBy::Eaddrnotavail => c.eaddrnotavail,
            SortBy::Errors => c.connect_errors,
            SortBy::TimeWait => c.time_wait,
            SortBy::Overflows => c.overflows,
            SortBy::Connects => c.connects,
            SortBy::Accepts => c.accepts,
        }
    }

    /// The column header it sorts by.
    fn column(self) -> &'static str {
        match self {
            SortBy::Eaddrnotavail => "EADDRNOTAVAIL/s",
            SortBy::Errors => "ERRORS/s",
            SortBy::TimeWait => "TIME_WAIT/s",
            SortBy::Overflows => "OVERFLOWS/s",
            SortBy::Connects => "CONNECTS/s",
            SortBy::Accepts => "ACCEPTS/s",
        }
    }
}

/// Rows with the most first; ties by the next signals, then by name, so
/// the order is stable from one refresh to the next.
fn rank<K: Ord>(rows: &mut [(K, Counts)], by: SortBy) {
    let order = [
        by,
        SortBy::Eaddrnotavail,
        SortBy::Errors,
        SortBy::TimeWait,
        SortBy::Overflows,
        SortBy::Connects,
        SortBy::Accepts,
    ];
    rows.sort_by(|(ka, a), (kb, b)| {
        order
            .iter()
            .map(|s| s.value(b).partial_cmp(&s.value(a)).unwrap_or(Ordering::Equal))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| ka.cmp(kb))
    });
}

/// A rate as shown: one decimal under 10, whole above.
fn rate(n: f64) -> String {
    if n == 0.0 {
        "0".into()
    } else if n < 10.0 {
        format!("{n:.1}")
    } else {
        format!("{n:.0}")
    }
}

const COLUMNS: [SortBy; 6] =
    [SortBy::Eaddrnotavail, SortBy::Errors, SortBy::TimeWait, SortBy::Overflows, SortBy::Connects, SortBy::Accepts];

/// The header line of the process rows; the sorted column marked `*`.
pub fn process_header(by: SortBy) -> String {
    let mut line = format!("{:>8} {:<20} {:<28}", "PID", "PROCESS", "POD");
    for c in COLUMNS {
        let name = if c == by { format!("*{}", c.column()) } else { c.column().to_string() };
        let _ = write!(line, " {name:>16}");
    }
    line
}

/// The process rows, sorted, at most `limit`.
pub fn process_lines(rates: &Rates, by: SortBy, limit: usize) -> Vec<String> {
    let mut rows = rates.processes.clone();
    rank(&mut rows, by);
    rows.iter()
        .take(limit)
        .map(|(p, c)| {
            let mut line = format!("{:>8} {:<20} {:<28}", p.pid, clip(&p.name, 20), clip(&p.pod, 28));
            for column in COLUMNS {
                let _ = write!(line, " {:>16}", rate(column.value(c)));
            }
            line
        })
        .collect()
}

/// The header line of the destination rows.
pub fn destination_header() -> String {
    format!("{:<46} {:>16} {:>16}", "DESTINATION", "EADDRNOTAVAIL/s", "ERRORS/s")
}

/// The destinations connect() failed toward, most failures first.
pub fn destination_lines(rates: &Rates, limit: usize) -> Vec<String> {
    let mut rows = rates.destinations.clone();
    rank(&mut rows, SortBy::Eaddrnotavail);
    rows.iter()
        .filter(|(_, c)| c.connect_errors > 0.0)
        .take(limit)
        .map(|(d, c)| {
            format!("{:<46} {:>16} {:>16}", clip(&d.server, 46), rate(c.eaddrnotavail), rate(c.connect_errors))
        })
        .collect()
}

/// The header line of the listener rows.
pub fn listener_header() -> String {
    format!("{:>8} {:<20} {:<28} {:>6} {:>16} {:>16}", "PID", "OWNER", "POD", "PORT", "OVERFLOWS/s", "SYN_QUEUE_FULL/s")
}

/// The listeners that turned connections away, most first.
pub fn listener_lines(rates: &Rates, limit: usize) -> Vec<String> {
    let mut rows = rates.listeners.clone();
    rows.sort_by(|(ka, a), (kb, b)| {
        (b.overflows + b.syn_queue_full)
            .partial_cmp(&(a.overflows + a.syn_queue_full))
            .unwrap_or(Ordering::Equal)
            .then(ka.cmp(kb))
    });
    rows.iter()
        .filter(|(_, c)| c.overflows + c.syn_queue_full > 0.0)
        .take(limit)
        .map(|(l, c)| {
            let o = &l.owner;
            format!(
                "{:>8} {:<20} {:<28} {:>6} {:>16} {:>16}",
                o.pid,
                clip(&o.name, 20),
                clip(&o.pod, 28),
                l.port,
                rate(c.overflows),
                rate(c.syn_queue_full)
            )
        })
        .collect()
}

/// The whole table as text: what `--once` prints.
pub fn render(rates: &Rates, by: SortBy, limit: usize, source: &str) -> String {
    let mut out = format!(
        "observer top: {source}, per second over the last {:.1} s, sorted by {}\n\n",
        rates.seconds,
        by.column()
    );
    out.push_str(&process_header(by));
    out.push('\n');
    for line in process_lines(rates, by, limit) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&destination_header());
    out.push('\n');
    for line in destination_lines(rates, limit) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&listener_header());
    out.push('\n');
    for line in listener_lines(rates, limit) {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width { s.to_string() } else { s.chars().take(width - 1).chain(['~']).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::reading::Process;

    fn process(pid: &str, c: Counts) -> (Process, Counts) {
        (Process { pid: pid.into(), name: format!("p{pid}"), pod: String::new() }, c)
    }

    #[test]
    fn rows_are_ranked_by_the_chosen_signal_and_the_column_is_marked() {
        let rates = Rates {
            seconds: 1.0,
            processes: vec![
                process("1", Counts { connects: 500.0, ..Counts::default() }),
                process("2", Counts { eaddrnotavail: 40.0, connect_errors: 40.0, connects: 10.0, ..Counts::default() }),
            ],
            destinations: Vec::new(),
            listeners: Vec::new(),
        };
        let first_pid = |by| process_lines(&rates, by, 10)[0].split_whitespace().next().unwrap().to_string();
        assert_eq!(first_pid(SortBy::Eaddrnotavail), "2");
        assert_eq!(first_pid(SortBy::Connects), "1");
        assert!(process_header(SortBy::Connects).contains("*CONNECTS/s"));
        assert_eq!(SortBy::from_key('c'), Some(SortBy::Connects));
        let line = &process_lines(&rates, SortBy::Eaddrnotavail, 10)[0];
        assert_eq!(line.split_whitespace().collect::<Vec<_>>(), ["2", "p2", "40", "40", "0", "0", "10", "0"]);
    }
}
