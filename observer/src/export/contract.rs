//! The metric contract: every instrument observer exports, with its kind,
//! unit, meaning and attributes, in one place. The registrations take
//! their names, units and descriptions from here; `docs/metrics.md` is
//! rendered from here (a test keeps it equal), and the contract test holds
//! the Prometheus endpoint and the OTLP push to it.
//!
//! Names follow the OpenTelemetry semantic conventions where one exists
//! (attributes: `server.*`, `error.type`, `network.type`, `process.*`,
//! `k8s.*`, `otel.metric.overflow`), else live under `observer.`; usage next
//! to a limit is `.usage`/`.limit`. The conventions' gauges named `.count`
//! (`process.open_file_descriptor.count`,
//! `system.network.connection.count`) are not used: their Prometheus names
//! would end in `_count`, which Prometheus reserves for histograms and
//! summaries (`promtool check metrics` rejects them), so those are
//! `.usage` here too. The Prometheus name is derived as OpenTelemetry's
//! Prometheus exporter does (dots to underscores, unit suffix, `_total` for
//! counters).

/// How an instrument's values behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic sum (Prometheus counter, `_total`).
    Counter,
    /// Non-monotonic sum (Prometheus gauge).
    UpDownCounter,
    /// Last value (Prometheus gauge).
    Gauge,
    /// Distribution (Prometheus histogram).
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::UpDownCounter => "updowncounter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }

    /// The Prometheus metric type it becomes.
    pub fn prometheus_type(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::UpDownCounter | Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// An attribute value's type (OTLP keeps it; Prometheus labels are text,
/// and an integer attribute's label always parses as one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    String,
    Int,
    Bool,
}

impl Type {
    pub fn as_str(self) -> &'static str {
        match self {
            Type::String => "string",
            Type::Int => "int",
            Type::Bool => "boolean",
        }
    }
}

pub struct Attribute {
    pub key: &'static str,
    pub ty: Type,
    pub meaning: &'static str,
}

pub struct Instrument {
    pub name: &'static str,
    pub kind: Kind,
    /// UCUM, or a `{annotation}` (no Prometheus suffix); "" for none.
    pub unit: &'static str,
    pub description: &'static str,
    /// Groups of attributes; a series carries those that apply (see each
    /// attribute's meaning).
    pub attributes: &'static [&'static [Attribute]],
}

impl Instrument {
    /// The name on the Prometheus endpoint.
    pub fn prometheus_name(&self) -> String {
        let mut name = self.name.replace(['.', '-'], "_");
        let suffix = match self.unit {
            "s" => Some("seconds"),
            "By" => Some("bytes"),
            "1" => Some("ratio"),
            _ => None,
        };
        if let Some(suffix) = suffix {
            name.push('_');
            name.push_str(suffix);
        }
        if self.kind == Kind::Counter {
            name.push_str("_total");
        }
        name
    }

    /// Every attribute key this instrument may carry.
    pub fn keys(&self) -> impl Iterator<Item = &'static Attribute> {
        self.attributes.iter().flat_map(|group| group.iter())
    }
}

/// The label a Prometheus series carries for an attribute key.
pub fn prometheus_label(key: &str) -> String {
    key.replace(['.', '-'], "_")
}

/// Resource attributes, also put on every Prometheus series.
pub const RESOURCE: &[Attribute] = &[
    Attribute {
        key: "k8s.cluster.name",
        ty: Type::String,
        meaning: "The cluster, from OTEL_RESOURCE_ATTRIBUTES (e.g. `k8s.cluster.name=prod-eu`)",
    },
    Attribute { key: "k8s.node.name", ty: Type::String, meaning: "The node, from NODE_NAME (the DaemonSet sets it)" },
    Attribute { key: "host.name", ty: Type::String, meaning: "The host's name" },
];

const OVERFLOW: Attribute = Attribute {
    key: "otel.metric.overflow",
    ty: Type::Bool,
    meaning: "`true` on the series that counts what a cap folded (--max-processes, --max-destinations, \
              --max-series; --max-listeners: a namespace's other accept queues, summed): the folded part's \
              attributes are absent; totals stay exact",
};

/// Who: the process and, in a pod, its container and pod.
const PROCESS: &[Attribute] = &[
    Attribute {
        key: "process.pid",
        ty: Type::Int,
        meaning: "The process (thread group id); 0 for sockets whose process observer never saw (opened before \
                  it started), charged to their pod by the socket's cgroup",
    },
    Attribute {
        key: "process.executable.name",
        ty: Type::String,
        meaning: "The base name of the file the process runs (/proc/PID/exe) when observer first saw it; its comm if it ended first; `unknown` for pid 0",
    },
    Attribute { key: "container.id", ty: Type::String, meaning: "The container, when the process runs in a pod" },
    Attribute { key: "k8s.pod.uid", ty: Type::String, meaning: "The pod, when the process runs in one" },
    Attribute { key: "k8s.pod.name", ty: Type::String, meaning: "The pod's name, when kubelet's pod logs name it" },
    Attribute { key: "k8s.namespace.name", ty: Type::String, meaning: "The pod's namespace, likewise" },
    Attribute { key: "k8s.container.name", ty: Type::String, meaning: "The container's name, likewise" },
    OVERFLOW,
];

const NETWORK_TYPE: &[Attribute] =
    &[Attribute { key: "network.type", ty: Type::String, meaning: "`ipv4` or `ipv6` (the socket's family)" }];

const DESTINATION: &[Attribute] = &[
    Attribute { key: "server.address", ty: Type::String, meaning: "The destination's IP address" },
    Attribute { key: "server.port", ty: Type::Int, meaning: "The destination's port" },
];

const ERROR_TYPE: &[Attribute] = &[Attribute {
    key: "error.type",
    ty: Type::String,
    meaning: "The errno connect() returned (or the connection ended with), by name: `EADDRNOTAVAIL`, \
              `ECONNREFUSED`, `ETIMEDOUT`, ...",
}];

const CONNECTION: &[Attribute] = &[
    Attribute {
        key: "observer.connection.direction",
        ty: Type::String,
        meaning: "`outbound` (this host connected) or `inbound` (a listener here accepted)",
    },
    Attribute { key: "server.address", ty: Type::String, meaning: "Outbound: the server's IP address" },
    Attribute {
        key: "server.port",
        ty: Type::Int,
        meaning: "Outbound: the server's port; inbound: the listener's port",
    },
];

const LIFETIME_BOUND: &[Attribute] = &[Attribute {
    key: "observer.le",
    ty: Type::String,
    meaning: "A bound in seconds (`0.001`, `0.004`, ... powers of 4 ms, then `+Inf`): the series counts the \
              connections that took at most that long (to live; to shake hands: up to `16.384`), cumulative as a \
              histogram's buckets (`observer_le=\"+Inf\"` counts all). Not `le`, which Prometheus keeps for \
              histograms: `histogram_quantile` reads them after `label_replace(..., \"le\", \"$1\", \"observer_le\", \
              \"(.*)\")`",
}];

const LISTENER_PORT: &[Attribute] = &[Attribute { key: "server.port", ty: Type::Int, meaning: "The listener's port" }];

const LISTENER: &[Attribute] = &[
    Attribute { key: "server.address", ty: Type::String, meaning: "The listener's address" },
    Attribute { key: "server.port", ty: Type::Int, meaning: "The listener's port" },
];

/// A network namespace, and its pod when one owns it.
const NETWORK_NAMESPACE: &[Attribute] = &[
    Attribute {
        key: "observer.network_namespace",
        ty: Type::String,
        meaning: "`host`, or the namespace's inode number (`ls -L -i /proc/<pid>/ns/net`)",
    },
    Attribute { key: "k8s.pod.uid", ty: Type::String, meaning: "The pod whose namespace it is, when known" },
    Attribute { key: "k8s.pod.name", ty: Type::String, meaning: "That pod's name" },
    Attribute { key: "k8s.namespace.name", ty: Type::String, meaning: "That pod's namespace" },
];

const SOURCE: &[Attribute] =
    &[Attribute { key: "source.address", ty: Type::String, meaning: "The local address connections leave from" }];

const HOOK: Attribute = Attribute {
    key: "observer.hook",
    ty: Type::String,
    meaning: "The kernel function or event observed (`inet_stream_connect`, `inet_csk_accept`, ...)",
};

const MAP: &[Attribute] = &[Attribute { key: "observer.map.name", ty: Type::String, meaning: "The kernel map" }];

const INSTRUMENT: &[Attribute] =
    &[Attribute { key: "observer.instrument", ty: Type::String, meaning: "The counter, by its name here" }];

const EXPORTER: &[Attribute] =
    &[Attribute { key: "observer.exporter", ty: Type::String, meaning: "`prometheus` or `otlp`" }];

/// One sysctl of a network namespace, a gauge of its own.
const fn sysctl(name: &'static str, unit: &'static str, description: &'static str) -> Instrument {
    Instrument { name, kind: Kind::Gauge, unit, description, attributes: &[NETWORK_NAMESPACE] }
}

// The signals.

pub const TCP_CONNECTS: Instrument = Instrument {
    name: "observer.tcp.connects",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "TCP connection attempts (SYN sent) by process",
    attributes: &[PROCESS, NETWORK_TYPE],
};

pub const TCP_ACCEPTS: Instrument = Instrument {
    name: "observer.tcp.accepts",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "TCP connections accepted by process",
    attributes: &[PROCESS, NETWORK_TYPE],
};

pub const TCP_TIME_WAIT_ENTRIES: Instrument = Instrument {
    name: "observer.tcp.time_wait_entries",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "TCP sockets that entered TIME_WAIT, by the process that closed them first (its close() or \
                  shutdown() sent the first FIN)",
    attributes: &[PROCESS, NETWORK_TYPE],
};

pub const TCP_CONNECT_ERRORS: Instrument = Instrument {
    name: "observer.tcp.connect_errors",
    kind: Kind::Counter,
    unit: "{error}",
    description: "connect() failures by process, errno (error.type) and destination",
    attributes: &[PROCESS, NETWORK_TYPE, ERROR_TYPE, DESTINATION],
};

pub const TCP_LISTEN_OVERFLOWS: Instrument = Instrument {
    name: "observer.tcp.listen_overflows",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "Connections a listener dropped because its accept queue was full (TcpExtListenOverflows), by \
                  owner and port; SYNs meeting a full SYN queue are observer.tcp.syn_queue_full",
    attributes: &[PROCESS, NETWORK_TYPE, LISTENER_PORT],
};

const SYN_QUEUE_ACTION: &[Attribute] = &[Attribute {
    key: "observer.syn_queue.action",
    ty: Type::String,
    meaning: "What the kernel did with the SYN: `syncookie`, answered with a SYN cookie instead of a queued \
              request (TcpExtTCPReqQFullDoCookies; the connection can still complete); `drop`, dropped with \
              syncookies off (TcpExtTCPReqQFullDrop; the client resends it 1 s later)",
}];

pub const TCP_SYN_QUEUE_FULL: Instrument = Instrument {
    name: "observer.tcp.syn_queue_full",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "SYNs a listener received with its SYN queue (requests awaiting the handshake's last ACK) full, \
                  or with net.ipv4.tcp_syncookies=2, by owner, port and what the kernel did instead of queueing \
                  them; a SYN flood, or clients whose last ACK is lost. Counted where the kernel counts them \
                  (tcp_syn_flood_action, fentry or kprobe): absent where that cannot be attached \
                  (observer_probe_info{observer_hook=\"syn_queue_full\",observer_probe_mode=\"none\"})",
    attributes: &[PROCESS, NETWORK_TYPE, LISTENER_PORT, SYN_QUEUE_ACTION],
};

pub const TCP_CONNECTIONS_ESTABLISHED: Instrument = Instrument {
    name: "observer.tcp.connections.established",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "TCP connections that reached ESTABLISHED, by process, direction and far end (outbound: the \
                  server; inbound: the listener, charged to its owner); beside observer.tcp.connects, the \
                  attempts, and observer.tcp.connections.closed, their ends",
    attributes: &[PROCESS, NETWORK_TYPE, CONNECTION],
};

pub const TCP_CONNECTIONS_CLOSED: Instrument = Instrument {
    name: "observer.tcp.connections.closed",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "TCP connections that left ESTABLISHED (a FIN sent or received, a reset), by how long they had \
                  been established (observer.le), process, direction and far end; a missing keep-alive shows as many \
                  short lifetimes. Only connections established while observer ran (an older one's lifetime is \
                  unknown: its end leaves observer.tcp.connection.usage, not this)",
    attributes: &[PROCESS, NETWORK_TYPE, CONNECTION, LIFETIME_BOUND],
};

pub const TCP_CONNECTIONS_CLOSED_BY_PEER: Instrument = Instrument {
    name: "observer.tcp.connections.closed_by_peer",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "Of observer.tcp.connections.closed, those the far end closed first (its FIN came before this \
                  side's: ESTABLISHED to CLOSE_WAIT), by process, direction and far end. Outbound and near every \
                  new connection, within milliseconds, while the connections open toward the server stay flat: \
                  a server-side limit (observer.tcp.connection.limit.inferred)",
    attributes: &[PROCESS, NETWORK_TYPE, CONNECTION],
};

pub const TCP_HANDSHAKES: Instrument = Instrument {
    name: "observer.tcp.handshakes",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "Outbound TCP handshakes that completed (SYN sent to ESTABLISHED), by how long they took (observer.le: 1 \
                  s more per lost SYN, a round trip otherwise), process and server; the SYNs observer saw",
    attributes: &[PROCESS, NETWORK_TYPE, CONNECTION, LIFETIME_BOUND],
};

pub const TCP_HANDSHAKE_RETRANSMITS: Instrument = Instrument {
    name: "observer.tcp.handshake.retransmits",
    kind: Kind::Counter,
    unit: "{packet}",
    description: "TCP handshake packets sent again: outbound, the SYNs a process resent to a server (each lost one \
                  costs the connect 1 s, then 2 s, 4 s); inbound, the SYN-ACKs a listener resent (a lost last ACK, a \
                  full accept queue). Counted when each handshake ends (established, or failed); together the \
                  kernel's TcpExtTCPSynRetrans, less the SYN-ACKs of handshakes that never completed",
    attributes: &[PROCESS, NETWORK_TYPE, CONNECTION],
};

pub const TCP_CONNECTION_USAGE: Instrument = Instrument {
    name: "observer.tcp.connection.usage",
    kind: Kind::Gauge,
    unit: "{connection}",
    description: "TCP connections ESTABLISHED now, by process, direction and far end (what `ss state \
                  established` lists); those established before observer started count from its start (the TCP socket \
                  iterator, Linux 5.9+)",
    attributes: &[PROCESS, NETWORK_TYPE, CONNECTION],
};

pub const TCP_CONNECTION_LIMIT: Instrument = Instrument {
    name: "observer.tcp.connection.limit",
    kind: Kind::Gauge,
    unit: "{connection}",
    description: "A connection limit the user declared (--connection-limits): outbound, a server's, for \
                  every client on every node (sum observer.tcp.connection.usage over the fleet against it); \
                  inbound, this node's listeners' on a port",
    attributes: &[CONNECTION],
};

pub const TCP_CONNECTION_LIMIT_INFERRED: Instrument = Instrument {
    name: "observer.tcp.connection.limit.inferred",
    kind: Kind::Gauge,
    unit: "{connection}",
    description: "A server's connection limit nobody declared, as this node sees it: over the last 15 s the \
                  connections open toward it stayed flat at this count, while new ones kept being established \
                  and nearly every one that ended was closed by the server within 16 ms (far more open than such \
                  short connections would keep open: held ones, with the new ones turned away). Present only \
                  while that holds; outbound only",
    attributes: &[CONNECTION],
};

pub const TCP_CONNECTION_LIMIT_INFERENCE_UNFOLLOWED: Instrument = Instrument {
    name: "observer.tcp.connection.limit.inference.unfollowed",
    kind: Kind::Gauge,
    unit: "{server}",
    description: "Servers this node had connections toward in the last round that the inference of \
                  observer.tcp.connection.limit.inferred did not judge: it follows 1024 at once, and takes \
                  on others as those are idle for 15 s (should stay 0)",
    attributes: &[],
};

// The node's ceilings, next to their usage.

pub const OPEN_FILE_DESCRIPTORS: Instrument = Instrument {
    name: "observer.process.open_file_descriptor.usage",
    kind: Kind::Gauge,
    unit: "{file_descriptor}",
    description: "Open file descriptors of the process (those that connect, accept or listen); at \
                  observer.process.open_file_descriptor.limit, accept() and socket() fail with EMFILE",
    attributes: &[PROCESS],
};

pub const OPEN_FILE_DESCRIPTOR_LIMIT: Instrument = Instrument {
    name: "observer.process.open_file_descriptor.limit",
    kind: Kind::Gauge,
    unit: "{file_descriptor}",
    description: "The process's soft RLIMIT_NOFILE",
    attributes: &[PROCESS],
};

pub const EPHEMERAL_PORT_USAGE: Instrument = Instrument {
    name: "observer.ephemeral_port.usage",
    kind: Kind::Gauge,
    unit: "{port}",
    description: "Local ports of the ephemeral range in use toward a destination (all states holding one, \
                  TIME_WAIT included), for the most used destinations of each namespace; connect() fails with \
                  EADDRNOTAVAIL at observer.ephemeral_port.limit",
    attributes: &[NETWORK_NAMESPACE, SOURCE, DESTINATION],
};

pub const EPHEMERAL_PORT_LIMIT: Instrument = Instrument {
    name: "observer.ephemeral_port.limit",
    kind: Kind::Gauge,
    unit: "{port}",
    description: "Local ports connect() can use toward one destination: ip_local_port_range minus the reserved \
                  ports",
    attributes: &[NETWORK_NAMESPACE],
};

pub const EPHEMERAL_PORT_TIME_WAIT: Instrument = Instrument {
    name: "observer.ephemeral_port.time_wait",
    kind: Kind::Gauge,
    unit: "{port}",
    description: "Of observer.ephemeral_port.usage, the ports held by TIME_WAIT: connections toward the \
                  destination this side closed within the last minute. Near observer.ephemeral_port.limit, \
                  missing connection reuse is what runs the ports out",
    attributes: &[NETWORK_NAMESPACE, SOURCE, DESTINATION],
};

pub const EPHEMERAL_PORT_TIME_TO_EXHAUSTION: Instrument = Instrument {
    name: "observer.ephemeral_port.time_to_exhaustion",
    kind: Kind::Gauge,
    unit: "s",
    description: "Seconds until no ephemeral port is left toward a destination, at the rate its use grew over the \
                  last minute (0: exhausted); only for destinations whose use is growing",
    attributes: &[NETWORK_NAMESPACE, SOURCE, DESTINATION],
};

pub const CONNTRACK_USAGE: Instrument = Instrument {
    name: "observer.conntrack.usage",
    kind: Kind::Gauge,
    unit: "{entry}",
    description: "Entries of the namespace's connection tracking table now (nf_conntrack_count), where \
                  nf_conntrack is loaded; at observer.conntrack.limit new connections' packets are dropped",
    attributes: &[NETWORK_NAMESPACE],
};

pub const CONNTRACK_LIMIT: Instrument = Instrument {
    name: "observer.conntrack.limit",
    kind: Kind::Gauge,
    unit: "{entry}",
    description: "nf_conntrack_max, which the kernel holds each namespace's count against (set on the host)",
    attributes: &[NETWORK_NAMESPACE],
};

const CONNTRACK_DROP_REASON: &[Attribute] = &[Attribute {
    key: "observer.conntrack.drop_reason",
    ty: Type::String,
    meaning: "`table_full`: a new connection's packet dropped, the table full and nothing to evict (the \
              statistics' `drop`); `early_drop`: an unanswered connection evicted to make room; \
              `insert_failed`: a packet dropped, its entry clashing with another",
}];

pub const CONNTRACK_DROPS: Instrument = Instrument {
    name: "observer.conntrack.drops",
    kind: Kind::Counter,
    unit: "{packet}",
    description: "Drops of the namespace's connection tracking table (/proc/net/stat/nf_conntrack) since observer \
                  first read it (all of them for a namespace created later)",
    attributes: &[NETWORK_NAMESPACE, CONNTRACK_DROP_REASON],
};

pub const TIME_WAIT_USAGE: Instrument = Instrument {
    name: "observer.time_wait.usage",
    kind: Kind::Gauge,
    unit: "{connection}",
    description: "TCP sockets in TIME_WAIT now (ss state time-wait), from the namespace's latest dump; beyond \
                  observer.sysctl.net.ipv4.tcp_max_tw_buckets, sockets skip TIME_WAIT",
    attributes: &[NETWORK_NAMESPACE],
};

pub const LISTEN_QUEUE_USAGE: Instrument = Instrument {
    name: "observer.listen_queue.usage",
    kind: Kind::Gauge,
    unit: "{connection}",
    description: "Connections waiting in a listener's accept queue (ss -lnt Recv-Q), with the process that \
                  listens when known, else its namespace",
    attributes: &[LISTENER, PROCESS, NETWORK_NAMESPACE],
};

pub const LISTEN_QUEUE_LIMIT: Instrument = Instrument {
    name: "observer.listen_queue.limit",
    kind: Kind::Gauge,
    unit: "{connection}",
    description: "A listener's accept queue limit, its backlog (ss -lnt Send-Q)",
    attributes: &[LISTENER, PROCESS, NETWORK_NAMESPACE],
};

pub const SYSCTL_PORT_RANGE_LOW: Instrument = sysctl(
    "observer.sysctl.net.ipv4.ip_local_port_range.low",
    "{port}",
    "The first port of net.ipv4.ip_local_port_range",
);
pub const SYSCTL_PORT_RANGE_HIGH: Instrument = sysctl(
    "observer.sysctl.net.ipv4.ip_local_port_range.high",
    "{port}",
    "The last port of net.ipv4.ip_local_port_range",
);
pub const SYSCTL_TCP_FIN_TIMEOUT: Instrument = sysctl(
    "observer.sysctl.net.ipv4.tcp_fin_timeout",
    "s",
    "net.ipv4.tcp_fin_timeout: how long an orphaned FIN_WAIT2 socket lives (not TIME_WAIT's 60 s)",
);
pub const SYSCTL_TCP_TW_REUSE: Instrument = sysctl(
    "observer.sysctl.net.ipv4.tcp_tw_reuse",
    "",
    "net.ipv4.tcp_tw_reuse: 0 off, 1 on, 2 loopback only (new outgoing connections may reuse TIME_WAIT ports)",
);
pub const SYSCTL_SOMAXCONN: Instrument = sysctl(
    "observer.sysctl.net.core.somaxconn",
    "{connection}",
    "net.core.somaxconn: the largest accept queue listen() may ask for",
);
pub const SYSCTL_TCP_MAX_SYN_BACKLOG: Instrument = sysctl(
    "observer.sysctl.net.ipv4.tcp_max_syn_backlog",
    "{connection}",
    "net.ipv4.tcp_max_syn_backlog: half-open connections a listener may hold",
);
pub const SYSCTL_TCP_MAX_TW_BUCKETS: Instrument = sysctl(
    "observer.sysctl.net.ipv4.tcp_max_tw_buckets",
    "{connection}",
    "net.ipv4.tcp_max_tw_buckets: TIME_WAIT sockets the namespace may hold; beyond, sockets skip TIME_WAIT \
     (TCPTimeWaitOverflow)",
);

// observer's own health.

pub const PROBE_INFO: Instrument = Instrument {
    name: "observer.probe.info",
    kind: Kind::Gauge,
    unit: "",
    description: "1 for each hook and the mode it is attached in",
    attributes: &[&[
        HOOK,
        Attribute {
            key: "observer.probe.mode",
            ty: Type::String,
            meaning: "How it is attached: `fentry`, `fexit`, `kprobe`, `kretprobe`, `tracepoint`, `tp_btf`, \
                      `sock_diag`",
        },
        Attribute {
            key: "observer.probe.missed_events",
            ty: Type::String,
            meaning: "Whether this kernel counts the runs of its programs it skips: `counted`, `uncounted` (too \
                      old for that program type), `no_program`",
        },
    ]],
};

pub const KERNEL_LOST_UPDATES: Instrument = Instrument {
    name: "observer.kernel.lost_updates",
    kind: Kind::Counter,
    unit: "{update}",
    description: "Kernel map updates lost because the map was full (should stay 0): counter updates, and the \
                  connections from before observer started that OPEN_CONNECTIONS had no room for",
    attributes: &[MAP],
};

pub const KERNEL_MISSED_EVENTS: Instrument = Instrument {
    name: "observer.kernel.missed_events",
    kind: Kind::Counter,
    unit: "{event}",
    description: "Hook events the kernel did not hand to observer's program because a BPF program was already \
                  running on that CPU (recursion protection; counted by Linux 5.12+ for fentry/tp_btf, 6.7+ for \
                  kprobes and tracepoints). When not 0, counts may be short by up to this many events.",
    attributes: &[&[HOOK, Attribute { key: "observer.program", ty: Type::String, meaning: "The BPF program" }]],
};

pub const KERNEL_UNSEEN_EVENTS: Instrument = Instrument {
    name: "observer.kernel.unseen_events",
    kind: Kind::Counter,
    unit: "{event}",
    description: "Events the kernel counted that observer's programs never ran for, with no skipped run \
                  reported, each namespace's own count against observer's. When not 0, those counts are short \
                  by this many.",
    attributes: &[&[Attribute {
        key: "observer.event",
        ty: Type::String,
        meaning: "`time_wait_entry` (against TcpExtTW + TcpExtTWKilled, every 10 rounds, from each \
                  namespace's first check: the daemon's first round, or within 10 rounds of a new \
                  namespace), `listen_overflow` (against TcpExtListenOverflows, where programs count \
                  overflows, likewise), `connection` (a \
                  connection whose start or end was missed: the namespace's ESTABLISHED sockets against \
                  observer.tcp.connection.usage's ledger, at a moment nothing in it changed; off once a map \
                  lost a connection update, counted apart)",
    }]],
};

pub const COLLECTION_DURATION: Instrument = Instrument {
    name: "observer.collection.duration",
    kind: Kind::Histogram,
    unit: "s",
    description: "How long each round (the sweep of the node and the read of the kernel maps) took, buckets from \
                  1 ms to 10 s; near the interval means rounds fall behind",
    attributes: &[],
};

pub const COLLECTION_FAILURES: Instrument = Instrument {
    name: "observer.collection.failures",
    kind: Kind::Counter,
    unit: "{collection}",
    description: "Collections that failed (logged once per streak, retried every interval)",
    attributes: &[],
};

pub const NETWORK_NAMESPACE_USAGE: Instrument = Instrument {
    name: "observer.network_namespace.usage",
    kind: Kind::Gauge,
    unit: "{namespace}",
    description: "Network namespaces by how the last round read them (at most --max-namespaces are read)",
    attributes: &[&[Attribute {
        key: "observer.reading",
        ty: Type::String,
        meaning: "`current` (ports per destination exact as of the round), `deferred` (changed, waiting for \
                  their turn to be dumped, or a namespace at half a ceiling changing slowly, dumped at least every \
                  5 s; their last reading is exported), `unread` (beyond --max-namespaces, or \
                  their files could not be opened)",
    }]],
};

pub const MAP_USAGE: Instrument = Instrument {
    name: "observer.map.usage",
    kind: Kind::Gauge,
    unit: "{entry}",
    description: "Entries in each kernel map now (see observer.map.limit)",
    attributes: &[MAP],
};

pub const MAP_LIMIT: Instrument = Instrument {
    name: "observer.map.limit",
    kind: Kind::Gauge,
    unit: "{entry}",
    description: "Maximum entries of each kernel map",
    attributes: &[MAP],
};

pub const MAP_EVICTIONS: Instrument = Instrument {
    name: "observer.map.evictions",
    kind: Kind::Counter,
    unit: "{entry}",
    description: "Entries an LRU map dropped to make room (at least this many): SOCK_OWNERS evictions mean \
                  TIME_WAIT entries charged to no process, INFLIGHT_CONNECTS/THREAD_CONNECTS evictions mean lost \
                  connect() errors; raise --max-sockets when SOCK_OWNERS evicts",
    attributes: &[MAP],
};

pub const SERIES_USAGE: Instrument = Instrument {
    name: "observer.series.usage",
    kind: Kind::Gauge,
    unit: "{series}",
    description: "Series each counter has now (see observer.series.limit)",
    attributes: &[INSTRUMENT],
};

pub const SERIES_LIMIT: Instrument = Instrument {
    name: "observer.series.limit",
    kind: Kind::Gauge,
    unit: "{series}",
    description: "Series a counter may have (--max-series); beyond, new ones are counted in an overflow series \
                  per errno",
    attributes: &[INSTRUMENT],
};

pub const SERIES_FOLDED: Instrument = Instrument {
    name: "observer.series.folded",
    kind: Kind::Counter,
    unit: "{update}",
    description: "Updates of a counter charged to an overflow series because a cap was reached \
                  (--max-processes, --max-destinations, --max-series): totals stay exact, the process or \
                  destination is lost; raise the cap named in the log",
    attributes: &[INSTRUMENT],
};

pub const HTTP_CONNECTIONS_CLOSED: Instrument = Instrument {
    name: "observer.http.connections.closed",
    kind: Kind::Counter,
    unit: "{connection}",
    description: "Connections to the metrics endpoint closed by its cap of open connections (clients that never \
                  finish a request)",
    attributes: &[&[Attribute {
        key: "observer.close_reason",
        ty: Type::String,
        meaning: "`evicted` (the oldest without a request, to make room) or `refused` (every one busy)",
    }]],
};

pub const EXPORT_ATTEMPTS: Instrument = Instrument {
    name: "observer.export.attempts",
    kind: Kind::Counter,
    unit: "{export}",
    description: "Exports attempted, by exporter: Prometheus scrapes served, OTLP pushes sent",
    attributes: &[EXPORTER],
};

pub const EXPORT_FAILURES: Instrument = Instrument {
    name: "observer.export.failures",
    kind: Kind::Counter,
    unit: "{export}",
    description: "Exports that failed, by exporter (OTLP: retried with backoff; cumulative counts arrive complete \
                  once the collector answers again)",
    attributes: &[EXPORTER],
};

pub const EXPORT_DROPPED_BATCHES: Instrument = Instrument {
    name: "observer.export.dropped_batches",
    kind: Kind::Counter,
    unit: "{batch}",
    description: "OTLP delta batches dropped because the collector was unreachable for longer than the buffer \
                  holds",
    attributes: &[EXPORTER],
};

pub const EXPORT_PENDING_BATCHES: Instrument = Instrument {
    name: "observer.export.pending_batches",
    kind: Kind::Gauge,
    unit: "{batch}",
    description: "OTLP batches waiting to be sent (1 at most with cumulative temporality)",
    attributes: &[EXPORTER],
};

/// Instruments only one hook counts, by that hook's name: absent on a
/// kernel where the hook cannot attach (`observer_probe_info` then says
/// `observer_probe_mode="none"` for it), never approximated another way.
pub const ONLY_WITH_HOOK: &[(&Instrument, &str)] = &[(&TCP_SYN_QUEUE_FULL, crate::probes::hooks::SYN_QUEUE_FULL)];

/// Every instrument, in the order of `docs/metrics.md`.
pub const ALL: &[&Instrument] = &[
    &TCP_CONNECTS,
    &TCP_ACCEPTS,
    &TCP_TIME_WAIT_ENTRIES,
    &TCP_CONNECT_ERRORS,
    &TCP_LISTEN_OVERFLOWS,
    &TCP_CONNECTIONS_ESTABLISHED,
    &TCP_CONNECTIONS_CLOSED,
    &TCP_CONNECTIONS_CLOSED_BY_PEER,
    &TCP_HANDSHAKES,
    &TCP_HANDSHAKE_RETRANSMITS,
    &TCP_SYN_QUEUE_FULL,
    &TCP_CONNECTION_USAGE,
    &TCP_CONNECTION_LIMIT,
    &TCP_CONNECTION_LIMIT_INFERRED,
    &TCP_CONNECTION_LIMIT_INFERENCE_UNFOLLOWED,
    &OPEN_FILE_DESCRIPTORS,
    &OPEN_FILE_DESCRIPTOR_LIMIT,
    &EPHEMERAL_PORT_USAGE,
    &EPHEMERAL_PORT_LIMIT,
    &EPHEMERAL_PORT_TIME_WAIT,
    &EPHEMERAL_PORT_TIME_TO_EXHAUSTION,
    &TIME_WAIT_USAGE,
    &LISTEN_QUEUE_USAGE,
    &LISTEN_QUEUE_LIMIT,
    &CONNTRACK_USAGE,
    &CONNTRACK_LIMIT,
    &CONNTRACK_DROPS,
    &SYSCTL_PORT_RANGE_LOW,
    &SYSCTL_PORT_RANGE_HIGH,
    &SYSCTL_TCP_FIN_TIMEOUT,
    &SYSCTL_TCP_TW_REUSE,
    &SYSCTL_SOMAXCONN,
    &SYSCTL_TCP_MAX_SYN_BACKLOG,
    &SYSCTL_TCP_MAX_TW_BUCKETS,
    &PROBE_INFO,
    &KERNEL_LOST_UPDATES,
    &KERNEL_MISSED_EVENTS,
    &KERNEL_UNSEEN_EVENTS,
    &COLLECTION_DURATION,
    &COLLECTION_FAILURES,
    &NETWORK_NAMESPACE_USAGE,
    &MAP_USAGE,
    &MAP_LIMIT,
    &MAP_EVICTIONS,
    &SERIES_USAGE,
    &SERIES_LIMIT,
    &SERIES_FOLDED,
    &HTTP_CONNECTIONS_CLOSED,
    &EXPORT_ATTEMPTS,
    &EXPORT_FAILURES,
    &EXPORT_DROPPED_BATCHES,
    &EXPORT_PENDING_BATCHES,
];

/// `docs/metrics.md`: the contract as a reader wants it.
pub fn markdown() -> String {
    let mut out = String::from(
        "# observer's metrics\n\n\
         Generated from `observer/src/export/contract.rs` (edit that, then run\n\
         `OBSERVER_BLESS=1 cargo test -p observer contract`); a test holds the\n\
         Prometheus endpoint and the OTLP push to it: every instrument with this\n\
         kind and unit, no attribute beyond its list, integer attributes always\n\
         integers, no instrument that is not here. Breaking changes are listed in\n\
         `CHANGELOG.md`.\n\n\
         Names follow the OpenTelemetry semantic conventions where one exists,\n\
         else live under `observer.` (gauges the conventions name `.count` are\n\
         `.usage` here: Prometheus reserves `_count` for histograms). The Prometheus name is OpenTelemetry's:\n\
         dots become underscores, the unit adds a suffix (`s`: `_seconds`;\n\
         `{...}` adds none), counters end in `_total`; attribute keys become\n\
         labels the same way (`process.pid`: `process_pid`).\n\n\
         Every series also carries the resource's node attributes:\n\n",
    );
    for a in RESOURCE {
        out.push_str(&format!("- `{}` ({}): {}\n", a.key, a.ty.as_str(), a.meaning));
    }
    out.push_str("\n| Instrument | Prometheus | Kind | Unit | Description |\n|---|---|---|---|---|\n");
    for i in ALL {
        out.push_str(&format!(
            "| [`{}`](#{}) | `{}` | {} | `{}` | {} |\n",
            i.name,
            i.name.replace('.', ""),
            i.prometheus_name(),
            i.kind.as_str(),
            if i.unit.is_empty() { "1" } else { i.unit },
            i.description.split(['.', ';']).next().unwrap_or_default().trim()
        ));
    }
    for i in ALL {
        out.push_str(&format!(
            "\n## {}\n\n{} `{}`, unit `{}`. {}\n",
            i.name,
            i.kind.as_str(),
            i.prometheus_name(),
            if i.unit.is_empty() { "1" } else { i.unit },
            i.description
        ));
        let mut keys: Vec<&Attribute> = Vec::new();
        for a in i.keys() {
            if !keys.iter().any(|k| k.key == a.key) {
                keys.push(a);
            }
        }
        if keys.is_empty() {
            out.push_str("\nNo attributes.\n");
            continue;
        }
        out.push_str("\n| Attribute | Type | Meaning |\n|---|---|---|\n");
        for a in keys {
            out.push_str(&format!("| `{}` | {} | {} |\n", a.key, a.ty.as_str(), a.meaning));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn names_are_unique_and_attributes_typed_once() {
        let mut names = HashSet::new();
        for i in ALL {
            assert!(names.insert(i.prometheus_name()), "{} twice", i.name);
            let mut types = std::collections::HashMap::new();
            for a in i.keys() {
                assert_eq!(*types.entry(a.key).or_insert(a.ty), a.ty, "{}: {} with two types", i.name, a.key);
            }
        }
    }

    #[test]
    fn prometheus_names_as_the_exporter_derives_them() {
        assert_eq!(TCP_CONNECTS.prometheus_name(), "observer_tcp_connects_total");
        assert_eq!(
            EPHEMERAL_PORT_TIME_TO_EXHAUSTION.prometheus_name(),
            "observer_ephemeral_port_time_to_exhaustion_seconds"
        );
        assert_eq!(OPEN_FILE_DESCRIPTORS.prometheus_name(), "observer_process_open_file_descriptor_usage");
    }

    /// The README's metric tables (what question each answers) name every
    /// instrument of the contract and nothing else, so the two cannot
    /// drift apart (`observer_sysctl_*` stands for the sysctl gauges).
    #[test]
    fn the_readme_names_every_instrument_and_only_those() {
        let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README.md");
        let section = readme.split("\n## Metrics\n").nth(1).expect("a Metrics section").split("\n## ").next().unwrap();
        let named: Vec<&str> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .flat_map(|row| row.split('|').next().unwrap().split('`'))
            .filter(|t| t.starts_with("observer_"))
            .collect();
        let covers = |token: &str, name: &str| match token.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == token,
        };
        let contract: Vec<String> = ALL.iter().map(|i| i.prometheus_name()).collect();
        for token in &named {
            assert!(contract.iter().any(|n| covers(token, n)), "README names {token}, which the contract has not");
        }
        for name in &contract {
            assert!(named.iter().any(|t| covers(t, name)), "README's metric tables leave out {name}");
        }
    }

    /// docs/metrics.md is this module rendered (OBSERVER_BLESS=1 writes it).
    #[test]
    fn contract_document_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
        let want = markdown();
        if std::env::var_os("OBSERVER_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(have == want, "docs/metrics.md is stale: run OBSERVER_BLESS=1 cargo test -p observer contract");
    }
}
