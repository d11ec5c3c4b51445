// observer's Grafana dashboards (grafanaDashboards), from the same
// $._config as the alert rules: every query selects observerSelector and
// names the cluster by clusterLabel, and the boards draw the warnings'
// thresholds. Rendered into ../<name>.json (the dashboards test keeps them
// equal: OBSERVER_BLESS=1 writes them); edit the boards in dashboards/.
//
// Each board is a function of the config, and every string in it (keys
// too) is a format string over the config: %(observerSelector)s,
// %(clusterLabel)s; a literal percent sign is written %%.
local formatted(x, config) =
  if std.isString(x) then x % config
  else if std.isArray(x) then [formatted(e, config) for e in x]
  else if std.isObject(x) then { [formatted(k, config)]: formatted(x[k], config) for k in std.objectFields(x) }
  else x;

local board(source, config) = formatted(source(config), config);

{
  grafanaDashboards+:: {
    'connection-avalanche.json': board(import 'dashboards/connection-avalanche.libsonnet', $._config),
    'observer-overview.json': board(import 'dashboards/observer-overview.libsonnet', $._config),
  },
}
