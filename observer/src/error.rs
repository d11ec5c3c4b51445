//! Errors the daemon reports to its user. Each message names what is wrong
//! and how to fix it: they are printed as-is, never with a backtrace.
use std::{net::SocketAddr, path::PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "missing privileges: observer needs {missing} to load eBPF programs and read kernel maps; \
         run it as root, or grant the capabilities: \
         `sudo setcap cap_bpf,cap_perfmon,cap_net_admin,cap_sys_resource,cap_sys_ptrace+ep $(which observer)` \
         (kernels before 5.8 need CAP_SYS_ADMIN instead of CAP_BPF and CAP_PERFMON)"
    )]
    Privileges { missing: String },

    #[error(
        "no kernel BTF at {path}: observer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y \
         (standard on Debian 11+, Ubuntu 20.10+, RHEL 8.2+, recent COS/Bottlerocket/AL2023)"
    )]
    NoBtf { path: PathBuf },

    #[error("kernel BTF: {0}")]
    Btf(String),

    #[error(
        "tracefs is not mounted at {path} and mounting it failed ({reason}): the tracepoint \
         hooks need it; mount it with `mount -t tracefs nodev /sys/kernel/tracing` (in a \
         container, mount the host's /sys/kernel/tracing into the container)"
    )]
    NoTracefs { path: PathBuf, reason: String },

    #[error("loading the eBPF object failed: {0}")]
    Load(String),

    #[error("hook `{hook}` could not be attached in any mode; tried: {tried}")]
    Attach { hook: &'static str, tried: String },

    #[error("attach mode `{mode}` was requested, but hook `{hook}` cannot run in it: {reason}")]
    ModeUnavailable { mode: String, hook: &'static str, reason: String },

    #[error(
        "cannot listen on {addr}: {source} (is another observer or exporter already using it? pick another with --prometheus-listen)"
    )]
    Listen { addr: SocketAddr, source: std::io::Error },

    #[error("reading map {map}: {reason}")]
    Map { map: &'static str, reason: String },

    #[error("metrics pipeline: {0}")]
    Export(String),

    #[error("configuration file {path}: {message}")]
    Config { path: PathBuf, message: String },
}
