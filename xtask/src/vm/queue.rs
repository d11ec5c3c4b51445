//! The matrix's runs as one queue the guests take from, so that the lanes
//! of guests end together: a lane whose guest is done boots another, for
//! the kernel and mode with runs left, even one a guest already runs
//! (two guests of one kernel then share its runs). A guest per kernel and
//! mode with a fixed list left one lane ~8 minutes behind the other.
//!
//! A run is a file, target/vm/queue/todo/<series>-<mode>.<test>; a guest
//! takes it with `mv` into taken/ before running it. The guests see the
//! directory through 9p, where a rename is the host's rename(2): of two
//! guests, one gets the run, the other's `mv` fails.
use std::{
    collections::{HashMap, HashSet},
    fs,
    path::PathBuf,
    sync::Mutex,
};

use anyhow::{Context as _, Result};

pub struct Queue {
    dir: PathBuf,
    /// The units (a kernel's series and mode: `Kernel::unit`), in the
    /// matrix's order.
    units: Vec<String>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Guests booted per unit.
    guests: HashMap<String, u32>,
    /// The runs given back once (`key`): a guest's kernel failed while
    /// running them.
    given_back: HashSet<String>,
    /// Kernel failures in the whole matrix.
    faults: u32,
    /// Units no guest may boot for any more (`abandon`).
    abandoned: HashSet<String>,
}

/// Kernel failures the matrix re-runs at most: each costs a boot and the
/// run it stopped (1-3 minutes), and the budget of a CI run is fixed. The
/// emulated 6.1 and 6.12 kernels fail 0-2 times in a full matrix (README).
pub const KERNEL_FAILURES_RERUN: u32 = 4;

impl Queue {
    /// A queue holding every run of `units` (each unit's name and its
    /// tests), under `dir` (emptied first).
    pub fn create(dir: PathBuf, units: &[(String, Vec<String>)]) -> Result<Self> {
        let _ = fs::remove_dir_all(&dir);
        let queue = Self { dir, units: units.iter().map(|(unit, _)| unit.clone()).collect(), state: Mutex::default() };
        fs::create_dir_all(queue.todo())?;
        fs::create_dir_all(queue.taken())?;
        for (unit, tests) in units {
            for test in tests {
                fs::write(queue.todo().join(key(unit, test)), b"").with_context(|| format!("queue {unit}'s {test}"))?;
            }
        }
        Ok(queue)
    }

    /// The directory a guest must have read-write.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn todo(&self) -> PathBuf {
        self.dir.join("todo")
    }

    fn taken(&self) -> PathBuf {
        self.dir.join("taken")
    }

    /// The shell command with which a guest takes `unit`'s `test`: it
    /// succeeds for one guest only.
    pub fn take_command(&self, unit: &str, test: &str) -> String {
        let key = key(unit, test);
        format!("mv {}/{key} {}/{key} 2>/dev/null", self.todo().display(), self.taken().display())
    }

    /// `unit`'s runs no guest has taken.
    pub fn left(&self, unit: &str) -> Vec<String> {
        let prefix = format!("{unit}.");
        let mut left: Vec<String> = fs::read_dir(self.todo())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.strip_prefix(&prefix).map(str::to_string))
            .collect();
        left.sort();
        left
    }

    /// The unit a lane's next guest runs, and that guest's number in it
    /// (1 for the first): the first unit in the matrix's order no guest
    /// has run yet, else the one with the most runs left; none once no
    /// run is left.
    /// Past `KERNEL_FAILURES_RERUN` kernel failures none is: the matrix
    /// has failed, and a kernel that fails at every boot would otherwise be
    /// booted for ever.
    pub fn next(&self) -> Option<(String, u32)> {
        let mut state = self.state.lock().unwrap();
        if state.faults > KERNEL_FAILURES_RERUN {
            return None;
        }
        let left: Vec<(&String, usize)> = self
            .units
            .iter()
            .filter(|unit| !state.abandoned.contains(*unit))
            .map(|unit| (unit, self.left(unit).len()))
            .filter(|(_, n)| *n > 0)
            .collect();
        let (unit, _) = left
            .iter()
            .find(|(unit, _)| !state.guests.contains_key(*unit))
            .or_else(|| left.iter().max_by_key(|(_, n)| *n))?;
        let unit = (*unit).clone();
        let guests = state.guests.entry(unit.clone()).or_default();
        *guests += 1;
        Some((unit, *guests))
    }

    /// No more guests for `unit`: one of its guests ended badly (it could
    /// not boot, its script died, a test failed, its kernel failed for
    /// good), and another would most likely end the same way; a guest that
    /// cannot start would be booted in a loop (one was, hundreds of times
    /// in a minute, for an argument vng refused). Its runs left are
    /// reported as never run.
    pub fn abandon(&self, unit: &str) {
        self.state.lock().unwrap().abandoned.insert(unit.to_string());
    }

    /// A guest of `unit` whose kernel failed took `tests` and did not end
    /// them: back into the queue, for another guest (true), unless one of
    /// them met a failed kernel before (a run that fails its kernel twice
    /// fails) or the matrix has had `KERNEL_FAILURES_RERUN` already (false).
    /// Per run, not per kernel: in one clean-clone run the emulated 6.12
    /// kernel took the stale int3 twice, in two different tests (README).
    pub fn give_back(&self, unit: &str, tests: &[String]) -> Result<bool> {
        let mut state = self.state.lock().unwrap();
        state.faults += 1;
        let keys: Vec<String> = tests.iter().map(|test| key(unit, test)).collect();
        if state.faults > KERNEL_FAILURES_RERUN || keys.iter().any(|key| state.given_back.contains(key)) {
            return Ok(false);
        }
        for key in keys {
            fs::rename(self.taken().join(&key), self.todo().join(&key)).with_context(|| format!("give back {key}"))?;
            state.given_back.insert(key);
        }
        Ok(true)
    }
}

fn key(unit: &str, test: &str) -> String {
    format!("{unit}.{test}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str) -> Queue {
        let dir = std::env::temp_dir().join(format!("xtask-queue-{name}-{}", std::process::id()));
        let units = [
            ("5.10-auto".to_string(), vec!["trace".to_string(), "time_wait".to_string()]),
            ("6.1-auto".to_string(), vec!["trace".to_string()]),
        ];
        Queue::create(dir, &units).unwrap()
    }

    /// As a guest takes it: its shell command.
    fn take(queue: &Queue, unit: &str, test: &str) -> bool {
        std::process::Command::new("sh").arg("-c").arg(queue.take_command(unit, test)).status().unwrap().success()
    }

    #[test]
    fn a_run_is_taken_once() {
        let queue = queue("once");
        assert!(take(&queue, "5.10-auto", "trace"));
        assert!(!take(&queue, "5.10-auto", "trace"), "taken twice");
        assert_eq!(queue.left("5.10-auto"), ["time_wait"]);
        assert_eq!(queue.left("6.1-auto"), ["trace"], "another unit's run of the same test is its own");
        let _ = fs::remove_dir_all(queue.dir());
    }

    #[test]
    fn each_unit_gets_a_guest_then_the_one_with_most_left_gets_another() {
        let queue = queue("next");
        assert_eq!(queue.next(), Some(("5.10-auto".to_string(), 1)));
        assert_eq!(queue.next(), Some(("6.1-auto".to_string(), 1)));
        // Both started: the one with more left gets a second guest.
        assert_eq!(queue.next(), Some(("5.10-auto".to_string(), 2)));
        for (unit, test) in [("5.10-auto", "trace"), ("5.10-auto", "time_wait")] {
            assert!(take(&queue, unit, test));
        }
        assert_eq!(queue.next(), Some(("6.1-auto".to_string(), 2)));
        assert!(take(&queue, "6.1-auto", "trace"));
        assert_eq!(queue.next(), None, "nothing left");
        let _ = fs::remove_dir_all(queue.dir());
    }

    #[test]
    fn runs_a_failed_kernel_left_go_back_once() {
        let queue = queue("back");
        assert!(take(&queue, "5.10-auto", "trace"));
        assert!(queue.give_back("5.10-auto", &["trace".to_string()]).unwrap());
        assert_eq!(queue.left("5.10-auto"), ["time_wait", "trace"]);
        // The same kernel failing again in another run: that run goes back.
        assert!(take(&queue, "5.10-auto", "time_wait"));
        assert!(queue.give_back("5.10-auto", &["time_wait".to_string()]).unwrap(), "another run of the unit");
        assert!(take(&queue, "5.10-auto", "trace"));
        assert!(!queue.give_back("5.10-auto", &["trace".to_string()]).unwrap(), "a run that failed its kernel twice");
        assert_eq!(queue.left("5.10-auto"), ["time_wait"]);
        let _ = fs::remove_dir_all(queue.dir());
    }

    #[test]
    fn an_abandoned_unit_gets_no_more_guests() {
        let queue = queue("abandon");
        assert_eq!(queue.next(), Some(("5.10-auto".to_string(), 1)));
        queue.abandon("5.10-auto");
        assert_eq!(queue.next(), Some(("6.1-auto".to_string(), 1)));
        assert_eq!(queue.next(), Some(("6.1-auto".to_string(), 2)), "only the other unit's runs are handed out");
        assert!(take(&queue, "6.1-auto", "trace"));
        assert_eq!(queue.next(), None, "the abandoned unit's runs stay left");
        assert_eq!(queue.left("5.10-auto"), ["time_wait", "trace"]);
        let _ = fs::remove_dir_all(queue.dir());
    }

    #[test]
    fn kernel_failures_past_the_bound_fail_the_matrix() {
        let queue = queue("bound");
        // Guests whose kernel failed before they took a run.
        for _ in 0..KERNEL_FAILURES_RERUN - 1 {
            assert!(queue.give_back("6.1-auto", &[]).unwrap());
        }
        assert!(take(&queue, "5.10-auto", "trace"));
        assert!(queue.give_back("5.10-auto", &["trace".to_string()]).unwrap(), "the last failure re-run");
        assert!(take(&queue, "5.10-auto", "time_wait"));
        assert!(!queue.give_back("5.10-auto", &["time_wait".to_string()]).unwrap(), "past the bound");
        assert_eq!(queue.next(), None, "no guest boots past the bound, with 6.1's run left");
        assert_eq!(queue.left("6.1-auto"), ["trace"]);
        let _ = fs::remove_dir_all(queue.dir());
    }
}
