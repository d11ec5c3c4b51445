//! Probes: load the eBPF object and attach every hook, each in the best mode
//! this kernel allows (see `hooks.rs` for the table and the fallback chain).
pub mod explain;
pub mod hooks;
pub mod offsets;
pub mod older;
pub mod privileges;
pub mod stats;
pub mod syn_queue_test;

use std::{fmt, path::Path};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap as AyaHashMap, MapData, PerCpuArray, PerCpuHashMap, Queue, RingBuf},
};
pub use hooks::{Attachment, HOOKS, Hook, Mode, SkippedRuns};
use observer_common::{Config, capacity, names::maps};
pub use stats::{ProgramHandle, RunStats};
use tracing::info;

use crate::{
    collect::{Buffers, KernelMaps, LruMaps},
    error::Error,
};

/// The eBPF object, built by build.rs with aya-build.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// Which attach modes the loader may use for the hooks that have a choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// fentry/fexit, else kprobe/kretprobe, else tracepoints.
    #[default]
    Auto,
    /// Only fentry/fexit (BPF trampolines, Linux 5.5+).
    Fentry,
    /// Only kprobe/kretprobe.
    Kprobe,
    /// Only tracepoints (classic and BTF): works without kprobes/trampolines.
    Tracepoint,
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            AttachMode::Auto => "auto",
            AttachMode::Fentry => "fentry",
            AttachMode::Kprobe => "kprobe",
            AttachMode::Tracepoint => "tracepoint",
        };
        f.write_str(s)
    }
}

/// The loaded, attached programs. Dropping it detaches everything.
pub struct Probes {
    // Owns the programs and their links; never read after loading.
    _ebpf: Ebpf,
    pub attachments: Vec<Attachment>,
    /// Every attached program, to read the kernel's run statistics.
    pub programs: Vec<ProgramHandle>,
    /// Whether the kernel's TcpExtTW/TWKilled count TIME_WAIT sockets on
    /// entry, which the check of observer's own count needs
    /// (`offsets::time_wait_counted_at_entry`).
    pub time_wait_counted_at_entry: bool,
    /// The kernel's (major, minor) version, as the load read it.
    pub kernel: (u32, u32),
}

impl Probes {
    /// `load_with_btf` with the kernel's own BTF, the default map sizes
    /// and this host's /proc.
    pub fn load(mode: AttachMode) -> Result<(Self, KernelMaps), Error> {
        Self::load_with_btf(mode, Path::new(offsets::VMLINUX_BTF), capacity::SOCK_OWNERS, Path::new("/proc"))
    }

    /// Check privileges and kernel features, load the object with this
    /// kernel's struct offsets (from the BTF at `btf_path`) and room for
    /// `max_sockets` socket owners and established connections followed,
    /// and attach every hook.
    pub fn load_with_btf(
        mode: AttachMode,
        btf_path: &Path,
        max_sockets: u32,
        proc_root: &Path,
    ) -> Result<(Self, KernelMaps), Error> {
        let (kernel, loader) = prepare(btf_path)?;
        // The trace ring buffer stays at its one page, never written.
        let (mut probes, mut maps, _) = Self::load_object(loader, mode, &kernel, max_sockets, None)?;
        // Once the programs follow every new connection (`older`).
        (maps.older_connections, maps.left_out_at_start) =
            older::enter(&mut probes._ebpf, &kernel.btf, &maps.listeners, proc_root);
        Ok((probes, maps))
    }

    /// `observer trace`'s own copy of the programs: loaded and attached as
    /// the daemon's are, room for `max_sockets` socket owners (the maps it
    /// does not read kept small: it counts nothing), its ring buffer
    /// `ring_bytes` large (a power of 2, in pages), queueing the events of
    /// `kinds` (observer-common's `trace_event` bits, the `TRACE_KINDS`
    /// global). The kernel maps come back for their LRU maps' evictions.
    /// Only the `hooks` named are attached (the kinds' own and those that
    /// record what their events need).
    pub fn load_for_trace(
        mode: AttachMode,
        ring_bytes: u32,
        kinds: u32,
        hooks: Vec<&'static str>,
        max_sockets: u32,
    ) -> Result<(Self, KernelMaps, TraceMaps), Error> {
        let setup = TraceSetup { ring_bytes, kinds, hooks };
        let (kernel, loader) = prepare(Path::new(offsets::VMLINUX_BTF))?;
        Self::load_object(loader, mode, &kernel, max_sockets, Some(setup))
    }

    /// Load the object with `loader` (`prepare`'s, given `kernel`'s BTF
    /// here) and attach its hooks.
    fn load_object(
        loader: EbpfLoader<'static>,
        mode: AttachMode,
        kernel: &Kernel,
        max_sockets: u32,
        trace: Option<TraceSetup>,
    ) -> Result<(Self, KernelMaps, TraceMaps), Error> {
        let Kernel { btf, facts, time_wait_counted_at_entry } = kernel;
        let time_wait_counted_at_entry = *time_wait_counted_at_entry;
        // Borrowing what this function holds from here on.
        let mut loader: EbpfLoader<'_> = loader;
        loader
            .btf(Some(btf))
            .override_global(maps::OFFSETS, &facts.offsets, true)
            .map_max_entries(maps::SOCK_OWNERS, max_sockets)
            .map_max_entries(maps::OPEN_CONNECTIONS, max_sockets);
        // Test builds only: the interval's connection counts made tiny, so
        // a test can fill them (tests/connection_ends.rs).
        #[cfg(feature = "failpoints")]
        if let Some(Some(entries)) = fail::eval("connections-entries", |arg| arg.and_then(|a| a.parse::<u32>().ok())) {
            for map in maps::CONNECTIONS_BUFFERS {
                loader.map_max_entries(map, entries);
            }
        }
        // Read-only once loaded: the verifier knows the daemon's 0 and
        // drops the programs' trace code, so their events cost it nothing.
        let kinds = trace.as_ref().map_or(0, |t| t.kinds);
        loader.override_global(maps::TRACE_KINDS, &kinds, true);
        if let Some(TraceSetup { ring_bytes, .. }) = &trace {
            loader.map_max_entries(maps::TRACE_EVENTS, *ring_bytes);
            // The maps only the daemon reads, kept small: a trace runs
            // beside the daemon, in its pod and under its memory limit
            // (`kubectl exec`). A full one only makes the programs count a
            // loss nobody reads; the event is queued first.
            for map in TRACE_UNREAD_MAPS {
                loader.map_max_entries(map, TRACE_UNREAD_ENTRIES);
            }
        }
        let mut ebpf = loader.load(EBPF_OBJECT).map_err(|e| Error::Load(e.into()))?;

        let only = trace.as_ref().map(|t| &t.hooks[..]);
        let mut attachments = hooks::attach_all(&mut ebpf, btf, facts, mode, only)?;
        let programs = attachments
            .iter()
            .flat_map(|a| a.programs.iter().map(move |p| (a.hook, a.mode, *p)))
            .map(|(hook, mode, program)| {
                ProgramHandle::open(&ebpf, hook, program, mode, facts.version)
                    .map_err(|reason| Error::Load(format!("{program}: {reason}").into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for a in &mut attachments {
            let own: Vec<&ProgramHandle> = programs.iter().filter(|p| p.hook == a.hook).collect();
            a.skipped_runs = stats::skipped_runs(&own);
            if a.mode == Mode::Absent {
                tracing::warn!(hook = a.hook, "not attached, its signal is absent: {}", a.target);
            } else {
                info!(hook = a.hook, mode = %a.mode, target = %a.target, missed_events = a.skipped_runs.as_str(), "attached");
            }
        }
        let uncounted = uncounted_skips(&attachments);
        if !uncounted.is_empty() {
            tracing::warn!(
                kernel = %format!("{}.{}", facts.version.0, facts.version.1),
                hooks = %uncounted.join(","),
                "this kernel does not count the runs of these hooks' programs it skips ({}): \
                 observer_kernel_missed_events_total has no series for them, and an event lost that way goes \
                 unreported",
                stats::SKIPS_COUNTED_SINCE
            );
        }
        let maps = take_maps(&mut ebpf, max_sockets)?;
        let trace =
            TraceMaps { events: take(&mut ebpf, maps::TRACE_EVENTS)?, dropped: take(&mut ebpf, maps::TRACE_DROPPED)? };
        Ok((
            Self { _ebpf: ebpf, attachments, programs, time_wait_counted_at_entry, kernel: facts.version },
            maps,
            trace,
        ))
    }
}

/// The hooks whose programs' skipped runs this kernel does not count.
pub fn uncounted_skips(attachments: &[Attachment]) -> Vec<&'static str> {
    attachments.iter().filter(|a| a.skipped_runs == SkippedRuns::Uncounted).map(|a| a.hook).collect()
}

/// What a load needs of the running kernel's BTF.
struct Kernel {
    /// aya's reading of it: the attach points, the iterator's target.
    btf: Btf,
    /// Struct offsets and the hooks' signatures, read with btf-rs.
    facts: offsets::KernelFacts,
    /// `offsets::time_wait_counted_at_entry`.
    time_wait_counted_at_entry: bool,
}

/// Privileges checked (the error names the capability), tracefs mounted,
/// the memlock limit lifted; then the kernel's BTF at `path`, read three
/// times, one after the other, so that no two readings are alive together
/// (they were the daemon's peak memory): mapped by btf-rs for the offsets
/// and facts (`offsets::load_btf`; at most the file's size, ~5.5 MB);
/// parsed from sysfs by aya's loader as it is made (its default, ~18 MiB),
/// which is let go at once; and parsed by aya from `path` (~12 MiB), for
/// the attach points and for the loader, given it at load.
fn prepare(path: &Path) -> Result<(Kernel, EbpfLoader<'static>), Error> {
    privileges::check()?;
    privileges::ensure_tracefs()?;
    raise_memlock_rlimit();
    let (facts, time_wait_counted_at_entry) = {
        let kernel_btf = offsets::load_btf(path)?;
        (
            offsets::KernelFacts::read(&kernel_btf, stats::kernel_version())?,
            offsets::time_wait_counted_at_entry(&kernel_btf),
        )
    };
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    let btf = Btf::parse_file(path, aya::Endianness::default())
        .map_err(|e| Error::Btf { path: path.to_owned(), source: e.into() })?;
    Ok((Kernel { btf, facts, time_wait_counted_at_entry }, loader))
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; lift it so map
/// creation does not fail there. Harmless (and a no-op) on newer kernels.
fn raise_memlock_rlimit() {
    let unlimited = nix::libc::RLIM_INFINITY;
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK, unlimited, unlimited);
}

/// What `observer trace`'s copy of the programs is loaded with.
struct TraceSetup {
    /// The ring buffer's size (a power of 2, in pages).
    ring_bytes: u32,
    /// The `trace_event` bits to queue.
    kinds: u32,
    /// The hooks to attach.
    hooks: Vec<&'static str>,
}

/// The maps `observer trace` never reads (its copy of the programs still
/// writes them), and their size there. Not the socket owners: its events
/// need them.
const TRACE_UNREAD_MAPS: [&str; 14] = [
    maps::PROC_COUNTERS_BUFFERS[0],
    maps::PROC_COUNTERS_BUFFERS[1],
    maps::CONNECT_ERRORS_BUFFERS[0],
    maps::CONNECT_ERRORS_BUFFERS[1],
    maps::KEYS_CREATED_BUFFERS[0],
    maps::KEYS_CREATED_BUFFERS[1],
    maps::LISTEN_OVERFLOWS_BUFFERS[0],
    maps::LISTEN_OVERFLOWS_BUFFERS[1],
    maps::CONNECTIONS_BUFFERS[0],
    maps::CONNECTIONS_BUFFERS[1],
    maps::CLOSED_LISTENERS,
    maps::TIME_WAIT_BY_NETNS,
    maps::OPEN_CONNECTIONS,
    maps::QUEUED_ENDS,
];
const TRACE_UNREAD_ENTRIES: u32 = 16;

/// `observer trace`'s maps: the events, and those it had no room for
/// (per CPU).
pub struct TraceMaps {
    pub events: RingBuf<MapData>,
    pub dropped: PerCpuArray<MapData, u64>,
}

fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, Error> {
    let map = ebpf.take_map(name).ok_or(Error::Map { map: name, source: Error::because("not in the object") })?;
    T::try_from(map).map_err(|e| Error::Map { map: name, source: e.into() })
}

fn take_maps(ebpf: &mut Ebpf, max_sockets: u32) -> Result<KernelMaps, Error> {
    Ok(KernelMaps {
        counters: Buffers {
            config: take::<Array<_, _>>(ebpf, maps::CONFIG)?,
            proc_counters: [
                take::<PerCpuHashMap<_, _, _>>(ebpf, maps::PROC_COUNTERS_BUFFERS[0])?,
                take::<PerCpuHashMap<_, _, _>>(ebpf, maps::PROC_COUNTERS_BUFFERS[1])?,
            ],
            connect_errors: [
                take::<PerCpuHashMap<_, _, _>>(ebpf, maps::CONNECT_ERRORS_BUFFERS[0])?,
                take::<PerCpuHashMap<_, _, _>>(ebpf, maps::CONNECT_ERRORS_BUFFERS[1])?,
            ],
            keys_created: [
                take::<AyaHashMap<_, _, _>>(ebpf, maps::KEYS_CREATED_BUFFERS[0])?,
                take::<AyaHashMap<_, _, _>>(ebpf, maps::KEYS_CREATED_BUFFERS[1])?,
            ],
            listen_overflows: [
                take::<PerCpuHashMap<_, _, _>>(ebpf, maps::LISTEN_OVERFLOWS_BUFFERS[0])?,
                take::<PerCpuHashMap<_, _, _>>(ebpf, maps::LISTEN_OVERFLOWS_BUFFERS[1])?,
            ],
            connections: [
                take::<AyaHashMap<_, _, _>>(ebpf, maps::CONNECTIONS_BUFFERS[0])?,
                take::<AyaHashMap<_, _, _>>(ebpf, maps::CONNECTIONS_BUFFERS[1])?,
            ],
        },
        open_connections_capacity: max_sockets,
        older_connections: Vec::new(),
        left_out_at_start: Default::default(),
        closed_listeners: take::<Queue<_, _>>(ebpf, maps::CLOSED_LISTENERS)?,
        queued_ends: take::<Queue<_, _>>(ebpf, maps::QUEUED_ENDS)?,
        listeners: take::<AyaHashMap<_, _, _>>(ebpf, maps::LISTENERS)?,
        exited: take::<AyaHashMap<_, _, _>>(ebpf, maps::EXITED)?,
        lost: take::<PerCpuArray<_, _>>(ebpf, maps::LOST)?,
        lru: LruMaps {
            sock_owners: take::<AyaHashMap<_, _, _>>(ebpf, maps::SOCK_OWNERS)?,
            inflight_connects: take::<AyaHashMap<_, _, _>>(ebpf, maps::INFLIGHT_CONNECTS)?,
            thread_connects: take::<AyaHashMap<_, _, _>>(ebpf, maps::THREAD_CONNECTS)?,
            churn: take::<PerCpuArray<_, _>>(ebpf, maps::LRU_CHURN)?,
            capacities: [max_sockets, capacity::LISTENERS, capacity::INFLIGHT_CONNECTS, capacity::THREAD_CONNECTS],
        },
        time_wait_by_netns: take::<PerCpuHashMap<_, _, _>>(ebpf, maps::TIME_WAIT_BY_NETNS)?,
    })
}

/// Tell the shared tracepoint programs which fallbacks are in use.
pub(crate) fn write_config(ebpf: &mut Ebpf, config: Config) -> Result<(), Error> {
    let map = ebpf
        .map_mut(maps::CONFIG)
        .ok_or(Error::Map { map: maps::CONFIG, source: Error::because("not in the object") })?;
    let mut array: Array<_, Config> =
        Array::try_from(map).map_err(|e| Error::Map { map: maps::CONFIG, source: e.into() })?;
    array.set(0, config, 0).map_err(|e| Error::Map { map: maps::CONFIG, source: e.into() })
}
