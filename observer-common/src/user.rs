//! Userspace-only impls: aya reads and writes these types as plain bytes.
use crate::{
    Actor, ClosedListener, Config, ConnectErrorKey, ConnectionCounts, ConnectionKey, InflightConnect, KernelOffsets,
    KeysCreated, ListenerDropKey, ListenerKey, OpenConnection, ProcCounters, ProcKey, QueuedEnd, ThreadConnect,
    TraceEvent,
};

// SAFETY: all are #[repr(C)], contain only integers and byte arrays, and
// have no implicit padding (sizes asserted in lib.rs / offsets.rs).
unsafe impl aya::Pod for Actor {}
unsafe impl aya::Pod for ProcKey {}
unsafe impl aya::Pod for ProcCounters {}
unsafe impl aya::Pod for ConnectErrorKey {}
unsafe impl aya::Pod for ListenerKey {}
unsafe impl aya::Pod for ListenerDropKey {}
unsafe impl aya::Pod for ClosedListener {}
unsafe impl aya::Pod for InflightConnect {}
unsafe impl aya::Pod for ThreadConnect {}
unsafe impl aya::Pod for Config {}
unsafe impl aya::Pod for KeysCreated {}
unsafe impl aya::Pod for KernelOffsets {}
unsafe impl aya::Pod for ConnectionKey {}
unsafe impl aya::Pod for ConnectionCounts {}
unsafe impl aya::Pod for OpenConnection {}
unsafe impl aya::Pod for TraceEvent {}
unsafe impl aya::Pod for QueuedEnd {}

impl Actor {
    /// The executable name as text (comm up to its first NUL).
    pub fn comm_str(&self) -> &str {
        let len = self.comm.iter().position(|&b| b == 0).unwrap_or(self.comm.len());
        core::str::from_utf8(&self.comm[..len]).unwrap_or("?")
    }
}
