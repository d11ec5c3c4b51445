// observer's monitoring mixin: prometheusAlerts from one source with
// configurable selectors (config.libsonnet). `jsonnet -S -e
// 'std.manifestYamlDoc((import "mixin.libsonnet").prometheusAlerts)'`
// renders the rules; ../alerts.yaml is that, committed for people without
// jsonnet, and the dashboards test keeps the two equal.
(import 'config.libsonnet') + (import 'alerts.libsonnet')
