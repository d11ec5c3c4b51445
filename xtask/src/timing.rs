//! Where `cargo xtask test`'s time goes: the wall time of each phase
//! (setup, builds, the host suite, each guest) and of each test binary,
//! on the host and in every guest and mode, printed as one table at the
//! end so that growth shows on every run and a budget can be held.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

/// The most a test binary should take in one guest (software emulation),
/// so that the matrix stays within CI's budget: a binary over it is marked
/// in the table (a budget to hold, not a test that fails on a slow day).
pub const GUEST_BINARY_BUDGET: Duration = Duration::from_secs(180);

/// One test binary's run: where (`host`, or a guest's `<kernel>/<mode>`),
/// how long and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryTime {
    pub place: String,
    pub binary: String,
    pub wall: Duration,
    /// `ok`, `FAILED`, `retried` (passed on its second run) or `died` (no
    /// result line: a crash, or its guest's kernel failed).
    pub outcome: &'static str,
}

/// The phases and binaries of one `cargo xtask test`, in the order run.
pub struct Timings {
    started: Instant,
    pub phases: Vec<(String, Duration)>,
    /// Phases that ran beside those (the kernel matrix's: its set-up
    /// beside the host's set-up and builds, its guests beside the host
    /// suite).
    pub beside: Vec<(String, Duration)>,
    pub binaries: Vec<BinaryTime>,
}

impl Default for Timings {
    fn default() -> Self {
        Self { started: Instant::now(), phases: Vec::new(), beside: Vec::new(), binaries: Vec::new() }
    }
}

impl Timings {
    /// Take in the phases and binaries of `other`, which ran beside ours.
    pub fn add_beside(&mut self, other: Timings) {
        self.beside.extend(other.phases);
        self.binaries.extend(other.binaries);
    }

    /// Take in the times of test binaries; a binary run again in the same
    /// place (the host suite runs tests/image.rs in two passes) stays one
    /// row, its times added, failed if either run failed.
    pub fn add_binaries(&mut self, times: Vec<BinaryTime>) {
        for time in times {
            match self.binaries.iter_mut().find(|b| b.binary == time.binary && b.place == time.place) {
                Some(earlier) => {
                    earlier.wall += time.wall;
                    if earlier.outcome == "ok" {
                        earlier.outcome = time.outcome;
                    }
                }
                None => self.binaries.push(time),
            }
        }
    }

    /// Run `phase` and note how long it took, whether or not it failed.
    pub fn phase<T>(&mut self, name: &str, phase: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let started = Instant::now();
        let result = phase(self);
        self.phases.push((name.to_string(), started.elapsed()));
        result
    }

    /// The table: phases, then one row per test binary and a column per
    /// place it ran in.
    pub fn table(&self) -> String {
        let mut s = String::from("\n== where the time went\n");
        for (name, wall) in &self.phases {
            let _ = writeln!(s, "{name:<52} {:>7}", secs(*wall));
        }
        if !self.beside.is_empty() {
            s.push_str(
                "beside those (the matrix's set-up from the start, its guests from the test binaries' build on):\n",
            );
            for (name, wall) in &self.beside {
                let _ = writeln!(s, "  {name:<50} {:>7}", secs(*wall));
            }
        }
        let _ = writeln!(s, "{:<52} {:>7}", "total (wall time)", secs(self.started.elapsed()));
        if self.binaries.is_empty() {
            return s;
        }
        let mut places: Vec<&str> = Vec::new();
        for b in &self.binaries {
            if !places.contains(&b.place.as_str()) {
                places.push(&b.place);
            }
        }
        let mut rows: BTreeMap<&str, BTreeMap<&str, &BinaryTime>> = BTreeMap::new();
        for b in &self.binaries {
            rows.entry(&b.binary).or_default().insert(&b.place, b);
        }
        let width = rows.keys().map(|b| b.len()).max().unwrap_or(0).max(6);
        let _ = write!(s, "\n{:<width$}", "binary");
        for place in &places {
            let _ = write!(s, " {place:>12}");
        }
        s.push('\n');
        let mut over = Vec::new();
        for (binary, by_place) in &rows {
            let _ = write!(s, "{binary:<width$}");
            for place in &places {
                let cell = match by_place.get(place) {
                    None => String::new(),
                    Some(b) => {
                        let guest = b.place != "host";
                        if guest && b.wall > GUEST_BINARY_BUDGET {
                            over.push(format!("{} in {}", b.binary, b.place));
                        }
                        let mark = match b.outcome {
                            "ok" => "",
                            "retried" => " r",
                            "FAILED" => " F",
                            _ => " D",
                        };
                        let budget = if guest && b.wall > GUEST_BINARY_BUDGET { "!" } else { "" };
                        format!("{}{budget}{mark}", secs(b.wall))
                    }
                };
                let _ = write!(s, " {cell:>12}");
            }
            s.push('\n');
        }
        let _ = write!(s, "{:<width$}", "sum");
        for place in &places {
            let sum: Duration = self.binaries.iter().filter(|b| b.place == *place).map(|b| b.wall).sum();
            let _ = write!(s, " {:>12}", secs(sum));
        }
        s.push('\n');
        s.push_str("(r: passed when run again after kernel-skipped runs; F: failed; D: ended without a result)\n");
        if !over.is_empty() {
            let _ = writeln!(
                s,
                "over the budget of {} a binary in a guest (!): {}",
                secs(GUEST_BINARY_BUDGET),
                over.join(", ")
            );
        }
        s
    }
}

fn secs(d: Duration) -> String {
    format!("{:.0} s", d.as_secs_f64())
}

/// Run `cargo test` (`cmd`), passing its output through, and time each of
/// its test binaries: from the line cargo prints before running it to the
/// next such line (or the end). Its stdout and stderr share one pipe, so
/// cargo's `Running` lines (stderr) and the binaries' results (stdout) stay
/// in order. Returns whether it succeeded and the binaries' times.
///
/// Stdout is locked a line at a time, never for the run: the matrix's
/// lanes print beside the host suite, and a lane held on the lock for the
/// suite's ~10 minutes started two guests 232 and 248 s late (the boot's
/// `println!` waited).
pub fn cargo_test(cmd: &mut Command) -> Result<(bool, Vec<BinaryTime>)> {
    cargo_test_echoing(cmd, &mut std::io::stdout())
}

/// `cargo_test`, its output passed through to `echo`.
fn cargo_test_echoing(cmd: &mut Command, echo: &mut dyn std::io::Write) -> Result<(bool, Vec<BinaryTime>)> {
    let (reader, writer) = std::io::pipe()?;
    let mut child =
        cmd.stdout(writer.try_clone()?).stderr(writer).spawn().with_context(|| format!("cannot start {cmd:?}"))?;
    // `cmd` still holds our write ends: dropped, the child's are the only
    // ones left, so the reader ends when it (and what it started) exits.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut times = Vec::new();
    let mut current: Option<(String, Instant, &'static str)> = None;
    for line in BufReader::new(reader).lines() {
        let line = line?;
        let _ = writeln!(echo, "{line}");
        if let Some(binary) = binary_started(&line) {
            times.extend(current.take().map(|(b, t, o)| host_time(b, t, o)));
            current = Some((binary, Instant::now(), "died"));
        } else if let Some((_, _, outcome)) = current.as_mut()
            && let Some(result) = line.strip_prefix("test result: ")
        {
            *outcome = if result.starts_with("ok") { "ok" } else { "FAILED" };
        }
    }
    times.extend(current.take().map(|(b, t, o)| host_time(b, t, o)));
    let status = child.wait()?;
    Ok((status.success(), times))
}

fn host_time(binary: String, started: Instant, outcome: &'static str) -> BinaryTime {
    BinaryTime { place: "host".to_string(), binary, wall: started.elapsed(), outcome }
}

/// The binary a line of cargo's starts: `Running tests/time_wait.rs
/// (target/debug/deps/time_wait-1a2b)` -> `time_wait`; a crate's unit tests
/// (`Running unittests src/lib.rs (.../observer-1a2b)`) -> `observer
/// (unit)`; `Doc-tests observer` -> `observer (doc)`.
fn binary_started(line: &str) -> Option<String> {
    let line = line.trim_start();
    if let Some(krate) = line.strip_prefix("Doc-tests ") {
        return Some(format!("{} (doc)", krate.trim()));
    }
    let rest = line.strip_prefix("Running ")?;
    let path = rest.rsplit_once('(')?.1.trim_end_matches(')');
    let file = path.rsplit('/').next()?;
    let name = file.rsplit_once('-').map_or(file, |(name, _hash)| name);
    Some(if rest.starts_with("unittests ") { format!("{name} (unit)") } else { name.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_run_in_two_passes_is_one_row() {
        let time = |secs, outcome| BinaryTime {
            place: "host".into(),
            binary: "image".into(),
            wall: Duration::from_secs(secs),
            outcome,
        };
        let mut timings = Timings::default();
        timings.add_binaries(vec![time(1, "ok")]);
        timings.add_binaries(vec![time(15, "FAILED")]);
        assert_eq!(timings.binaries.len(), 1);
        assert_eq!((timings.binaries[0].wall, timings.binaries[0].outcome), (Duration::from_secs(16), "FAILED"));
    }

    /// The matrix's lanes print while the host suite runs: its echo must
    /// not hold stdout between lines (a lane waited 248 s to boot a guest).
    #[test]
    fn stdout_is_free_between_the_suites_lines() {
        let suite = std::thread::spawn(|| {
            cargo_test(
                Command::new("sh").args(["-c", "echo '     Running tests/a.rs (target/debug/deps/a-1)'; sleep 4"]),
            )
        });
        std::thread::sleep(Duration::from_millis(500));
        let asked = Instant::now();
        drop(std::io::stdout().lock());
        let waited = asked.elapsed();
        let (ok, times) = suite.join().unwrap().unwrap();
        assert!(ok && times.len() == 1, "{times:?}");
        assert!(waited < Duration::from_secs(2), "stdout was held for {waited:?} of the suite's 4 s");
    }

    #[test]
    fn names_each_binary_cargo_runs() {
        let named = |l: &str| binary_started(l);
        assert_eq!(named("     Running tests/time_wait.rs (target/debug/deps/time_wait-0f1e2d)").unwrap(), "time_wait");
        assert_eq!(
            named("     Running unittests src/lib.rs (target/debug/deps/observer_common-77aa)").unwrap(),
            "observer_common (unit)"
        );
        assert_eq!(named("   Doc-tests observer").unwrap(), "observer (doc)");
        assert_eq!(named("test result: ok. 3 passed; 0 failed"), None);
        assert_eq!(named("running 3 tests"), None);
    }

    #[test]
    fn times_each_binary_and_says_how_it_ended() {
        let script = "echo '     Running tests/a.rs (target/debug/deps/a-1)' >&2; echo 'test result: ok. 1 passed'; \
                      echo '     Running tests/b.rs (target/debug/deps/b-2)' >&2; sleep 0.3; \
                      echo 'test result: FAILED. 0 passed; 1 failed'; \
                      echo '     Running tests/c.rs (target/debug/deps/c-3)' >&2; exit 101";
        // Not echoed to this test's output, where the suite's own run of
        // cargo_test would take its lines for cargo's.
        let mut echoed = Vec::new();
        let (ok, times) = cargo_test_echoing(Command::new("sh").args(["-c", script]), &mut echoed).unwrap();
        assert_eq!(String::from_utf8(echoed).unwrap().lines().count(), 5);
        assert!(!ok);
        let got: Vec<(&str, &str)> = times.iter().map(|t| (t.binary.as_str(), t.outcome)).collect();
        assert_eq!(got, [("a", "ok"), ("b", "FAILED"), ("c", "died")]);
        assert!(times[1].wall >= Duration::from_millis(300), "{times:?}");
    }

    #[test]
    fn the_table_has_a_column_per_place_and_marks_what_is_over_budget() {
        let t = |place: &str, binary: &str, secs: u64, outcome| BinaryTime {
            place: place.to_string(),
            binary: binary.to_string(),
            wall: Duration::from_secs(secs),
            outcome,
        };
        let timings = Timings {
            phases: vec![("build".to_string(), Duration::from_secs(60))],
            beside: vec![("matrix: the 6.12 guest".to_string(), Duration::from_secs(250))],
            binaries: vec![
                t("host", "time_wait", 20, "ok"),
                t("6.12/auto", "time_wait", 200, "ok"),
                t("6.12/auto", "trace", 50, "retried"),
            ],
            ..Timings::default()
        };
        let table = timings.table();
        assert!(table.contains("  matrix: the 6.12 guest") && table.contains("total (wall time)"), "{table}");
        assert!(table.contains("host") && table.contains("6.12/auto"), "{table}");
        assert!(table.contains("200 s!"), "{table}");
        assert!(table.contains("50 s r"), "{table}");
        assert!(table.contains("over the budget of 180 s a binary in a guest (!): time_wait in 6.12/auto"), "{table}");
        assert!(table.lines().any(|l| l.starts_with("sum") && l.contains("20 s") && l.contains("250 s")), "{table}");
    }
}
