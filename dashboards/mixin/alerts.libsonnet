// observer's alert rules, as a monitoring mixin (prometheusAlerts).
// Rendered into ../alerts.yaml (the dashboards test keeps it equal:
// OBSERVER_BLESS=1 writes it); edit here. Selectors and thresholds come
// from $._config (config.libsonnet).
// A network namespace as an on-call engineer knows it: its pod's, the
// host's, else by its inode number.
local netns = "{{ if $labels.k8s_pod_name }}pod {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }}'s network namespace{{ else if eq $labels.observer_network_namespace \"host\" }}the host's network namespace{{ else }}network namespace {{ $labels.observer_network_namespace }}{{ end }}";

{
  prometheusAlerts+:: {
    groups+: [
      {
        name: 'observer-connections',
        rules: [
          {
            alert: 'ObserverEphemeralPortsExhausted',
            expr: |||
              sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port) (
                increase(observer_tcp_connect_errors_total{%(observerSelector)s, error_type="EADDRNOTAVAIL"}[1m])
              ) > 0
            ||| % $._config,
            // Errors in every minute for two: one failure does not page (the
            // ...ExhaustionSeen warning shows it).
            'for': '2m',
            labels: { severity: 'critical' },
            annotations: {
              summary: '{{ $labels.process_executable_name }} (pid {{ $labels.process_pid }}) cannot get an ephemeral port toward {{ $labels.server_address }}:{{ $labels.server_port }}',
              description: |||
                {{ $labels.process_executable_name }} pid {{ $labels.process_pid }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} got EADDRNOTAVAIL from connect() toward {{ $labels.server_address }}:{{ $labels.server_port }} in every minute for 2 minutes ({{ $value | printf "%.0f" }} in the last): every local port for that destination is taken (open or in TIME_WAIT). Its connections fail until ports free up.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverEphemeralPortsExhausted',
            },
          },
          {
            alert: 'ObserverEphemeralPortsExhaustionSeen',
            // Every EADDRNOTAVAIL of the last 10 minutes, exactly, those of a
            // series born with them included (a CronJob that exhausts its
            // ports once and exits): increase() takes a series' first value
            // as its start and misses them.
            expr: |||
              sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port) (
                (
                  observer_tcp_connect_errors_total{%(observerSelector)s, error_type="EADDRNOTAVAIL"}
                    - observer_tcp_connect_errors_total{%(observerSelector)s, error_type="EADDRNOTAVAIL"} offset %(seenWindow)s
                )
                or
                (
                  observer_tcp_connect_errors_total{%(observerSelector)s, error_type="EADDRNOTAVAIL"}
                    unless observer_tcp_connect_errors_total{%(observerSelector)s, error_type="EADDRNOTAVAIL"} offset %(seenWindow)s
                )
              ) > 0
            ||| % $._config,
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.process_executable_name }} (pid {{ $labels.process_pid }}) got EADDRNOTAVAIL toward {{ $labels.server_address }}:{{ $labels.server_port }}',
              description: |||
                {{ $labels.process_executable_name }} pid {{ $labels.process_pid }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} got {{ $value | printf "%%.0f" }} EADDRNOTAVAIL from connect() toward {{ $labels.server_address }}:{{ $labels.server_port }} in the last %(seenWindow)s: every local port for that destination was taken (open or in TIME_WAIT). Not (yet) sustained: ObserverEphemeralPortsExhausted pages when it is.
              ||| % $._config,
              runbook_url: $._config.runbookURLPattern % 'ObserverEphemeralPortsExhausted',
            },
          },
          {
            alert: 'ObserverEphemeralPortsNearLimit',
            expr: |||
              max by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name, source_address, server_address, server_port) (observer_ephemeral_port_usage{%(observerSelector)s})
                / on (%(clusterLabel)s, host_name, observer_network_namespace) group_left ()
              max by (%(clusterLabel)s, host_name, observer_network_namespace) (observer_ephemeral_port_limit{%(observerSelector)s})
                > %(portUsageWarningRatio)g
            ||| % $._config,
            'for': '2m',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.host_name }}: {{ $value | humanizePercentage }} of the ephemeral ports toward {{ $labels.server_address }}:{{ $labels.server_port }} in use',
              description: |||
                In %(netns)s on {{ $labels.host_name }}, {{ $value | humanizePercentage }} of the local ports connect() can use toward {{ $labels.server_address }}:{{ $labels.server_port }} (from {{ $labels.source_address }}) are held, open or in TIME_WAIT. At 100%% connect() fails with EADDRNOTAVAIL. `observer doctor` on the node names the processes.
              ||| % { netns: netns },
              runbook_url: $._config.runbookURLPattern % 'ObserverEphemeralPortsNearLimit',
            },
          },
          {
            alert: 'ObserverEphemeralPortsExhaustionSoon',
            expr: |||
              min by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name, source_address, server_address, server_port) (observer_ephemeral_port_time_to_exhaustion_seconds{%(observerSelector)s}) < %(portExhaustionWarningSeconds)g
            ||| % $._config,
            'for': '2m',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.host_name }}: ephemeral ports toward {{ $labels.server_address }}:{{ $labels.server_port }} run out in {{ $value | humanizeDuration }}',
              description: |||
                In %(netns)s on {{ $labels.host_name }}, the local ports held toward {{ $labels.server_address }}:{{ $labels.server_port }} (from {{ $labels.source_address }}) grew so fast over the last minute that none will be left in {{ $value | humanizeDuration }} at that pace; then connect() fails with EADDRNOTAVAIL.
              ||| % { netns: netns },
              runbook_url: $._config.runbookURLPattern % 'ObserverEphemeralPortsExhaustionSoon',
            },
          },
          {
            alert: 'ObserverTimeWaitSurge',
            expr: |||
              (
                sum by (%(clusterLabel)s, host_name, process_executable_name) (rate(observer_tcp_time_wait_entries_total{%(observerSelector)s}[2m])) > %(timeWaitEntriesWarningPerSecond)g
              )
              unless
              (
                sum by (%(clusterLabel)s, host_name, process_executable_name) (rate(observer_tcp_time_wait_entries_total{%(observerSelector)s}[2m]))
                  <= 3 * sum by (%(clusterLabel)s, host_name, process_executable_name) (rate(observer_tcp_time_wait_entries_total{%(observerSelector)s}[1h] offset 5m))
              )
            ||| % $._config,
            'for': '2m',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.process_executable_name }} on {{ $labels.host_name }}: TIME_WAIT entries surging ({{ $value | printf "%.0f" }}/s)',
              description: |||
                Sockets of {{ $labels.process_executable_name }} on {{ $labels.host_name }} enter TIME_WAIT at {{ $value | printf "%.0f" }}/s, more than 3 times its rate of the hour before (or with no history). Each holds a local port for 60 s: at this rate about {{ $value | printf "%.0f" }} x 60 ports are taken, and port exhaustion (EADDRNOTAVAIL) follows when they approach ip_local_port_range toward one destination.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverTimeWaitSurge',
            },
          },
          {
            alert: 'ObserverListenOverflow',
            expr: |||
              sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_port) (
                increase(observer_tcp_listen_overflows_total{%(observerSelector)s}[1m])
              ) > 0
            ||| % $._config,
            // Drops in every minute for two (ObserverListenOverflowSeen shows
            // a single burst).
            'for': '2m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'Listener on port {{ $labels.server_port }} of {{ $labels.process_executable_name }} (pid {{ $labels.process_pid }}) drops connections',
              description: |||
                The listener on port {{ $labels.server_port }} owned by {{ $labels.process_executable_name }} pid {{ $labels.process_pid }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} dropped connections in every minute for 2 minutes ({{ $value | printf "%.0f" }} in the last) because its accept queue was full. Clients see SYN retransmits and connect timeouts (ETIMEDOUT), and retry, which makes it worse.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverListenOverflow',
            },
          },
          {
            alert: 'ObserverListenOverflowSeen',
            // Every overflow of the last 10 minutes, those of a series born
            // with them included (see ObserverEphemeralPortsExhaustionSeen).
            expr: |||
              sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_port) (
                (
                  observer_tcp_listen_overflows_total{%(observerSelector)s}
                    - observer_tcp_listen_overflows_total{%(observerSelector)s} offset %(seenWindow)s
                )
                or
                (
                  observer_tcp_listen_overflows_total{%(observerSelector)s}
                    unless observer_tcp_listen_overflows_total{%(observerSelector)s} offset %(seenWindow)s
                )
              ) > 0
            ||| % $._config,
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Listener on port {{ $labels.server_port }} of {{ $labels.process_executable_name }} (pid {{ $labels.process_pid }}) dropped connections',
              description: |||
                The listener on port {{ $labels.server_port }} owned by {{ $labels.process_executable_name }} pid {{ $labels.process_pid }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} dropped {{ $value | printf "%%.0f" }} connections in the last %(seenWindow)s because its accept queue was full. Not (yet) sustained: ObserverListenOverflow pages when it is.
              ||| % $._config,
              runbook_url: $._config.runbookURLPattern % 'ObserverListenOverflow',
            },
          },
          {
            alert: 'ObserverSynQueueDropping',
            // Only drops: a SYN answered with a cookie still connects.
            expr: |||
              sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_port) (
                increase(observer_tcp_syn_queue_full_total{%(observerSelector)s, observer_syn_queue_action="drop"}[1m])
              ) > 0
            ||| % $._config,
            // Drops in every minute for two.
            'for': '2m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Listener on port {{ $labels.server_port }} of {{ $labels.process_executable_name }} (pid {{ $labels.process_pid }}) drops SYNs: its SYN queue is full',
              description: |||
                The listener on port {{ $labels.server_port }} owned by {{ $labels.process_executable_name }} pid {{ $labels.process_pid }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} dropped SYNs in every minute for 2 minutes ({{ $value | printf "%.0f" }} in the last) because its SYN queue, the requests waiting for the handshake's last ACK, was full and net.ipv4.tcp_syncookies is 0. Each client waits 1 s, then 2 s, 4 s before it resends: connects slow down, then time out.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverSynQueueDropping',
            },
          },
          {
            alert: 'ObserverAcceptQueueNearFull',
            expr: |||
              max by (%(clusterLabel)s, host_name, observer_network_namespace, server_address, server_port, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (observer_listen_queue_usage{%(observerSelector)s})
                / (max by (%(clusterLabel)s, host_name, observer_network_namespace, server_address, server_port, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (observer_listen_queue_limit{%(observerSelector)s}) > 0)
                >= %(listenQueueWarningRatio)g
            ||| % $._config,
            'for': '1m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Accept queue of {{ $labels.server_address }}:{{ $labels.server_port }} ({{ $labels.process_executable_name }} pid {{ $labels.process_pid }}) is {{ $value | humanizePercentage }} full',
              description: |||
                The listener on {{ $labels.server_address }}:{{ $labels.server_port }} owned by {{ $labels.process_executable_name }} pid {{ $labels.process_pid }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} has {{ $value | humanizePercentage }} of its backlog waiting to be accepted. When it is full the kernel drops new connections (ObserverListenOverflow).
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverAcceptQueueNearFull',
            },
          },
          {
            alert: 'ObserverTimeWaitNearLimit',
            expr: |||
              max by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name) (observer_time_wait_usage{%(observerSelector)s})
                / on (%(clusterLabel)s, host_name, observer_network_namespace) group_left ()
              (max by (%(clusterLabel)s, host_name, observer_network_namespace) (observer_sysctl_net_ipv4_tcp_max_tw_buckets{%(observerSelector)s}) > 0)
                > %(timeWaitBucketsWarningRatio)g
            ||| % $._config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.host_name }}: TIME_WAIT sockets at {{ $value | humanizePercentage }} of tcp_max_tw_buckets',
              description: |||
                In %(netns)s on {{ $labels.host_name }}, TIME_WAIT sockets are up to {{ $value | humanizePercentage }} of net.ipv4.tcp_max_tw_buckets. At the limit the kernel stops keeping TIME_WAIT for new closes ("time wait bucket table overflow"), so late segments of old connections can corrupt new ones; and every TIME_WAIT socket holds a local port.
              ||| % { netns: netns },
              runbook_url: $._config.runbookURLPattern % 'ObserverTimeWaitNearLimit',
            },
          },
          {
            alert: 'ObserverConntrackNearLimit',
            expr: |||
              max by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name) (observer_conntrack_usage{%(observerSelector)s})
                / (max by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name) (observer_conntrack_limit{%(observerSelector)s}) > 0)
                > %(conntrackWarningRatio)g
            ||| % $._config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.host_name }}: conntrack table at {{ $value | humanizePercentage }} of nf_conntrack_max',
              description: |||
                In %(netns)s on {{ $labels.host_name }}, the connection tracking table holds {{ $value | humanizePercentage }} of net.netfilter.nf_conntrack_max. At the limit the kernel drops the SYNs of new connections ("nf_conntrack: table full, dropping packet"): clients see connect timeouts, not errors.
              ||| % { netns: netns },
              runbook_url: $._config.runbookURLPattern % 'ObserverConntrackNearLimit',
            },
          },
          {
            alert: 'ObserverConntrackDropping',
            expr: |||
              sum by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name) (
                increase(observer_conntrack_drops_total{%(observerSelector)s, observer_conntrack_drop_reason=~"table_full|insert_failed"}[1m])
              ) > 0
            ||| % $._config,
            // Drops in every minute for two: a full table stays full.
            'for': '2m',
            labels: { severity: 'critical' },
            annotations: {
              summary: '{{ $labels.host_name }}: the conntrack table drops new connections',
              description: |||
                In %(netns)s on {{ $labels.host_name }}, the connection tracking table dropped {{ $value | printf "%%.0f" }} packets of new connections in the last minute, in every minute for 2 minutes: the table is full (or entries clash). Those connections time out on the client side.
              ||| % { netns: netns },
              runbook_url: $._config.runbookURLPattern % 'ObserverConntrackDropping',
            },
          },
          {
            alert: 'ObserverOpenFilesNearLimit',
            expr: |||
              max by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (observer_process_open_file_descriptor_usage{%(observerSelector)s})
                / (max by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (observer_process_open_file_descriptor_limit{%(observerSelector)s}) > 0)
                > %(openFilesWarningRatio)g
            ||| % $._config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.process_executable_name }} (pid {{ $labels.process_pid }}) uses {{ $value | humanizePercentage }} of its open files limit',
              description: |||
                {{ $labels.process_executable_name }} pid {{ $labels.process_pid }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} has {{ $value | humanizePercentage }} of its RLIMIT_NOFILE in use. At the limit accept() and socket() fail with EMFILE: it can take no new connection.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverOpenFilesNearLimit',
            },
          },
          {
            alert: 'ObserverConnectionStorm',
            expr: |||
              (
                sum by (%(clusterLabel)s, host_name, process_executable_name) (rate(observer_tcp_connects_total{%(observerSelector)s}[1m])) > %(connectsWarningPerSecond)g
              )
              unless
              (
                sum by (%(clusterLabel)s, host_name, process_executable_name) (rate(observer_tcp_connects_total{%(observerSelector)s}[1m]))
                  <= 5 * sum by (%(clusterLabel)s, host_name, process_executable_name) (rate(observer_tcp_connects_total{%(observerSelector)s}[1h] offset 5m))
              )
            ||| % $._config,
            'for': '1m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Connection storm from {{ $labels.process_executable_name }} on {{ $labels.host_name }} ({{ $value | printf "%.0f" }} connects/s)',
              description: |||
                {{ $labels.process_executable_name }} on {{ $labels.host_name }} opens {{ $value | printf "%.0f" }} connections per second, more than 5 times its rate of the hour before (or with no history). Storms like this (800 to 12000 connections in 40 s) exhaust ports, server connection limits and CPU.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverConnectionStorm',
            },
          },
          {
            alert: 'ObserverConnectionSurge',
            // Grown connectionSurgeFactor times within a minute, or born
            // within it with that many (a new pod's pool opening at once).
            expr: |||
              (
                sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, observer_connection_direction="outbound"}) >= %(connectionSurgeMinimum)g
              )
              and
              (
                (
                  sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, observer_connection_direction="outbound"})
                    > %(connectionSurgeFactor)g * sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, observer_connection_direction="outbound"} offset 1m)
                )
                or
                (
                  sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, observer_connection_direction="outbound"})
                    unless sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, observer_connection_direction="outbound"} offset 1m)
                )
              )
            ||| % $._config,
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.process_executable_name }} holds {{ $value | printf "%%.0f" }} connections to {{ $labels.server_address }}:{{ $labels.server_port }}, %(connectionSurgeFactor)gx a minute ago' % $._config,
              description: |||
                {{ $labels.process_executable_name }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} holds {{ $value | printf "%%.0f" }} connections to {{ $labels.server_address }}:{{ $labels.server_port }}, more than %(connectionSurgeFactor)g times as many as a minute before. The server's connection limit (a database's max connections) is the next to break: other clients' connects time out. The other nodes' observers show the rest of the fleet's share.
              ||| % $._config,
              runbook_url: $._config.runbookURLPattern % 'ObserverConnectionSurge',
            },
          },
          {
            alert: 'ObserverHandshakeSlow',
            expr: |||
              (
                histogram_quantile(0.99, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port, le) (label_replace(rate(observer_tcp_handshakes_total{%(observerSelector)s}[5m]), "le", "$1", "observer_le", "(.*)")))
                  > %(handshakeSlowdownFactor)g * histogram_quantile(0.99, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port, le) (label_replace(rate(observer_tcp_handshakes_total{%(observerSelector)s}[1h] offset 1h), "le", "$1", "observer_le", "(.*)")))
              )
              and on (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port)
              (
                sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port) (rate(observer_tcp_handshakes_total{%(observerSelector)s, observer_le="+Inf"}[5m])) >= %(handshakeMinimumPerSecond)g
              )
            ||| % $._config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Handshakes of {{ $labels.process_executable_name }} to {{ $labels.server_address }}:{{ $labels.server_port }} take {{ $value | humanizeDuration }} (p99), %(handshakeSlowdownFactor)gx an hour earlier' % $._config,
              description: |||
                The slowest handshakes (99th percentile, SYN sent to ESTABLISHED) of {{ $labels.process_executable_name }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} toward {{ $labels.server_address }}:{{ $labels.server_port }} take {{ $value | humanizeDuration }}, more than %(handshakeSlowdownFactor)g times their 99th percentile an hour earlier (the hour that ended an hour ago). Seconds mean lost SYNs (each costs 1 s, 2 s, 4 s): the server's listen queue, a conntrack table or a firewall dropping them; tens of milliseconds, a longer path (another site). Connection pools wait, and retries pile up.
              ||| % $._config,
              runbook_url: $._config.runbookURLPattern % 'ObserverHandshakeSlow',
            },
          },
          {
            alert: 'ObserverServerLimitInferred',
            // observer infers it (inferred_limits.rs: 15 s of the shape);
            // the fleet's connections toward the server beside it.
            expr: |||
              max by (%(clusterLabel)s, host_name, server_address, server_port) (observer_tcp_connection_limit_inferred{%(observerSelector)s})
            ||| % $._config,
            'for': '30s',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.server_address }}:{{ $labels.server_port }} closes new connections at once above ~{{ $value | printf "%.0f" }} open: a server-side limit',
              description: |||
                From {{ $labels.host_name }}, {{ $labels.server_address }}:{{ $labels.server_port }} keeps {{ $value | printf "%.0f" }} of this node's connections open and closes nearly every new one within milliseconds, its FIN first: a connection limit on the server's side that nobody declared (a database's max connections, a proxy's per-client cap). Clients see connections closed right after connect (EOF, "connection reset", a driver's "too many connections"), and retries make more. The server's limit counts every client: sum observer_tcp_connection_usage toward it over the fleet.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverServerLimitInferred',
            },
          },
          {
            alert: 'ObserverConnectionsNearDeclaredLimit',
            // A server's limit counts every client on every node; a
            // listener's, this node's connections on its port.
            expr: |||
              (
                sum by (%(clusterLabel)s, observer_connection_direction, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, observer_connection_direction="outbound"})
                  / on (%(clusterLabel)s, observer_connection_direction, server_address, server_port)
                max by (%(clusterLabel)s, observer_connection_direction, server_address, server_port) (observer_tcp_connection_limit{%(observerSelector)s, observer_connection_direction="outbound"})
                  > %(declaredConnectionLimitWarningRatio)g
              )
              or
              (
                sum by (%(clusterLabel)s, host_name, observer_connection_direction, server_port) (observer_tcp_connection_usage{%(observerSelector)s, observer_connection_direction="inbound"})
                  / on (%(clusterLabel)s, host_name, observer_connection_direction, server_port)
                max by (%(clusterLabel)s, host_name, observer_connection_direction, server_port) (observer_tcp_connection_limit{%(observerSelector)s, observer_connection_direction="inbound"})
                  > %(declaredConnectionLimitWarningRatio)g
              )
            ||| % $._config,
            'for': '2m',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $value | humanizePercentage }} of the declared connection limit of {{ if $labels.server_address }}{{ $labels.server_address }}:{{ $labels.server_port }}{{ else }}port {{ $labels.server_port }} on {{ $labels.host_name }}{{ end }} in use',
              description: |||
                The connections held {{ if $labels.server_address }}by every client observer sees to {{ $labels.server_address }}:{{ $labels.server_port }}{{ else }}to the listeners of {{ $labels.host_name }} on port {{ $labels.server_port }}{{ end }} are {{ $value | humanizePercentage }} of the limit declared with --connection-limits. At the limit the server refuses new connections (a database's max connections): clients see connect errors or timeouts.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverConnectionsNearDeclaredLimit',
            },
          },
          {
            alert: 'ObserverConnectionReuseMissing',
            // Two shapes of one cause. First, relative to the ports: half of
            // those a destination can use held by TIME_WAIT of connections
            // closed here, at any range and any rate (200 ports run out at
            // 3 closes a second). Second, a churn that will run a wide range
            // out later: many new connections a second, most short-lived.
            expr: |||
              (
                max by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name, source_address, server_address, server_port) (observer_ephemeral_port_time_wait{%(observerSelector)s})
                  / on (%(clusterLabel)s, host_name, observer_network_namespace) group_left ()
                max by (%(clusterLabel)s, host_name, observer_network_namespace) (observer_ephemeral_port_limit{%(observerSelector)s})
                  >= %(connectionReuseTimeWaitShare)g
              )
              or
              (
                histogram_quantile(0.5, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port, le) (label_replace(rate(observer_tcp_connections_closed_total{%(observerSelector)s, observer_connection_direction="outbound"}[5m]), "le", "$1", "observer_le", "(.*)")))
                  < %(connectionShortLifetimeSeconds)g
              )
              and on (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port)
              (
                sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, server_address, server_port) (rate(observer_tcp_connections_established_total{%(observerSelector)s, observer_connection_direction="outbound"}[5m]))
                  > %(connectionChurnWarningPerSecond)g
              )
            ||| % $._config,
            // TIME_WAIT lasts a minute: half the ports held for 30 s is a
            // churn that goes on, and leaves the other half for ~30 s more.
            'for': '30s',
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ if $labels.observer_network_namespace }}{{ $labels.host_name }}: no connection reuse toward {{ $labels.server_address }}:{{ $labels.server_port }}, {{ $value | humanizePercentage }} of its ports held by TIME_WAIT of connections closed here{{ else }}{{ $labels.process_executable_name }} opens a new connection to {{ $labels.server_address }}:{{ $labels.server_port }} for almost every use (median life {{ $value | humanizeDuration }}){{ end }}',
              description: |||
                {{ if $labels.observer_network_namespace }}In %(netns)s on {{ $labels.host_name }}, {{ $value | humanizePercentage }} of the local ports connect() can use toward {{ $labels.server_address }}:{{ $labels.server_port }} (from {{ $labels.source_address }}) are held by TIME_WAIT: connections this side opened and closed within the last minute. That is the cause when its ports run out (EADDRNOTAVAIL): connections are not reused (no keep-alive, a new connection per request or per retry). `observer doctor` on the node names it; the avalanche board's new connections by process toward it name the process.{{ else }}{{ $labels.process_executable_name }} in {{ $labels.k8s_namespace_name }}/{{ $labels.k8s_pod_name }} on {{ $labels.host_name }} opens more than %(rate)g connections per second to {{ $labels.server_address }}:{{ $labels.server_port }}, and half of them live less than {{ $value | humanizeDuration }}: connections are not reused (no keep-alive, a pool too small, HTTP/2 off). Each one costs a handshake, a local port and a TIME_WAIT entry; this is how the port-exhaustion incident began.{{ end }}
              ||| % { netns: netns, rate: $._config.connectionChurnWarningPerSecond },
              runbook_url: $._config.runbookURLPattern % 'ObserverConnectionReuseMissing',
            },
          },
        ],
      },
      {
        name: 'observer-self',
        rules: [
          {
            alert: 'ObserverDown',
            expr: |||
              up{%(observerSelector)s} == 0
            ||| % $._config,
            'for': '2m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'observer on {{ $labels.instance }} is not being scraped',
              description: |||
                Prometheus cannot scrape observer at {{ $labels.instance }} (job {{ $labels.job }}): connection counts of that node are not being collected. Its series are selected by %(observerSelector)s (the mixin's observerSelector).
              ||| % $._config,
              runbook_url: $._config.runbookURLPattern % 'ObserverDown',
            },
          },
          {
            alert: 'ObserverHookMissing',
            expr: |||
              count by (%(clusterLabel)s, host_name) (observer_probe_info{%(observerSelector)s, observer_probe_mode!="none"})
                < on (%(clusterLabel)s) group_left ()
              max by (%(clusterLabel)s) (count by (%(clusterLabel)s, host_name) (observer_probe_info{%(observerSelector)s, observer_probe_mode!="none"}))
            ||| % $._config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'observer on {{ $labels.host_name }} has only {{ $value }} hooks attached, fewer than other nodes',
              description: |||
                observer on {{ $labels.host_name }} has fewer kernel hooks attached than the node of its cluster with the most (another observer version; a kernel offering a hook no place to attach, which observer_probe_info shows as observer_probe_mode="none"; or a hook lost), so some connection events there may not be counted.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverHookMissing',
            },
          },
          {
            alert: 'ObserverExportFailing',
            expr: |||
              sum by (%(clusterLabel)s, host_name, observer_exporter) (rate(observer_export_failures_total{%(observerSelector)s}[5m])) > 0
            ||| % $._config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'observer on {{ $labels.host_name }} cannot export via {{ $labels.observer_exporter }}',
              description: |||
                observer's {{ $labels.observer_exporter }} exports from {{ $labels.host_name }} have been failing for 10 minutes. Counting goes on and cumulative counts arrive complete once the collector answers; delta batches beyond 30 are dropped (observer_export_dropped_batches_total).
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverExportFailing',
            },
          },
          {
            alert: 'ObserverMissingCounts',
            expr: |||
              sum by (%(clusterLabel)s, host_name) (increase(observer_kernel_missed_events_total{%(observerSelector)s}[10m]))
                + sum by (%(clusterLabel)s, host_name) (increase(observer_kernel_lost_updates_total{%(observerSelector)s}[10m])) > 0
            ||| % $._config,
            labels: { severity: 'info' },
            annotations: {
              summary: 'observer on {{ $labels.host_name }} may have missed {{ $value | printf "%.0f" }} events',
              description: |||
                The kernel skipped observer's programs (BPF recursion protection: another BPF program was running on that CPU) or a full map lost updates on {{ $labels.host_name }}; counts there may be short by up to {{ $value | printf "%.0f" }} in the last 10 minutes.
              |||,
              runbook_url: $._config.runbookURLPattern % 'ObserverMissingCounts',
            },
          },
        ],
      },
    ],
  },
}
