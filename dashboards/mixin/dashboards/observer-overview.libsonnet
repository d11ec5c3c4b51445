// The fleet board; see ../dashboards.libsonnet for how it is rendered.
function(config)
  {
    uid: 'observer-overview',
    title: 'observer: fleet overview',
    description: 'One row per node, worst first: where ports run out, TIME_WAIT piles up or listeners overflow across the fleet, and whether observer itself is healthy everywhere.',
    tags: [
      'observer',
      'tcp',
      'fleet',
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
      ],
    },
    annotations: {
      list: [],
    },
    links: [
      {
        title: 'Connection avalanche',
        type: 'link',
        icon: 'dashboard',
        url: '/d/observer-connection-avalanche',
        keepTime: true,
        includeVars: true,
        tooltip: 'The 3 a.m. board (keeps the time range, data source, cluster and node)',
      },
    ],
    panels: [
      {
        id: 1,
        type: 'row',
        title: 'Fleet: one row per node, worst first',
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
        type: 'table',
        title: 'Nodes, worst first',
        description: 'One row per node: EADDRNOTAVAIL, TIME_WAIT entries, listen overflows and connects per second (over the last 5 minutes), sorted by EADDRNOTAVAIL then overflows. Click through to the avalanche board for the node.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 10,
          w: 24,
          x: 0,
          y: 1,
        },
        fieldConfig: {
          defaults: {
            unit: 'ops',
            links: [
              {
                title: 'Open the avalanche board for ${__data.fields.node}',
                url: '/d/observer-connection-avalanche?${datasource:queryparam}&var-cluster=${__data.fields.cluster}&var-node=${__data.fields.node}&${__url_time_range}',
              },
            ],
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
            expr: 'sum by (%(clusterLabel)s, host_name) (rate(observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", error_type="EADDRNOTAVAIL"}[5m]))',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
          {
            refId: 'B',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name) (rate(observer_tcp_time_wait_entries_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[5m]))',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
          {
            refId: 'C',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name) (rate(observer_tcp_listen_overflows_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[5m]))',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
          {
            refId: 'D',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name) (rate(observer_tcp_connects_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[5m]))',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
        ],
        options: {},
        transformations: [
          {
            id: 'merge',
            options: {},
          },
          {
            id: 'organize',
            options: {
              excludeByName: {
                Time: true,
              },
              renameByName: {
                'Value #A': 'EADDRNOTAVAIL /s',
                'Value #B': 'TIME_WAIT entries /s',
                'Value #C': 'listen overflows /s',
                'Value #D': 'connects /s',
                host_name: 'node',
                '%(clusterLabel)s': 'cluster',
              },
            },
          },
          {
            id: 'sortBy',
            options: {
              sort: [
                {
                  field: 'EADDRNOTAVAIL /s',
                  desc: true,
                },
              ],
            },
          },
        ],
      },
      {
        id: 3,
        type: 'row',
        title: 'Worst offenders across the fleet',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 11,
        },
        panels: [],
      },
      {
        id: 4,
        type: 'table',
        title: 'Processes with EADDRNOTAVAIL',
        description: 'The processes failing to get ephemeral ports in the selected time range, exactly, worst first, with the destination; a process whose first count was already a burst included.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 9,
          w: 12,
          x: 0,
          y: 12,
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
            expr: 'topk(20, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_address, server_port) (((observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", error_type="EADDRNOTAVAIL"} - observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", error_type="EADDRNOTAVAIL"} offset $__range) or (observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", error_type="EADDRNOTAVAIL"} unless observer_tcp_connect_errors_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node", error_type="EADDRNOTAVAIL"} offset $__range))) > 0)',
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
              },
            },
          },
        ],
      },
      {
        id: 5,
        type: 'table',
        title: 'Listeners that overflow',
        description: 'The listeners that dropped connections in the selected time range, exactly, worst first, with their owner; a first burst included.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 9,
          w: 12,
          x: 12,
          y: 12,
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
            expr: 'topk(20, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid, server_port) (((observer_tcp_listen_overflows_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"} - observer_tcp_listen_overflows_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"} offset $__range) or (observer_tcp_listen_overflows_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"} unless observer_tcp_listen_overflows_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"} offset $__range))) > 0)',
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
              },
            },
          },
        ],
      },
      {
        id: 6,
        type: 'timeseries',
        title: 'Top TIME_WAIT producers',
        description: 'The processes whose sockets enter TIME_WAIT fastest, fleet-wide.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 12,
          x: 0,
          y: 21,
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
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (rate(observer_tcp_time_wait_entries_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[$__rate_interval])))',
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
        id: 7,
        type: 'timeseries',
        title: 'Top connectors',
        description: 'The processes opening connections fastest, fleet-wide: a storm starts here.',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 12,
          x: 12,
          y: 21,
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
            expr: 'topk(10, sum by (%(clusterLabel)s, host_name, k8s_namespace_name, k8s_pod_name, process_executable_name, process_pid) (rate(observer_tcp_connects_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[$__rate_interval])))',
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
        id: 8,
        type: 'row',
        title: 'observer on every node',
        collapsed: false,
        gridPos: {
          h: 1,
          w: 24,
          x: 0,
          y: 29,
        },
        panels: [],
      },
      {
        id: 9,
        type: 'table',
        title: 'observer health by node',
        description: 'Per node: hooks attached (7 when healthy), OTLP export failures and kernel events missed in the last 15 minutes. A node missing here has no observer running (see the up metric).',
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        gridPos: {
          h: 8,
          w: 24,
          x: 0,
          y: 30,
        },
        fieldConfig: {
          defaults: {
            unit: 'short',
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
            expr: 'count by (%(clusterLabel)s, host_name) (observer_probe_info{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"})',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
          {
            refId: 'B',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name) (increase(observer_export_failures_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[15m]))',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
          {
            refId: 'C',
            datasource: {
              type: 'prometheus',
              uid: '${datasource}',
            },
            expr: 'sum by (%(clusterLabel)s, host_name) (increase(observer_kernel_missed_events_total{%(observerSelector)s, %(clusterLabel)s=~"$cluster", host_name=~"$node"}[15m]))',
            format: 'table',
            instant: true,
            range: false,
            legendFormat: '__auto',
          },
        ],
        options: {},
        transformations: [
          {
            id: 'merge',
            options: {},
          },
          {
            id: 'organize',
            options: {
              excludeByName: {
                Time: true,
              },
              renameByName: {
                'Value #A': 'hooks attached',
                'Value #B': 'export failures (15m)',
                'Value #C': 'kernel events missed (15m)',
                host_name: 'node',
                '%(clusterLabel)s': 'cluster',
              },
            },
          },
        ],
      },
    ],
  }
