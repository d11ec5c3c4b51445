//! Up-front checks, so a missing capability or kernel feature is one clear
//! message instead of an EPERM deep inside a load.
//!
//! `CAPABILITIES` is the one list of what observer needs and why: the
//! start-up check, its error message, `observer doctor`'s, the README's
//! Requirements section and the least-privilege overlay's list (checked by
//! tests) all come from it.
use std::path::Path;

use caps::{CapSet, Capability};

use crate::error::Error;

/// One capability observer uses.
pub struct Need {
    pub capability: Capability,
    /// What it is used for.
    pub why: &'static str,
    /// Without it observer cannot count at all, so it does not start;
    /// without the others it starts and logs what it cannot see.
    pub required: bool,
}

impl Need {
    /// Kubernetes' spelling (`securityContext.capabilities.add`): no `CAP_`.
    pub fn kubernetes_name(&self) -> String {
        self.capability.to_string().trim_start_matches("CAP_").to_string()
    }
}

/// Every capability observer uses, in the order the overlay lists them.
pub const CAPABILITIES: &[Need] = &[
    Need {
        capability: Capability::CAP_BPF,
        why: "load the eBPF programs and create their maps (Linux 5.8+)",
        required: true,
    },
    Need {
        capability: Capability::CAP_PERFMON,
        why: "attach tracing programs (tracepoints, tp_btf, fentry, kprobes) and read kernel memory from them",
        required: true,
    },
    Need {
        capability: Capability::CAP_NET_ADMIN,
        why: "read other processes' listening sockets with sock_diag (their drops and accept queues)",
        required: true,
    },
    Need {
        capability: Capability::CAP_SYS_RESOURCE,
        why: "raise RLIMIT_MEMLOCK for the maps on kernels before 5.11, which charge BPF memory to it",
        required: false,
    },
    Need {
        capability: Capability::CAP_SYS_PTRACE,
        why: "read other processes' /proc/<pid>/fd and ns/net (owners of listeners opened before observer, \
              network namespaces, open files)",
        required: false,
    },
    Need {
        capability: Capability::CAP_SYS_ADMIN,
        why: "enter each pod's network namespace (setns) to sweep its sockets; before Linux 5.8 it stands in \
              for CAP_BPF and CAP_PERFMON",
        required: false,
    },
];

/// `cap_bpf,cap_perfmon,...` for `setcap`.
pub fn setcap_list() -> String {
    CAPABILITIES.iter().map(|n| n.capability.to_string().to_lowercase()).collect::<Vec<_>>().join(",")
}

/// The README's list of capabilities, a nested list (its Requirements
/// section holds this text verbatim; a test checks it).
pub fn markdown() -> String {
    CAPABILITIES
        .iter()
        .map(|n| {
            let when = if n.required { "" } else { " (optional: without it observer sees less, and says so)" };
            format!("  - `{}`: {}{when}\n", n.capability, n.why)
        })
        .collect()
}

/// The capabilities observer needs that this process lacks, required ones
/// an error, the others a warning naming what is lost. CAP_SYS_ADMIN
/// alone covers the rest (and is what kernels before 5.8 want).
pub fn check() -> Result<(), Error> {
    let effective = caps::read(None, CapSet::Effective).unwrap_or_default();
    if effective.contains(&Capability::CAP_SYS_ADMIN) {
        return Ok(());
    }
    let (required, optional): (Vec<&Need>, Vec<&Need>) =
        CAPABILITIES.iter().filter(|n| !effective.contains(&n.capability)).partition(|n| n.required);
    for need in optional {
        tracing::warn!(capability = %need.capability, "missing: observer cannot {}", need.why);
    }
    if required.is_empty() {
        Ok(())
    } else {
        Err(Error::Privileges { missing: describe(&required), setcap: setcap_list() })
    }
}

/// `CAP_BPF (load ...), CAP_PERFMON (attach ...)`.
pub fn describe(missing: &[&Need]) -> String {
    missing.iter().map(|n| format!("{} ({})", n.capability, n.why)).collect::<Vec<_>>().join(", ")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_each_missing_capability_with_its_reason_and_the_setcap_line() {
        let missing: Vec<&Need> = CAPABILITIES.iter().filter(|n| n.required).collect();
        let message = Error::Privileges { missing: describe(&missing), setcap: setcap_list() }.to_string();
        for need in &missing {
            assert!(message.contains(&format!("{} ({})", need.capability, need.why)), "{message}");
        }
        assert!(message.contains(&format!("setcap {}+ep", setcap_list())), "{message}");
        assert!(setcap_list().starts_with("cap_bpf,cap_perfmon,cap_net_admin"));
    }

    /// The README lists the capabilities as this table does.
    #[test]
    fn the_readme_lists_every_capability_with_its_reason() {
        let readme = include_str!("../../../README.md");
        assert!(readme.contains(&markdown()), "README.md's Requirements must contain:\n{}", markdown());
    }
}
