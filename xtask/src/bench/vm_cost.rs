//! The programs' cost per connection cycle in each attach mode, inside the
//! kernel matrix's VM kernels: the preferred modes (fentry/fexit, kprobes)
//! exist only there, as this host's lockdown refuses them. Software
//! emulation inflates every figure many times over, so a mode is compared
//! with the tracepoint mode measured in the same guest, one after the
//! other, never with the host's figures.
//!
//! Each mode: the daemon started in that mode with
//! kernel.bpf_stats_enabled=1, the churn generator run in a fresh
//! namespace, and the run time of observer's programs over the run (from
//! bpftool before and after) divided by the cycles it made. The modes take
//! turns, `REPEATS` times: an emulated guest's speed drifts with the
//! host's load, so each run is also read in runs of `sock_state`, the
//! program every mode shares (the same code at the same tracepoint), a
//! yardstick that drifts with the guest.
use std::{fmt::Write as _, fs, path::Path};

use anyhow::{Context as _, Result, bail};

use super::{ProgramStats, field};
use crate::{run_cmd, vm};

/// Modes measured, the reference last.
const MODES: &[&str] = &["auto", "kprobe", "tracepoint"];
/// Runs of each mode per kernel (the median is reported).
const REPEATS: usize = 3;
/// The program every mode runs alike.
const YARDSTICK: &str = "sock_state";

/// One mode's measure in one kernel.
struct ModeCost {
    mode: &'static str,
    /// Where the hooks went, from the daemon's log (`hook=mode` pairs).
    attached: Vec<String>,
    cycles: u64,
    /// Per observer program: (name, runs, run time ns) over the run.
    programs: Vec<(String, u64, u64)>,
}

impl ModeCost {
    fn ns_per_cycle(&self) -> f64 {
        self.programs.iter().map(|(_, _, ns)| *ns as f64).sum::<f64>() / self.cycles.max(1) as f64
    }

    /// The cost per cycle in runs of the yardstick program (its ns per run
    /// in this same run).
    fn yardsticks_per_cycle(&self) -> f64 {
        let per_run = self
            .programs
            .iter()
            .find(|(name, _, _)| name == YARDSTICK)
            .map_or(f64::NAN, |(_, runs, ns)| *ns as f64 / (*runs).max(1) as f64);
        self.ns_per_cycle() / per_run
    }
}

/// Boot every VM kernel and measure each mode there; the report's section.
pub fn measure(observer: &Path, churn: &Path, connections: u64) -> Result<String> {
    let bpftool = crate::which("bpftool").context("bpftool is not installed")?;
    let mut md = format!(
        "Program cost per connection cycle in the VM kernels (`cargo xtask bench --vm-cost-only`): observer's BPF run \
         time (kernel.bpf_stats_enabled=1) over a churn run, per cycle, in each attach mode. Software emulation \
         inflates every figure and its speed drifts with the host's load, so each mode is read against the \
         tracepoint mode in the same guest, and in runs of `{YARDSTICK}` (the program every mode shares) per cycle. \
         The run time of the programs only: not the kprobe's or trampoline's own entry cost. Each mode ran \
         {REPEATS} times, taking turns with the others; medians.\n\n\
         | kernel | mode | hooks | cycles per run | BPF ns per cycle | against the tracepoint mode | `{YARDSTICK}` runs per cycle |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut details = String::new();
    for kernel in vm::setup(&[])? {
        let runs = measure_kernel(&kernel, observer, churn, &bpftool, connections)?;
        let median_of = |mode: &str, f: fn(&ModeCost) -> f64| {
            super::median(runs.iter().filter(|c| c.mode == mode).map(f).collect())
        };
        let reference = median_of("tracepoint", ModeCost::ns_per_cycle);
        for mode in MODES {
            let Some(c) = runs.iter().find(|c| c.mode == *mode) else { continue };
            let ns = median_of(mode, ModeCost::ns_per_cycle);
            writeln!(
                md,
                "| {} | {mode} | {} | {} | {ns:.0} | {:.2} | {:.1} |",
                kernel.version,
                c.attached.join(" "),
                c.cycles,
                ns / reference,
                median_of(mode, ModeCost::yardsticks_per_cycle)
            )?;
            let cycles = c.cycles.max(1) as f64;
            let per_program: Vec<String> = c
                .programs
                .iter()
                .map(|(name, runs, ns)| {
                    format!("{name} {:.1}x{:.0} ns", *runs as f64 / cycles, *ns as f64 / (*runs).max(1) as f64)
                })
                .collect();
            writeln!(details, "- {} {mode} (first run): {}", kernel.series, per_program.join(", "))?;
        }
    }
    writeln!(md, "\nPer program (runs per cycle x ns per run):\n\n{details}")?;
    Ok(md)
}

/// Every run of every mode in `kernel`.
fn measure_kernel(
    kernel: &vm::Kernel,
    observer: &Path,
    churn: &Path,
    bpftool: &Path,
    connections: u64,
) -> Result<Vec<ModeCost>> {
    let out = vm::vm_dir().join(format!("cost-{}", kernel.series));
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let mut s = format!(
        "#!/bin/sh\n# Generated by cargo xtask bench --vm-cost-only; runs inside the guest.\nout={}\n\
         exec > $out/progress.log 2>&1\nsysctl -qw kernel.bpf_stats_enabled=1\n",
        out.display()
    );
    let runs: Vec<(&'static str, String)> =
        (0..REPEATS).flat_map(|rep| MODES.iter().map(move |mode| (*mode, format!("{mode}-{rep}")))).collect();
    for (mode, run) in &runs {
        s.push_str(&format!(
            "{obs} run --attach-mode {mode} --prometheus-listen 127.0.0.1:0 >$out/observer-{run}.log 2>&1 & p=$!\n\
             for i in $(seq 300); do grep -q serving $out/observer-{run}.log && break; kill -0 $p 2>/dev/null || break; sleep 1; done\n\
             ip netns add cost; ip -n cost link set lo up\n\
             ip netns exec cost sysctl -qw net.ipv4.ip_local_port_range='1024 65535'\n\
             {bpftool} prog show -j >$out/before-{run}.json\n\
             ip netns exec cost {churn} churn --threads 2 --connections {connections} >$out/churn-{run}.txt\n\
             {bpftool} prog show -j >$out/after-{run}.json\n\
             ip netns del cost\n\
             kill -INT $p; wait $p\n",
            obs = observer.display(),
            churn = churn.display(),
            bpftool = bpftool.display(),
        ));
    }
    s.push_str("echo done\n");
    let script = vm::vm_dir().join(format!("cost-{}.sh", kernel.series));
    fs::write(&script, s)?;
    run_cmd(std::process::Command::new("chmod").arg("+x").arg(&script))?;
    println!("bench: program cost in {} ({}), software emulation", kernel.version, kernel.series);
    let guest = vm::boot(kernel, &script, &[&out], 1500)?;
    fs::write(out.join("console.log"), &guest.console)?;
    if let Some(report) = guest.fault {
        bail!("the {} guest's kernel failed; it said:\n{report}", kernel.series);
    }
    anyhow::ensure!(guest.exit == Some(0), "the guest script failed in {}: see {}", kernel.series, out.display());
    runs.iter().map(|(mode, run)| read_run(&out, mode, run)).collect()
}

fn read_run(out: &Path, mode: &'static str, run: &str) -> Result<ModeCost> {
    let read = |name: &str| fs::read_to_string(out.join(name)).with_context(|| format!("{name} in {}", out.display()));
    let programs = |name: &str| -> Result<ProgramStats> {
        Ok(ProgramStats::from_programs(serde_json::from_str(&read(name)?).with_context(|| name.to_string())?))
    };
    let (before, after) = (programs(&format!("before-{run}.json"))?, programs(&format!("after-{run}.json"))?);
    let said = read(&format!("churn-{run}.txt"))?;
    let cycles = field(&said, "cycles").and_then(|c| c.parse().ok()).with_context(|| format!("churn said: {said}"))?;
    let log = read(&format!("observer-{run}.log"))?;
    // A daemon that never served measured nothing: its zero must not pass
    // for a cheap mode.
    anyhow::ensure!(log.contains("serving"), "observer did not start in {run}: {}", out.display());
    let attached = log
        .lines()
        .filter(|l| l.contains(" attached "))
        .filter_map(|l| {
            let value =
                |key: &str| l.split(&format!("{key}=")).nth(1)?.split_whitespace().next().map(|v| v.trim_matches('"'));
            Some(format!("{}={}", value("hook")?, value("mode")?))
        })
        .collect();
    let programs = after.observer_since(&before);
    Ok(ModeCost { mode, attached, cycles, programs })
}
