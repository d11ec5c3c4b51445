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
  },
}
