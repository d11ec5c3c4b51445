// observer's monitoring mixin: prometheusAlerts and grafanaDashboards from
// one source with configurable selectors and thresholds
// (config.libsonnet). ../alerts.yaml and ../*.json are them rendered,
// committed for people without jsonnet; the dashboards test keeps them
// equal. Render the rules with
//   jsonnet -S -e 'std.manifestYamlDoc((import "mixin.libsonnet").prometheusAlerts)'
// and a board with
//   jsonnet -S -e 'std.manifestJsonEx((import "mixin.libsonnet").grafanaDashboards["observer-overview.json"], "  ")'
(import 'config.libsonnet') + (import 'alerts.libsonnet') + (import 'dashboards.libsonnet')
