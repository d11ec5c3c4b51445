// What a user adjusts, as in other monitoring mixins: override with
// (import 'mixin.libsonnet') + { _config+:: { observerSelector: 'job="observer"' } }.
{
  _config+:: {
    // Selects observer's series in every rule: its scrape job (a
    // PodMonitor's job is <namespace>/<name>; OTLP through a collector
    // names it after service.name, observer).
    observerSelector: 'job=~".*observer.*"',
    // Where each alert's runbook is: %s is the alert's name. The runbooks
    // are docs/runbooks/<alert>.md of this repository; point this at your
    // copy.
    runbookURLPattern: 'https://example.invalid/observer/blob/main/docs/runbooks/%s.md',
    // How far back the ...Seen alerts count single bursts (a series born
    // with its count included).
    seenWindow: '10m',
    // The label that names a cluster: observer's k8s.cluster.name resource
    // attribute (--cluster-name), or the external label your Prometheus
    // adds (kube-prometheus setups often use `cluster`).
    clusterLabel: 'k8s_cluster_name',
    // The warnings' thresholds (the critical alerts fire on errors the
    // kernel returned, which need none). Ratios are usage / limit.
    portUsageWarningRatio: 0.7,
    portExhaustionWarningSeconds: 600,
    timeWaitEntriesWarningPerSecond: 50,
    listenQueueWarningRatio: 0.8,
    timeWaitBucketsWarningRatio: 0.8,
    openFilesWarningRatio: 0.9,
    conntrackWarningRatio: 0.8,
    connectsWarningPerSecond: 100,
    // Connections held toward one destination that grew this many times
    // within a minute, to at least connectionSurgeMinimum, are a surge.
    connectionSurgeFactor: 10,
    connectionSurgeMinimum: 1000,
    // The share of a destination's ports held by TIME_WAIT of connections
    // closed here at which missing reuse is named (doctor's
    // connection-reuse warning, ceilings/checks.rs REUSE_WARNING_SHARE).
    connectionReuseTimeWaitShare: 0.5,
    // New connections per second toward one destination whose median
    // lifetime is under connectionShortLifetimeSeconds: no reuse.
    connectionChurnWarningPerSecond: 50,
    connectionShortLifetimeSeconds: 1,
    // Handshakes whose p99 is this many times their p99 of the hour
    // before, at least handshakeMinimumPerSecond of them.
    handshakeSlowdownFactor: 2,
    handshakeMinimumPerSecond: 1,
    // Connections held against a limit declared with --connection-limits.
    declaredConnectionLimitWarningRatio: 0.8,
  },
}
