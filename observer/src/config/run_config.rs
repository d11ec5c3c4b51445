//! The settings the daemon runs with, typed and grouped as its parts take
//! them. Each setting is defined (and defaulted) once, in `Settings`.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::{export::otlp::OtlpConfig, probes::AttachMode, series::Limits};

/// The settings the daemon runs with, typed; made from the merged
/// `config::Settings` (`Settings::resolve`), where each one is defined.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub prometheus_listen: SocketAddr,
    pub interval: Duration,
    pub grace: Duration,
    pub attach_mode: AttachMode,
    pub limits: Limits,
    /// Capacity of the socket-owner map (SOCK_OWNERS).
    pub max_sockets: u32,
    /// Network namespaces read at most.
    pub max_namespaces: usize,
    /// The host's /proc (in a container: where the host's /proc is mounted).
    pub proc_root: PathBuf,
    /// The kernel's BTF (its own, or one from BTFHub for older kernels).
    pub kernel_btf: PathBuf,
    /// The cgroup v2 mount (None: found in /proc/self/mountinfo).
    pub cgroup_root: Option<PathBuf>,
    /// kubelet's pod log directory (pod names and namespaces).
    pub pod_logs: PathBuf,
    /// Connection limits the user declared.
    pub connection_limits: Vec<super::ConnectionLimit>,
    /// OTLP push, when an endpoint is set.
    pub otlp: Option<OtlpConfig>,
}

impl Default for RunConfig {
    /// Every setting at its default (config.rs has them).
    fn default() -> Self {
        super::Settings::defaults().resolve()
    }
}
