// The 3 a.m. board; see ../dashboards.libsonnet for how it is rendered.

// What a counter grew by over `window`, per series, those born within it
// included: a process that lives less than a scrape or two (a cron job, a
// CLI in a loop) has a series born at its final count, of which
// increase() and rate() see nothing. A series there `window` ago: its last
// value in the window minus that one; a series born since: its last value
// (observer counts a process from zero).
// (A counter that went back, observer restarted, counts from zero.)
local grew(series, window) =
  '(clamp_min(last_over_time(%(s)s[%(w)s]) - %(s)s offset %(w)s, 0) or (last_over_time(%(s)s[%(w)s]) unless %(s)s offset %(w)s))' % { s: series, w: window };

function(config)
  {
    uid: 'observer-connection-avalanche',
    title: 'observer: connection avalanche',
    description: 'The 3 a.m. board: who runs out of ephemeral ports and toward where, who piles up TIME_WAIT, which listener overflows, and the connection storm around them. Pick the node, namespace, pod or process at the top.',
    tags: [
      'observer',
      'tcp',
      'on-call',
    ],
    timezone: 'browser',
    editable: true,
    schemaVersion: 39,
    version: 1,
    refresh: '30s',
    time: {
      from: 'now-1h',
      to: 'now',
    },
    graphTooltip: 1,
    templating: {
      list: [
        {
          name: 'datasource',
          label: 'Data source',
          type: 'datasource',
          query: 'prometheus',
          description: "The Prometheus (or compatible) data source observer's metrics are in.",
        },
        {
          name: 'cluster',
          label: 'Cluster',
          type: 'query',
          datasource: {
            type: 'prometheus',
            uid: '${datasource}',
          },
          definition: 'label_values(observer_probe_info{%(observerSelector)s}, %(clusterLabel)s)',
          query: {
            query: 'label_values(observer_probe_info{%(observerSelector)s}, %(clusterLabel)s)',
            refId: 'var-cluster',
          },
          includeAll: true,
          multi: true,
          allValue: '.*',
          refresh: 2,
          sort: 1,
          current: {
            selected: true,
            text: [
              'All',
            ],
            value: [
              '$__all',
            ],
          },
          description: 'k8s.cluster.name from OTEL_RESOURCE_ATTRIBUTES; empty when not set.',
        },
        {
          name: 'node',
          label: 'Node',
          type: 'query',
          datasource: {
            type: 'prometheus',
            uid: '${datasource}',
          },
          definition: 'label_values(observer_probe_info{%(observerSelector)s, %(clusterLabel)s=~"$cluster"}, host_name)',
          query: {
            query: 'label_values(observer_probe_info{%(observerSelector)s, %(clusterLabel)s=~"$cluster"}, host_name)',
            refId: 'var-node',
          },
          includeAll: true,
          multi: true,
          allValue: '.*',
          refresh: 2,
          sort: 1,
          current: {
            selected: true,
            text: [
              'All',
            ],
            value: [
              '$__all',
            ],
          },
          description: 'The node (host) observer runs on.',
        },
        {
          name: 'namespace',
          label: 'Namespace',
          type: 'query',
          datasource: {
            type: 'prometheus',
            uid: '${datasource}',
          },
          definition: 'label_values({__name__=~"observer_tcp_connects_total|observer_tcp_accepts_total|observer_tcp_time_wait_entries_total|observer_tcp_connect_errors_total|observer_tcp_listen_overflows_total|observer_listen_queue_usage", %(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}, k8s_namespace_name)',
          query: {
            query: 'label_values({__name__=~"observer_tcp_connects_total|observer_tcp_accepts_total|observer_tcp_time_wait_entries_total|observer_tcp_connect_errors_total|observer_tcp_listen_overflows_total|observer_listen_queue_usage", %(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}, k8s_namespace_name)',
            refId: 'var-namespace',
          },
          includeAll: true,
          multi: true,
          allValue: '.*',
          refresh: 2,
          sort: 1,
          current: {
            selected: true,
            text: [
              'All',
            ],
            value: [
              '$__all',
            ],
          },
          description: 'Kubernetes namespace of the process (host processes have none).',
        },
        {
          name: 'pod',
          label: 'Pod',
          type: 'query',
          datasource: {
            type: 'prometheus',
            uid: '${datasource}',
          },
          definition: 'label_values({__name__=~"observer_tcp_connects_total|observer_tcp_accepts_total|observer_tcp_time_wait_entries_total|observer_tcp_connect_errors_total|observer_tcp_listen_overflows_total|observer_listen_queue_usage", %(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace"}, k8s_pod_name)',
          query: {
            query: 'label_values({__name__=~"observer_tcp_connects_total|observer_tcp_accepts_total|observer_tcp_time_wait_entries_total|observer_tcp_connect_errors_total|observer_tcp_listen_overflows_total|observer_listen_queue_usage", %(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace"}, k8s_pod_name)',
            refId: 'var-pod',
          },
          includeAll: true,
          multi: true,
          allValue: '.*',
          refresh: 2,
          sort: 1,
          current: {
            selected: true,
            text: [
              'All',
            ],
            value: [
              '$__all',
            ],
          },
          description: 'Kubernetes pod of the process.',
        },
        {
          name: 'process',
          label: 'Process',
          type: 'query',
          datasource: {
            type: 'prometheus',
            uid: '${datasource}',
          },
          definition: 'label_values({__name__=~"observer_tcp_connects_total|observer_tcp_accepts_total|observer_tcp_time_wait_entries_total|observer_tcp_connect_errors_total|observer_tcp_listen_overflows_total|observer_listen_queue_usage", %(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod"}, process_executable_name)',
          query: {
            query: 'label_values({__name__=~"observer_tcp_connects_total|observer_tcp_accepts_total|observer_tcp_time_wait_entries_total|observer_tcp_connect_errors_total|observer_tcp_listen_overflows_total|observer_listen_queue_usage", %(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod"}, process_executable_name)',
            refId: 'var-process',
          },
          includeAll: true,
          multi: true,
          allValue: '.*',
          refresh: 2,
          sort: 1,
          current: {
            selected: true,
            text: [
              'All',
            ],
            value: [
              '$__all',
            ],
          },
          description: 'Executable name of the process (its comm).',
        },
      ],
    },
    annotations: {
      list: [],
    },
    links: [
      {
        title: 'Fleet overview',
        type: 'link',
        icon: 'dashboard',
        url: '/d/observer-overview',
        keepTime: true,
        includeVars: true,
        tooltip: 'Every node, worst first (keeps the time range, data source and cluster)',
      },
    ],
    panels: [
      {
        id: 1,
        type: 'row',
        title: 'Is it happening? (now, for the selection)',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 0,
        },
        panels: [],
      },
      {
        id: 2,
        type: 'stat',
        title: 'EADDRNOTAVAIL /s',
        description: 'connect() failures for want of a free ephemeral port, per second. Above 0: ports toward some destination are exhausted; see the next row for who and where. Per second over the last minute, each process counted from the birth of its series (a cron job whose one burst came before its first scrape included).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 4,
          w: 6,
          x: 0,
          y: 1,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            thresholds: {
              mode: 'absolute',
              steps: [
                {
                  color: 'green',
                  value: null,
                },
                {
                  color: 'red',
                  value: 0.001,
                },
              ],
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum((' + grew('observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", error_type="EADDRNOTAVAIL"}', '1m') + ' / 60))',
            legendFormat: 'EADDRNOTAVAIL /s',
            range: true,
          },
        ],
        options: {
          reduceOptions: {
            calcs: [
              'lastNotNull',
            ],
            fields: '',
            values: false,
          },
          colorMode: 'background',
          graphMode: 'area',
        },
      },
      {
        id: 3,
        type: 'stat',
        title: 'TIME_WAIT entries /s',
        description: 'Sockets entering TIME_WAIT per second. Each holds its port for 60 s: 500/s toward one destination keeps 30000 ports busy, more than the default range. Per second over the last minute, each process counted from the birth of its series (a cron job whose one burst came before its first scrape included).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 4,
          w: 6,
          x: 6,
          y: 1,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            thresholds: {
              mode: 'absolute',
              steps: [
                {
                  color: 'green',
                  value: null,
                },
                {
                  color: 'red',
                  value: 1000,
                },
              ],
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum((' + grew('observer_tcp_time_wait_entries_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60))',
            legendFormat: 'TIME_WAIT entries /s',
            range: true,
          },
        ],
        options: {
          reduceOptions: {
            calcs: [
              'lastNotNull',
            ],
            fields: '',
            values: false,
          },
          colorMode: 'background',
          graphMode: 'area',
        },
      },
      {
        id: 4,
        type: 'stat',
        title: 'Listen overflows /s',
        description: 'Connections listeners dropped because their accept queue was full. Above 0: a server does not accept fast enough, or its backlog is too small. Per second over the last minute, each process counted from the birth of its series (a cron job whose one burst came before its first scrape included).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 4,
          w: 6,
          x: 12,
          y: 1,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            thresholds: {
              mode: 'absolute',
              steps: [
                {
                  color: 'green',
                  value: null,
                },
                {
                  color: 'red',
                  value: 0.001,
                },
              ],
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum((' + grew('observer_tcp_listen_overflows_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60))',
            legendFormat: 'Listen overflows /s',
            range: true,
          },
        ],
        options: {
          reduceOptions: {
            calcs: [
              'lastNotNull',
            ],
            fields: '',
            values: false,
          },
          colorMode: 'background',
          graphMode: 'area',
        },
      },
      {
        id: 5,
        type: 'stat',
        title: 'Connects /s',
        description: 'Connection attempts (SYNs sent) per second. A storm is a jump here: compare with the graph below. Per second over the last minute, each process counted from the birth of its series (a cron job whose one burst came before its first scrape included).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 4,
          w: 6,
          x: 18,
          y: 1,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            thresholds: {
              mode: 'absolute',
              steps: [
                {
                  color: 'green',
                  value: null,
                },
                {
                  color: 'red',
                  value: 1000,
                },
              ],
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum((' + grew('observer_tcp_connects_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60))',
            legendFormat: 'Connects /s',
            range: true,
          },
        ],
        options: {
          reduceOptions: {
            calcs: [
              'lastNotNull',
            ],
            fields: '',
            values: false,
          },
          colorMode: 'background',
          graphMode: 'area',
        },
      },
      {
        id: 6,
        type: 'row',
        title: 'Who runs out of ports, toward where',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 5,
        },
        panels: [],
      },
      {
        id: 7,
        type: 'timeseries',
        title: 'EADDRNOTAVAIL by process and destination',
        description: "Who cannot get an ephemeral port, toward which destination. Next: compare the process's connections to that destination with ip_local_port_range (`ss -tn dst <addr>` | wc -l; `sysctl net.ipv4.ip_local_port_range`), check its connection pool size and retries (an unbounded retry loop multiplies attempts), and tcp_tw_reuse. Per second over the last minute, each process counted from the birth of its series (one that lived less than a scrape, a cron job or a CLI in a loop, included).",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 9,
          w: 16,
          x: 0,
          y: 6,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port) ((' + grew('observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", error_type="EADDRNOTAVAIL"}', '1m') + ' / 60))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} on {{host_name}} -> {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 8,
        type: 'table',
        title: 'Worst EADDRNOTAVAIL offenders in the time range',
        description: 'EADDRNOTAVAIL failures over the selected time range, exactly, worst first: the process, pod and destination to act on first. A process whose first count was already a burst (a short job that failed at once) is counted too, which increase() would miss.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 9,
          w: 8,
          x: 16,
          y: 6,
        },
        fieldConfig: {
          defaults: {
            unit: 'none',
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port) (((observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", error_type="EADDRNOTAVAIL"} - observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", error_type="EADDRNOTAVAIL"} offset $__range) or (observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", error_type="EADDRNOTAVAIL"} unless observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", error_type="EADDRNOTAVAIL"} offset $__range))) > 0)',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
        ],
        options: {
          sortBy: [
            {
              displayName: 'Value',
              desc: true,
            },
          ],
        },
        transformations: [
          {
            id: 'organize',
            options: {
              excludeByName: {
                Time: true,
              },
            },
          },
        ],
      },
      {
        id: 9,
        type: 'timeseries',
        title: 'connect() errors by errno',
        description: 'Every connect() failure by errno: EADDRNOTAVAIL (no local port), ECONNREFUSED (nobody listens), ETIMEDOUT (no answer: a dropped SYN, often a listen overflow on the server), ENETUNREACH. A spread of errnos points to the server side; EADDRNOTAVAIL alone to this node.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 24,
          x: 0,
          y: 15,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (error_type) (rate(observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}[$__rate_interval]))',
            legendFormat: '{{error_type}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 10,
        type: 'timeseries',
        title: 'Ephemeral ports used per destination, against the limit',
        description: "Local ports held toward each destination (every state that holds one), as a fraction of the namespace's ephemeral range (ip_local_port_range minus reserved ports). At 1.0 connect() fails with EADDRNOTAVAIL: act well before, at %(portUsageWarningRatio)g as the alert does (see the EADDRNOTAVAIL panel's next steps).",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 16,
          x: 0,
          y: 22,
        },
        fieldConfig: {
          defaults: {
            unit: 'percentunit',
            thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }, { color: 'orange', value: config.portUsageWarningRatio }, { color: 'red', value: 1 }] },
            custom: {
              thresholdsStyle: { mode: 'line' },
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'max by (%(clusterLabel)s, host_name, observer_network_namespace, source_address, server_address, server_port) (observer_ephemeral_port_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}) / on (%(clusterLabel)s, host_name, observer_network_namespace) group_left () max by (%(clusterLabel)s, host_name, observer_network_namespace) (observer_ephemeral_port_limit{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"})',
            legendFormat: '{{host_name}} netns {{observer_network_namespace}}: {{source_address}} -> {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 25,
        type: 'timeseries',
        title: 'Time to port exhaustion per destination',
        description: 'Seconds until no ephemeral port is left toward a destination, at the rate its use grew over the last minute (0: exhausted now). Only destinations whose use is growing have a value. Minutes means act now: find the process in the EADDRNOTAVAIL panel, reuse connections (keep-alive, a pool) or widen ip_local_port_range.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 8,
          x: 16,
          y: 22,
        },
        fieldConfig: {
          defaults: {
            unit: 's',
            thresholds: { mode: 'absolute', steps: [{ color: 'red', value: null }, { color: 'green', value: config.portExhaustionWarningSeconds }] },
            custom: {
              thresholdsStyle: { mode: 'line' },
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'min by (%(clusterLabel)s, host_name, observer_network_namespace, source_address, server_address, server_port) (observer_ephemeral_port_time_to_exhaustion_seconds{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"})',
            legendFormat: '{{host_name}} netns {{observer_network_namespace}}: {{source_address}} -> {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'min',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'asc',
          },
        },
      },
      {
        id: 11,
        type: 'row',
        title: 'Who piles up TIME_WAIT',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 30,
        },
        panels: [],
      },
      {
        id: 12,
        type: 'timeseries',
        title: 'TIME_WAIT entries by process',
        description: 'Whose sockets enter TIME_WAIT (the side that closes first). High rates mean short-lived connections: reuse them (keep-alive, a pool), or let the server close first. tcp_fin_timeout does not shorten TIME_WAIT (60 s, fixed). Per second over the last minute, each process counted from the birth of its series (one that lived less than a scrape, a cron job or a CLI in a loop, included).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 12,
          x: 0,
          y: 31,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) ((' + grew('observer_tcp_time_wait_entries_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60)))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} on {{host_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 13,
        type: 'timeseries',
        title: 'TIME_WAIT sockets now, against tcp_max_tw_buckets',
        description: "Sockets in TIME_WAIT in each network namespace now, and the namespace's tcp_max_tw_buckets (beyond it the kernel skips TIME_WAIT and counts TCPTimeWaitOverflow). Each holds a local port: compare with the ephemeral port range too.",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 12,
          x: 12,
          y: 31,
        },
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'max by (%(clusterLabel)s, host_name, observer_network_namespace) (observer_time_wait_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"})',
            legendFormat: '{{host_name}} netns {{observer_network_namespace}} in TIME_WAIT',
            range: true,
            instant: false,
          },
          {
            refId: 'B',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'max by (%(clusterLabel)s, host_name, observer_network_namespace) (observer_sysctl_net_ipv4_tcp_max_tw_buckets{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"})',
            legendFormat: '{{host_name}} netns {{observer_network_namespace}} limit',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 14,
        type: 'row',
        title: 'Which listener overflows, and who owns it',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 39,
        },
        panels: [],
      },
      {
        id: 15,
        type: 'timeseries',
        title: 'Listen overflows and full SYN queues by owner and port',
        description: "Connections a listener dropped because its accept queue was full, by the process owning it and its port. Next: is the owner stuck (CPU, GC, a slow accept loop)? Compare its backlog (`ss -lnt sport = :<port>`, Send-Q) with the burst; raise listen()'s backlog and net.core.somaxconn together. Beside them, SYNs that met a full SYN queue (handshakes not completing as fast as SYNs come: a SYN flood, or clients whose last ACK is lost): `syncookie`, answered with SYN cookies; `drop`, dropped (syncookies off: each client waits 1 s). Counted where fentry or kprobes work; observer_probe_info{observer_hook=\"syn_queue_full\"} says `none` where not. Per second over the last minute, each process counted from the birth of its series (one that lived less than a scrape, a cron job or a CLI in a loop, included).",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 12,
          x: 0,
          y: 40,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_port) ((' + grew('observer_tcp_listen_overflows_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} on {{host_name}} port {{server_port}}',
            range: true,
            instant: false,
          },
          {
            refId: 'B',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_port, observer_syn_queue_action) ((' + grew('observer_tcp_syn_queue_full_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} on {{host_name}} port {{server_port}}: SYN queue full, {{observer_syn_queue_action}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 16,
        type: 'timeseries',
        title: 'Accept queues against their backlog',
        description: "Connections waiting in each listener's accept queue as a fraction of its backlog (ss -lnt Recv-Q / Send-Q). At 1.0 the listener drops connections (the overflows on the left). Each line names the process that listens (and its pod) where known.",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 12,
          x: 12,
          y: 40,
        },
        fieldConfig: {
          defaults: {
            unit: 'percentunit',
            thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }, { color: 'orange', value: config.listenQueueWarningRatio }, { color: 'red', value: 1 }] },
            custom: {
              thresholdsStyle: { mode: 'line' },
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'max by (%(clusterLabel)s, host_name, observer_network_namespace, server_address, server_port, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (observer_listen_queue_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}) / (max by (%(clusterLabel)s, host_name, observer_network_namespace, server_address, server_port, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (observer_listen_queue_limit{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}) > 0)',
            legendFormat: '{{host_name}} netns {{observer_network_namespace}} {{server_address}}:{{server_port}} ({{process_executable_name}} {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}})',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 17,
        type: 'row',
        title: 'Connection storm: connects and accepts',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 48,
        },
        panels: [],
      },
      {
        id: 18,
        type: 'timeseries',
        title: 'Connects by process',
        description: 'Connection attempts per second by process. A storm (a seed incident went from 800 to 12000 connections in 40 s) is a wall here: find the first process to jump. Next: its pool limits, retry policy (backoff, jitter), and what made it reconnect. Per second over the last minute, each process counted from the birth of its series (one that lived less than a scrape, a cron job or a CLI in a loop, included).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 12,
          x: 0,
          y: 49,
        },
        fieldConfig: {
          defaults: {
            unit: 'reqps',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) ((' + grew('observer_tcp_connects_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60)))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} on {{host_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 19,
        type: 'timeseries',
        title: 'Accepts by process',
        description: 'Connections accepted per second by server process: the receiving side of the storm. Accepts that stop growing while connects keep climbing mean the server no longer keeps up (see listen overflows). Per second over the last minute, each process counted from the birth of its series (one that lived less than a scrape, a cron job or a CLI in a loop, included).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 12,
          x: 12,
          y: 49,
        },
        fieldConfig: {
          defaults: {
            unit: 'reqps',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) ((' + grew('observer_tcp_accepts_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60)))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} on {{host_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 20,
        type: 'timeseries',
        title: 'Connect rate against its own last 30 minutes',
        description: 'Connects per second of each program over the last 2 minutes, divided by its average over the last 30: about 1 is steady, a storm stands out as 5 or more (the alert ObserverConnectionStorm compares with the hour before). Summed over its processes, those that lived less than a scrape included (a cron job, a CLI in a loop: each one counted from its first scrape).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 12,
          x: 0,
          y: 57,
        },
        fieldConfig: {
          defaults: {
            unit: 'x',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            local connects = 'observer_tcp_connects_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}',
            expr: '(sum by (%(clusterLabel)s, host_name, process_executable_name) (' + grew(connects, '2m') + ') / 120) / (sum by (%(clusterLabel)s, host_name, process_executable_name) (' + grew(connects, '30m') + ') / 1800 > 0)',
            legendFormat: '{{process_executable_name}} on {{host_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 26,
        type: 'timeseries',
        title: 'Open files against RLIMIT_NOFILE, by process',
        description: "Open file descriptors of each process that connects, accepts or listens, as a fraction of its soft RLIMIT_NOFILE. At 1.0 accept() and socket() fail with EMFILE: every held or leaked connection is a file. Raise the limit (LimitNOFILE=, ulimit -n, the container runtime's default) or find the leak.",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 12,
          x: 12,
          y: 57,
        },
        fieldConfig: {
          defaults: {
            unit: 'percentunit',
            thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }, { color: 'orange', value: config.openFilesWarningRatio }, { color: 'red', value: 1 }] },
            custom: {
              thresholdsStyle: { mode: 'line' },
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'max by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (observer_process_open_file_descriptor_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"} / observer_process_open_file_descriptor_limit{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"})',
            legendFormat: '{{host_name}} {{k8s_namespace_name}}/{{k8s_pod_name}} {{process_executable_name}} ({{process_pid}})',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 27,
        type: 'timeseries',
        title: 'Conntrack tables against nf_conntrack_max',
        description: "Entries of each network namespace's connection tracking table as a fraction of nf_conntrack_max (the kernel holds each namespace's own count against it), where a firewall or NAT rule makes the namespace track connections. At 1.0 the kernel drops new connections' SYNs: clients see connect timeouts, not errors. Closed connections keep their entry for nf_conntrack_tcp_timeout_time_wait (120 s).",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 12,
          x: 0,
          y: 64,
        },
        fieldConfig: {
          defaults: {
            unit: 'percentunit',
            thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }, { color: 'orange', value: config.conntrackWarningRatio }, { color: 'red', value: 1 }] },
            custom: {
              thresholdsStyle: { mode: 'line' },
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'max by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name) (observer_conntrack_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod"}) / (max by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name) (observer_conntrack_limit{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod"}) > 0)',
            legendFormat: '{{host_name}} netns {{observer_network_namespace}} {{k8s_namespace_name}}/{{k8s_pod_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 28,
        type: 'timeseries',
        title: 'Conntrack drops by namespace and reason',
        description: "Packets the connection tracking tables dropped per second: table_full (a new connection's SYN, the table full and nothing to evict: the client times out), insert_failed (an entry clashing with another), early_drop (an unanswered connection evicted to make room). Any table_full means the table beside this panel is at its limit.",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 12,
          x: 12,
          y: 64,
        },
        fieldConfig: {
          defaults: {
            unit: 'pps',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name, observer_network_namespace, k8s_namespace_name, k8s_pod_name, observer_conntrack_drop_reason) (rate(observer_conntrack_drops_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod"}[$__rate_interval]))',
            legendFormat: '{{host_name}} netns {{observer_network_namespace}} {{k8s_namespace_name}}/{{k8s_pod_name}}: {{observer_conntrack_drop_reason}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 29,
        type: 'row',
        title: 'Connections held, opened, and how long they live',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 71,
        },
        panels: [],
      },
      {
        id: 30,
        type: 'timeseries',
        title: 'Connections open by process and destination',
        description: 'Connections ESTABLISHED now from each process to each server (ss state established). The storm of a seed incident went from 800 to 12000 toward one database in 40 s, past a limit nobody knew: who holds them, and toward which instance, is here. Counts connections established while observer ran.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 8,
          x: 0,
          y: 72,
        },
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", observer_connection_direction="outbound"}))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} -> {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 31,
        type: 'timeseries',
        title: 'New connections /s by process and destination',
        description: 'Connections established per second from each process to each server. A high rate while the open count stays flat is a client without connection reuse: every request a new connection, a TIME_WAIT entry and a port. Per second over the last minute, each process counted from the birth of its series (one that lived less than a scrape, a cron job or a CLI in a loop, included).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 8,
          x: 8,
          y: 72,
        },
        fieldConfig: {
          defaults: {
            unit: 'reqps',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port) ((' + grew('observer_tcp_connections_established_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", observer_connection_direction="outbound"}', '1m') + ' / 60)))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} -> {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 32,
        type: 'timeseries',
        title: 'Median connection lifetime by process and destination',
        description: 'How long connections toward each server stayed established (the median of those that closed; buckets at powers of 4 ms, so within a factor of 4). Sub-second lifetimes with a high rate of new connections are the missing keep-alive of the port-exhaustion incident; a pool keeps connections for minutes.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 8,
          x: 16,
          y: 72,
        },
        fieldConfig: {
          defaults: {
            unit: 's',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'histogram_quantile(0.5, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port, le) (label_replace(rate(observer_tcp_connections_closed_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process", observer_connection_direction="outbound"}[$__rate_interval]), "le", "$1", "observer_le", "(.*)")))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} -> {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 33,
        type: 'timeseries',
        title: 'Connections against declared limits',
        description: "Connections held toward each server with a limit declared (--connection-limits), by every client on every node, as a fraction of that limit (a database's max connections nobody could see); and this node's listeners on a port against theirs. At 1.0 the server refuses new connections.",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 12,
          x: 0,
          y: 80,
        },
        fieldConfig: {
          defaults: {
            unit: 'percentunit',
            thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }, { color: 'orange', value: config.declaredConnectionLimitWarningRatio }, { color: 'red', value: 1 }] },
            custom: {
              thresholdsStyle: { mode: 'line' },
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", observer_connection_direction="outbound"}) / on (%(clusterLabel)s, server_address, server_port) max by (%(clusterLabel)s, server_address, server_port) (observer_tcp_connection_limit{%(observerSelector)s, %(clusterLabel)s=~"$cluster", observer_connection_direction="outbound"})',
            legendFormat: 'to {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
          {
            refId: 'B',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name, server_port) (observer_tcp_connection_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", observer_connection_direction="inbound"}) / on (%(clusterLabel)s, host_name, server_port) max by (%(clusterLabel)s, host_name, server_port) (observer_tcp_connection_limit{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", observer_connection_direction="inbound"})',
            legendFormat: 'listeners on port {{server_port}} of {{host_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 34,
        type: 'timeseries',
        title: 'Handshake time (p99) by process and destination',
        description: 'How long the slowest handshakes toward each server took (99th percentile of SYN sent to ESTABLISHED; buckets at powers of 4 ms, so within a factor of 4). A round trip normally; each lost SYN adds 1 s, then 2 s, 4 s: a listener overflowing, a conntrack table full or a firewall shows as a jump to seconds, a remote site as a step up (1 ms to 40 ms).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 12,
          x: 12,
          y: 80,
        },
        fieldConfig: {
          defaults: {
            unit: 's',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'topk(10, histogram_quantile(0.99, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port, le) (label_replace(rate(observer_tcp_handshakes_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}[$__rate_interval]), "le", "$1", "observer_le", "(.*)"))))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} -> {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 35,
        type: 'timeseries',
        title: 'Handshake packets resent /s by process and destination',
        description: "SYNs a process resent to a server (outbound) and SYN-ACKs a listener resent to its clients (inbound), counted when each handshake ends, established or failed. Each resent SYN cost its connect 1 s, then 2 s, 4 s: a lossy path, a firewall, a conntrack table full, or a server's full accept queue; SYN-ACKs resent are clients' last ACKs lost or this listener's queue full. A connect that timed out shows here with its ETIMEDOUT in the connect errors. Per second over the last minute, each process counted from the birth of its series (one that lived less than a scrape, a cron job or a CLI in a loop, included).",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 12,
          x: 0,
          y: 87,
        },
        fieldConfig: {
          defaults: {
            unit: 'pps',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, observer_connection_direction, server_address, server_port) ((' + grew('observer_tcp_handshake_retransmits_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod", process_executable_name=~"$process"}', '1m') + ' / 60)))',
            legendFormat: '{{process_executable_name}} pid {{process_pid}} {{k8s_namespace_name}}/{{k8s_pod_name}} {{observer_connection_direction}} {{server_address}}:{{server_port}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 36,
        type: 'timeseries',
        title: 'Server limits inferred, against the connections held',
        description: "A server's connection limit nobody declared, as this node sees it (observer_tcp_connection_limit_inferred): the connections held toward it stay flat at this count while nearly every new one is closed by the server within milliseconds, its FIN first (the first incident: a database that closed every connection past 10,000). Beside it, the connections this node holds toward that server. Declare it with --connection-limits to be warned before it is reached.",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 7,
          w: 12,
          x: 12,
          y: 87,
        },
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'max by (%(clusterLabel)s, host_name, server_address, server_port) (observer_tcp_connection_limit_inferred{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"})',
            legendFormat: 'limit of {{server_address}}:{{server_port}} seen from {{host_name}}',
            range: true,
            instant: false,
          },
          {
            refId: 'B',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name, server_address, server_port) (observer_tcp_connection_usage{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", observer_connection_direction="outbound"}) and on (%(clusterLabel)s, host_name, server_address, server_port) max by (%(clusterLabel)s, host_name, server_address, server_port) (observer_tcp_connection_limit_inferred{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"})',
            legendFormat: 'held toward {{server_address}}:{{server_port}} from {{host_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 21,
        type: 'row',
        title: 'observer health',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 94,
        },
        panels: [],
      },
      {
        id: 22,
        type: 'table',
        title: 'Probe attach modes',
        description: "Which kernel hook runs in which mode on each node (fentry, kprobe, tracepoint, tp_btf, sock_diag). A hook missing here is not counted; observer logs why at start. missed_events=uncounted: this kernel skips runs of that hook's programs without counting them (before Linux 5.12, or 6.7 for kprobes), so observer_kernel_missed_events_total cannot say when its counts are short.",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 8,
          x: 0,
          y: 95,
        },
        fieldConfig: {
          defaults: {
            unit: 'none',
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'max by (%(clusterLabel)s, host_name, observer_hook, observer_probe_mode, observer_probe_missed_events) (observer_probe_info{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"})',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
        ],
        options: {},
        transformations: [
          {
            id: 'organize',
            options: {
              excludeByName: {
                Time: true,
                Value: true,
              },
            },
          },
        ],
      },
      {
        id: 23,
        type: 'timeseries',
        title: 'Counts observer may have missed',
        description: "Kernel events not handed to observer's programs (recursion protection) and updates lost to full maps. Both should stay 0; when not, counts may be short by that much. Evictions: entries an LRU map dropped to make room; SOCK_OWNERS evicting means TIME_WAIT entries charged to `unknown` (raise --max-sockets), INFLIGHT_CONNECTS/THREAD_CONNECTS evicting means lost connect() errors.",
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 8,
          x: 8,
          y: 95,
        },
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (host_name) (increase(observer_kernel_missed_events_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[$__rate_interval]))',
            legendFormat: 'missed events {{host_name}}',
            range: true,
            instant: false,
          },
          {
            refId: 'B',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (host_name) (increase(observer_kernel_lost_updates_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[$__rate_interval]))',
            legendFormat: 'lost updates {{host_name}}',
            range: true,
            instant: false,
          },
          {
            refId: 'C',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (host_name, observer_map_name) (increase(observer_map_evictions_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[$__rate_interval]))',
            legendFormat: '{{observer_map_name}} evictions {{host_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
      {
        id: 24,
        type: 'timeseries',
        title: 'Exports and collection',
        description: 'Export attempts and failures per exporter (prometheus: scrapes served, otlp: pushes) and how long reading the kernel takes. Failing OTLP pushes are retried; cumulative counts arrive complete once the collector answers.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 8,
          x: 16,
          y: 95,
        },
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: {
              drawStyle: 'line',
              fillOpacity: 10,
              showPoints: 'never',
            },
          },
          overrides: [],
        },
        targets: [
          {
            refId: 'A',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (host_name, observer_exporter) (rate(observer_export_failures_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[$__rate_interval]))',
            legendFormat: 'failures {{observer_exporter}} {{host_name}}',
            range: true,
            instant: false,
          },
          {
            refId: 'B',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (host_name, observer_exporter) (rate(observer_export_attempts_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[$__rate_interval]))',
            legendFormat: 'attempts {{observer_exporter}} {{host_name}}',
            range: true,
            instant: false,
          },
          {
            refId: 'C',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'histogram_quantile(0.99, sum by (host_name, le) (rate(observer_collection_duration_seconds_bucket{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[$__rate_interval])))',
            legendFormat: 'round p99 seconds {{host_name}}',
            range: true,
            instant: false,
          },
        ],
        options: {
          legend: {
            displayMode: 'table',
            placement: 'bottom',
            calcs: [
              'max',
              'lastNotNull',
            ],
          },
          tooltip: {
            mode: 'multi',
            sort: 'desc',
          },
        },
      },
    ],
  }
