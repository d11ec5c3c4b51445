//! Up-front checks, so a missing capability or kernel feature is one clear
//! message instead of an EPERM deep inside a load.
use std::path::Path;

use caps::{CapSet, Capability};

use crate::error::Error;

/// Capabilities the daemon uses, with why:
/// - CAP_BPF: create maps and load programs;
/// - CAP_PERFMON: tracing programs (tracepoints, tp_btf, fentry, kprobes)
///   and bpf_probe_read_kernel;
/// - CAP_NET_ADMIN: sock_diag drop counters of other processes' listeners;
/// - CAP_SYS_ADMIN: entering other network namespaces (setns);
/// - CAP_SYS_RESOURCE: raising RLIMIT_MEMLOCK on kernels before 5.11.
///
/// CAP_SYS_ADMIN alone also covers CAP_BPF/CAP_PERFMON (kernels < 5.8).
pub fn check() -> Result<(), Error> {
    let effective = caps::read(None, CapSet::Effective).unwrap_or_default();
    if effective.contains(&Capability::CAP_SYS_ADMIN) {
        return Ok(());
    }
    let needed = [Capability::CAP_BPF, Capability::CAP_PERFMON, Capability::CAP_NET_ADMIN];
    let missing: Vec<String> = needed.iter().filter(|c| !effective.contains(c)).map(|c| c.to_string()).collect();
    if missing.is_empty() { Ok(()) } else { Err(Error::Privileges { missing: missing.join(", ") }) }
}

/// tracefs is needed to attach classic tracepoints (aya reads event ids
/// from it). Many distributions (Debian among them) do not mount it at
/// boot; mount it ourselves when we may (CAP_SYS_ADMIN), else say how.
pub fn ensure_tracefs() -> Result<(), Error> {
    let candidates = ["/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"];
    if candidates.iter().any(|p| Path::new(p).is_dir()) {
        return Ok(());
    }
    let target = Path::new("/sys/kernel/tracing");
    match nix::mount::mount(Some("nodev"), target, Some("tracefs"), nix::mount::MsFlags::empty(), None::<&str>) {
        Ok(()) => {
            tracing::info!(path = %target.display(), "tracefs was not mounted; mounted it");
            Ok(())
        }
        Err(errno) => Err(Error::NoTracefs { path: target.into(), reason: errno.desc().to_string() }),
    }
}
