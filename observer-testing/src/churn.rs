//! The churn generator (`observer-churn`, this crate's binary): the
//! traffic of the incidents, with the errno of every failed connect() as
//! the kernel gave it.
use std::{collections::BTreeMap, path::PathBuf, process::Child};

/// The churn generator's path: `OBSERVER_CHURN` (the kernel matrix runs a
/// snapshot of it), else the one cargo built next to the running test or
/// tool (`target/<profile>/observer-churn`).
pub fn churn() -> String {
    if let Ok(path) = std::env::var("OBSERVER_CHURN") {
        return path;
    }
    let exe = std::env::current_exe().expect("the running executable");
    // target/<profile>/deps/<test> or target/<profile>/<tool>.
    let candidates: Vec<PathBuf> = exe.ancestors().skip(1).take(2).map(|dir| dir.join("observer-churn")).collect();
    let found = candidates.iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!(
            "observer-churn not found at {candidates:?}: build it with `cargo build -p observer-testing` \
             (`cargo xtask test` does), or set OBSERVER_CHURN"
        )
    });
    found.display().to_string()
}

/// A server started by `Netns::serve`, killed on drop.
pub struct Server {
    pub(crate) child: Child,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A server started with `--hold --close-on-input`: close the `n`
    /// connections it has held longest.
    pub fn close_oldest(&mut self, n: u64) {
        use std::io::Write as _;
        let stdin = self.child.stdin.as_mut().expect("the server's standard input");
        writeln!(stdin, "{n}").expect("the server takes no more input (ended?)");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the client saw: connections made and errno of each failure.
#[derive(Debug)]
pub struct ClientReport {
    pub pid: u32,
    pub connected: u64,
    pub errors: BTreeMap<String, u64>,
}

impl ClientReport {
    pub fn parse(pid: u32, out: &str) -> Self {
        let mut report = ClientReport { pid, connected: 0, errors: BTreeMap::new() };
        for field in out.split_whitespace() {
            match field.split_once('=') {
                Some(("connected", n)) => report.connected = n.parse().unwrap(),
                Some(("errors", list)) => {
                    for item in list.split(',').filter(|s| !s.is_empty()) {
                        let (name, n) = item.split_once(':').unwrap();
                        report.errors.insert(name.to_string(), n.parse().unwrap());
                    }
                }
                _ => {}
            }
        }
        report
    }

    pub fn errors(&self, name: &str) -> u64 {
        self.errors.get(name).copied().unwrap_or(0)
    }
}
