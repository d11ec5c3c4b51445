//! The dashboards and alert rules in `dashboards/`, proven on real data:
//! observer runs under a real Prometheus server while the incidents are
//! reproduced in namespaces (port exhaustion, TIME_WAIT, a listen
//! overflow, a connection storm); then every panel's queries, taken from
//! the JSON with the variables set to "All", run through Prometheus's HTTP
//! API and must return data, naming the process that caused it. The rules
//! pass promtool's checks and unit tests, and everything refers only to
//! metric names observer exports.
mod common;

use std::{
    collections::{BTreeSet, HashSet},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use common::{
    daemon::{Daemon, start_daemon_with_env},
    incidents::{Culprits, reproduce_incidents},
    prometheus::Prometheus,
    tool,
    web::{CurlLoop, Nginx, Redis, Wrk, narrow_range},
};
use observer::export::contract;
use serde_json::Value;

const BOARDS: [&str; 2] = ["connection-avalanche.json", "observer-overview.json"];

/// Each test's daemon watches the whole node: the port-exhaustion replay
/// starts a curl per request, thousands of processes in a minute, past
/// any daemon's --max-processes (the overflow series takes the rest). The
/// tests that look for their own processes' series run beside each other,
/// never beside the replay.
static NODE_WIDE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

fn board(name: &str) -> Value {
    let path = dashboards_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not valid JSON: {e}"))
}

/// Every panel, rows' nested panels included.
fn panels(board: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in board["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// The metric names a PromQL expression uses (observer's, and `up`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let word_start = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let ours = ["observer_", "target_info"];
        if word_start && ours.iter().any(|prefix| expr[i..].starts_with(prefix)) {
            let end = expr[i..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(expr.len(), |n| i + n);
            names.insert(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

/// The names observer exports: its metrics, from a scrape's `# TYPE`
/// lines, and its labels (ours are prefixed `observer_` too, so a query's
/// word may be either).
fn exported_names(daemon: &Daemon) -> HashSet<String> {
    let body = daemon.scrape();
    // A histogram family's samples are its _bucket, _sum and _count.
    let metrics = body.lines().filter_map(|l| l.strip_prefix("# TYPE ")).flat_map(|l| {
        let (name, kind) = l.split_once(' ').unwrap_or((l, ""));
        let parts: &[&str] = if kind == "histogram" { &["", "_bucket", "_sum", "_count"] } else { &[""] };
        parts.iter().map(move |suffix| format!("{name}{suffix}")).collect::<Vec<_>>()
    });
    let labels = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| Some(l.split_once('{')?.1.rsplit_once('}')?.0))
        .flat_map(|labels| {
            labels.split("\",").filter_map(|pair| pair.split_once('=')).map(|(k, _)| k.trim_start_matches(','))
        });
    metrics.chain(labels.map(String::from)).collect()
}

#[test]
fn dashboards_are_well_formed() {
    for name in BOARDS {
        let b = board(name);
        let uid = b["uid"].as_str().unwrap_or_default();
        assert!(uid.starts_with("observer-"), "{name}: a stable uid of our own, not {uid:?}");
        let vars: Vec<&str> =
            b["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
        for want in ["datasource", "cluster", "node"] {
            assert!(vars.contains(&want), "{name}: no ${want} variable: {vars:?}");
        }
        // A link to the other board that keeps the time range and the
        // variables (data source, cluster, node).
        let other = BOARDS.iter().map(|n| board(n)["uid"].as_str().unwrap().to_string()).find(|u| u != uid).unwrap();
        let links = b["links"].as_array().map(Vec::as_slice).unwrap_or_default();
        assert!(
            links.iter().any(|l| l["url"].as_str().is_some_and(|u| u.contains(&format!("/d/{other}")))
                && l["keepTime"] == true
                && l["includeVars"] == true),
            "{name}: no link to {other} keeping time and variables: {links:?}"
        );
        let mut ids = HashSet::new();
        for p in panels(&b) {
            let title = p["title"].as_str().unwrap_or_default();
            // ${__data...} exists only in data links (fieldConfig), not in
            // a panel's own links.
            for l in p["links"].as_array().map(Vec::as_slice).unwrap_or_default() {
                assert!(!l["url"].as_str().unwrap_or_default().contains("${__data"), "{name}/{title}: {l}");
            }
            for l in p["fieldConfig"]["defaults"]["links"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let url = l["url"].as_str().unwrap_or_default();
                for keep in ["${__url_time_range}", "${datasource:queryparam}", "var-cluster="] {
                    assert!(url.contains(keep), "{name}/{title}: a data link that drops {keep}: {url}");
                }
            }
            assert!(ids.insert(p["id"].as_u64().expect("numeric panel id")), "{name}: panel id {} twice", p["id"]);
            if p["type"] == "row" {
                continue;
            }
            assert!(p["description"].as_str().is_some_and(|d| d.len() > 40), "{name}/{title}: no description");
            assert!(p["fieldConfig"]["defaults"]["unit"].as_str().is_some(), "{name}/{title}: no unit");
            // No hard-coded data source: the panel and each query use ${datasource}.
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}/{title}");
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{name}/{title}: no query");
            for t in targets {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{name}/{title}");
                assert!(!metric_names(t["expr"].as_str().unwrap()).is_empty(), "{name}/{title}: {}", t["expr"]);
            }
        }
    }
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let promtool = tool("OBSERVER_PROMTOOL", "promtool");
    let dir = dashboards_dir();
    for args in [vec!["check", "rules", "alerts.yaml"], vec!["test", "rules", "alerts_test.yaml"]] {
        let out = Command::new(&promtool).args(&args).current_dir(&dir).output().unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every alert has a unit test that fires it.
    let rules = std::fs::read_to_string(dir.join("alerts.yaml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts_test.yaml")).unwrap();
    for alert in rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).map(|a| a.trim_matches('"')) {
        let fired = tests.split("alertname: ").skip(1).any(|t| t.starts_with(alert) && t.contains("exp_labels"));
        let quiet = tests.split("alertname: ").skip(1).any(|t| t.starts_with(alert) && t.contains("exp_alerts: []"));
        assert!(fired && quiet, "{alert}: needs a unit test firing (exp_labels) and one not firing (exp_alerts: [])");
    }
    // Every runbook an alert points to is written (docs/runbooks/).
    let runbooks = dir.parent().unwrap().join("docs/runbooks");
    for url in rules.lines().filter_map(|l| l.trim().strip_prefix("runbook_url: ")) {
        let file = url.trim_matches('"').rsplit('/').next().unwrap();
        assert!(runbooks.join(file).is_file(), "{url}: no docs/runbooks/{file}");
    }
}

/// What alerts.yaml starts with, before the rendered rules.
const ALERTS_HEADER: &str = "\
# Prometheus alert rules for observer's metrics, rendered from the monitoring
# mixin in mixin/ (edit that, then run the dashboards test with
# OBSERVER_BLESS=1); committed for people without jsonnet. The same rules as
# a prometheus-operator PrometheusRule are in
# deploy/kubernetes/components/prometheusrule/. Unit tests: alerts_test.yaml
# (`promtool test rules dashboards/alerts_test.yaml`).
";

/// What Debian's jsonnet renders of the mixin: `expression` evaluated in
/// dashboards/mixin, as a string (-S).
fn render_mixin(expression: &str) -> String {
    let jsonnet = tool("OBSERVER_JSONNET", "jsonnet");
    let out = Command::new(&jsonnet)
        .args(["-S", "-e", expression])
        .current_dir(dashboards_dir().join("mixin"))
        .output()
        .expect("jsonnet runs");
    assert!(out.status.success(), "jsonnet: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The committed dashboards/`file` must equal `want`, the mixin rendered;
/// `OBSERVER_BLESS=1` rewrites it after the mixin changed.
fn rendered(file: &str, want: &str) {
    let path = dashboards_dir().join(file);
    if std::env::var_os("OBSERVER_BLESS").is_some() {
        std::fs::write(&path, want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "{file} is not the mixin rendered: rerun the dashboards test with OBSERVER_BLESS=1");
}

/// alerts.yaml is the mixin's prometheusAlerts as jsonnet renders them.
#[test]
fn the_alert_rules_are_the_mixin_rendered() {
    let render = "std.manifestYamlDoc((import 'mixin.libsonnet').prometheusAlerts, indent_array_in_object=true, \
                  quote_keys=false)";
    rendered("alerts.yaml", &format!("{ALERTS_HEADER}{}", render_mixin(render)));
}

/// Each board is the mixin's grafanaDashboards entry as jsonnet renders it.
#[test]
fn the_dashboards_are_the_mixin_rendered() {
    for name in BOARDS {
        let render = format!("std.manifestJsonEx((import 'mixin.libsonnet').grafanaDashboards['{name}'], '  ')");
        rendered(name, &render_mixin(&render));
    }
}

/// A config of one's own changes every query's selector, the cluster
/// label and the thresholds drawn, as the mixin's users expect.
#[test]
fn the_mixin_config_reaches_every_dashboard_query() {
    let config = "{ _config+:: { observerSelector: 'job=\"node-observer\"', clusterLabel: 'cluster', \
                  portUsageWarningRatio: 0.5 } }";
    for name in BOARDS {
        let board: Value = serde_json::from_str(&render_mixin(&format!(
            "std.manifestJson(((import 'mixin.libsonnet') + {config}).grafanaDashboards['{name}'])"
        )))
        .unwrap();
        let text = board.to_string();
        assert!(!text.contains("k8s_cluster_name"), "{name}: the cluster label is configurable");
        let exprs: Vec<&str> = panels(&board)
            .into_iter()
            .flat_map(|p| p["targets"].as_array().into_iter().flatten())
            .filter_map(|t| t["expr"].as_str())
            .collect();
        assert!(!exprs.is_empty());
        for expr in exprs {
            let selectors = expr.matches('{').count();
            assert_eq!(expr.matches("job=\"node-observer\"").count(), selectors, "{name}: every selector: {expr}");
        }
    }
    let avalanche = render_mixin(&format!(
        "std.manifestJson(((import 'mixin.libsonnet') + {config}).grafanaDashboards['connection-avalanche.json'])"
    ));
    assert!(avalanche.contains("\"value\": 0.5"), "the port usage threshold drawn from the config");
}

/// A file generated from `dashboards/` into deploy/kubernetes/components
/// must equal `want`; `OBSERVER_BLESS=1` rewrites it after the source
/// changed.
fn generated(component_file: &str, want: &str) {
    let path = dashboards_dir().join("../deploy/kubernetes/components").join(component_file);
    if std::env::var_os("OBSERVER_BLESS").is_some() {
        std::fs::write(&path, want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not generated from dashboards/: rerun this test with OBSERVER_BLESS=1",
        path.display()
    );
}

/// The PrometheusRule component is alerts.yaml wrapped for
/// prometheus-operator.
#[test]
fn the_prometheusrule_carries_the_same_rules() {
    let rules = std::fs::read_to_string(dashboards_dir().join("alerts.yaml")).unwrap();
    let groups = &rules[rules.find("groups:").expect("groups:")..];
    let mut want = String::from(
        "# Generated from dashboards/alerts.yaml (rendered from dashboards/mixin: edit\n\
         # that, then run the dashboards test with OBSERVER_BLESS=1): the same rules as a prometheus-operator\n\
         # resource. kube-prometheus-stack selects rules by its release label:\n\
         # adjust `release` to yours, or set ruleSelectorNilUsesHelmValues=false.\n\
         apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: observer\n  \
         namespace: observer\n  labels:\n    app.kubernetes.io/name: observer\n    release: prometheus\nspec:\n",
    );
    for line in groups.lines() {
        want.push_str(if line.is_empty() { "" } else { "  " });
        want.push_str(line);
        want.push('\n');
    }
    generated("prometheusrule/prometheusrule.yaml", &want);
}

/// The Grafana component is every dashboard of dashboards/, each a key of
/// one ConfigMap labelled for Grafana's dashboard sidecar.
#[test]
fn the_grafana_component_carries_every_dashboard() {
    let mut want = String::from(
        "# Generated from dashboards/*.json (edit those, then run the dashboards\n\
         # test with OBSERVER_BLESS=1). Grafana's dashboard sidecar loads every\n\
         # ConfigMap labelled grafana_dashboard.\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: observer-dashboards\n  namespace: observer\n  \
         labels:\n    app.kubernetes.io/name: observer\n    grafana_dashboard: \"1\"\ndata:\n",
    );
    let mut names: Vec<String> = std::fs::read_dir(dashboards_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    assert!(names.len() >= 2, "{names:?}");
    for name in names {
        let json = std::fs::read_to_string(dashboards_dir().join(&name)).unwrap();
        want.push_str(&format!("  {name}: |\n"));
        for line in json.lines() {
            assert!(!line.contains('\t'), "{name}: tabs do not survive a YAML block");
            want.push_str(if line.is_empty() { "" } else { "    " });
            want.push_str(line);
            want.push('\n');
        }
    }
    generated("grafana-dashboards/dashboards.yaml", &want);
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The process a query about `expr`'s metric must name.
fn expected(culprits: &Culprits, expr: &str) -> Option<u32> {
    if expr.contains("EADDRNOTAVAIL") {
        Some(culprits.ports)
    } else if expr.contains("observer_tcp_time_wait_entries_total") {
        Some(culprits.time_wait)
    } else if expr.contains("observer_tcp_listen_overflows_total") {
        Some(culprits.listener)
    } else if expr.contains("observer_tcp_connects_total")
        || expr.contains("observer_tcp_accepts_total")
        || expr.contains("observer_tcp_connections_established_total")
        || expr.contains("observer_tcp_connections_closed_total")
        || expr.contains("observer_tcp_handshakes_total")
    {
        Some(culprits.storm)
    } else if expr.contains("observer_tcp_handshake_retransmits_total") {
        Some(culprits.lossy)
    } else if expr.contains("observer_tcp_connection_usage") {
        // The port-exhaustion client holds its six connections for seconds.
        Some(culprits.ports)
    } else {
        None
    }
}

/// Grafana's variables as a user choosing "All" sets them.
fn substitute(expr: &str, range_seconds: u64) -> String {
    let mut e = expr.to_string();
    for var in ["$cluster", "$node", "$namespace", "$pod", "$process"] {
        e = e.replace(var, ".*");
    }
    // Four scrape intervals, as Grafana's $__rate_interval would be.
    e.replace("$__rate_interval", "4s").replace("$__range", &format!("{range_seconds}s")).replace("$__interval", "1s")
}

#[test]
fn every_panel_query_returns_data_naming_the_process_behind_it() {
    let _beside_others = NODE_WIDE.read().unwrap_or_else(|e| e.into_inner());
    // Limits declared for the port-exhaustion incident's server (its
    // client and its listener hold connections for seconds).
    let daemon = start_daemon_with_env(
        &["--connection-limits", "127.0.0.1:8080=10,*:8080=10"],
        &[("NODE_NAME", "node-dash"), ("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=test-cluster")],
    );
    let prometheus = Prometheus::start(daemon.port);
    let start = now();
    let incidents = reproduce_incidents();
    let culprits = &incidents.culprits;
    // Until Prometheus has scraped the last of them (the server limit
    // comes ~17 s after they start), and twice more.
    let last = format!("observer_tcp_connects_total{{process_pid=\"{}\"}}", culprits.storm);
    assert!(!prometheus.query_until_found(&last, Duration::from_secs(30)).is_empty(), "{}", prometheus.log());
    let inferred = "observer_tcp_connection_limit_inferred";
    assert!(!prometheus.query_until_found(inferred, Duration::from_secs(30)).is_empty(), "{}", daemon.log());
    std::thread::sleep(Duration::from_secs(3));
    let range = now() - start + 1;

    let exported = exported_names(&daemon);
    // What this kernel cannot count, as observer_probe_info says: a query
    // of those alone has no data here (the kernel matrix counts them).
    let absent = common::daemon::said_absent(&daemon.scrape());
    let mut failures = Vec::new();
    for name in BOARDS {
        let b = board(name);
        for var in b["templating"]["list"].as_array().unwrap() {
            let definition = var["definition"].as_str().unwrap_or_default();
            for metric in metric_names(definition) {
                if !exported.contains(&metric) {
                    failures.push(format!("{name}: variable ${}: observer exports no {metric}", var["name"]));
                }
            }
            // The process variable offers every process observer reports
            // on: the listener's owner too, which only overflows.
            if let Some(selector) =
                definition.strip_prefix("label_values(").and_then(|d| d.strip_suffix(", process_executable_name)"))
            {
                let owner =
                    substitute(&selector.replacen('{', &format!("{{process_pid=\"{}\", ", culprits.listener), 1), 0);
                if prometheus.query(&format!("count({owner})")).is_empty() {
                    failures.push(format!(
                        "{name}: variable ${} does not offer the listener's owner: {owner}",
                        var["name"]
                    ));
                }
            }
        }
        for p in panels(&b).into_iter().filter(|p| p["type"] != "row") {
            let title = p["title"].as_str().unwrap();
            for t in p["targets"].as_array().unwrap() {
                let expr = t["expr"].as_str().unwrap();
                let instruments: Vec<String> = metric_names(expr)
                    .into_iter()
                    .filter(|m| contract::ALL.iter().any(|i| i.prometheus_name() == *m))
                    .collect();
                if !instruments.is_empty() && instruments.iter().all(|m| absent.contains(m)) {
                    eprintln!("{name}/{title}: not checked, this kernel cannot count {expr}");
                    continue;
                }
                for metric in metric_names(expr) {
                    if !exported.contains(&metric) {
                        failures.push(format!("{name}/{title}: observer exports no {metric}"));
                    }
                }
                let promql = substitute(expr, range);
                // (labels, whether any value is above zero)
                let series: Vec<(Value, bool)> = if t["instant"] == true {
                    prometheus.query(&promql).into_iter().map(|(l, v)| (l, v > 0.0)).collect()
                } else {
                    prometheus
                        .query_range(&promql, start, 1)
                        .into_iter()
                        .map(|(l, v)| (l, v.iter().any(|x| *x > 0.0)))
                        .collect()
                };
                if series.is_empty() {
                    failures.push(format!("{name}/{title}: no data for {promql}"));
                    continue;
                }
                // A ranking over the time range counts exactly, a series
                // born with its whole count (the burst) included.
                if t["instant"] == true && expr.contains("EADDRNOTAVAIL") && expr.contains("$__range") {
                    let counts = prometheus.query(&promql);
                    let burst = counts.iter().find(|(l, _)| l["process_pid"] == culprits.burst.to_string().as_str());
                    if burst.map(|(_, v)| *v as u64) != Some(culprits.burst_errors) {
                        failures.push(format!(
                            "{name}/{title}: the burst's {} EADDRNOTAVAIL (pid {}) not counted: {counts:?}",
                            culprits.burst_errors, culprits.burst
                        ));
                    }
                }
                // A panel about an incident must show it, not zeros.
                if let Some(pid) = expected(culprits, expr) {
                    if !series.iter().any(|(_, nonzero)| *nonzero) {
                        failures.push(format!("{name}/{title}: only zeros for {promql}"));
                    }
                    let names_processes = series.iter().any(|(l, _)| l.get("process_pid").is_some());
                    let names_culprit =
                        series.iter().any(|(l, nonzero)| *nonzero && l["process_pid"] == pid.to_string().as_str());
                    if names_processes && !names_culprit {
                        failures.push(format!("{name}/{title}: pid {pid} not among {:?}", series));
                    }
                }
            }
        }
    }
    // The alert rules too (names in their texts included).
    let rules = std::fs::read_to_string(dashboards_dir().join("alerts.yaml")).unwrap();
    // (An instrument this kernel cannot count, and its labels, excepted.)
    let absent_labels: Vec<String> = contract::ONLY_WITH_HOOK
        .iter()
        .filter(|(i, _)| absent.contains(&i.prometheus_name()))
        .flat_map(|(i, _)| i.keys().map(|a| contract::prometheus_label(a.key)))
        .collect();
    let missing = |m: &String| !exported.contains(m) && !absent.contains(m) && !absent_labels.contains(m);
    for metric in metric_names(&rules).into_iter().filter(missing) {
        failures.push(format!("alerts.yaml: observer exports no {metric}"));
    }
    assert!(failures.is_empty(), "{} problems:\n{}", failures.len(), failures.join("\n"));
}

/// The first incident's unknown limit as a line of configuration: a
/// database declared to take 20 connections, clients holding 17 of them
/// (as `ss` shows), and the alert rule, unchanged, pending on real data
/// with the usage and the limit it compares.
#[test]
fn the_declared_limit_alert_holds_on_real_connections() {
    let _beside_others = NODE_WIDE.read().unwrap_or_else(|e| e.into_inner());
    let ns = observer_testing::Netns::new();
    let daemon = start_daemon_with_env(&["--connection-limits", "127.0.0.1:5432=20"], &[]);
    let prometheus = Prometheus::start_with_rules(daemon.port, Some(&dashboards_dir().join("alerts.yaml")));
    let _server = ns.serve(&["--listen", "127.0.0.1:5432", "--hold"]);
    let pool = ns.client_holding(&["--to", "127.0.0.1:5432", "--count", "17"]);
    assert_eq!(ns.established("dport = :5432", Some(pool.pid())), 17, "ss");

    let pending = "ALERTS{alertname=\"ObserverConnectionsNearDeclaredLimit\", alertstate=\"pending\"}";
    let alerts = prometheus.query_until_found(pending, Duration::from_secs(30));
    assert_eq!(alerts.len(), 1, "{alerts:?}\n{}", prometheus.log());
    let labels = &alerts[0].0;
    assert_eq!((labels["server_address"].as_str(), labels["server_port"].as_str()), (Some("127.0.0.1"), Some("5432")));
    let ratio = prometheus.query(
        "sum(observer_tcp_connection_usage{observer_connection_direction=\"outbound\", server_port=\"5432\"}) / \
         max(observer_tcp_connection_limit{server_port=\"5432\"})",
    );
    assert_eq!(ratio.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [17.0 / 20.0]);
}

/// The port-exhaustion incident replayed as a new user would (nginx, 200
/// ports, a new connection per request closed first by the client, each
/// failure retried 3 times: a curl loop): ObserverConnectionReuseMissing,
/// unchanged from alerts.yaml, fires for the replay's namespace and
/// destination within 60 s of the replay's start (so within 60 s of its
/// first EADDRNOTAVAIL, which comes later), while a pool (wrk holding 150
/// of its 200 ports open, toward its own nginx) runs beside it all along
/// and is never even pending.
#[test]
fn missing_reuse_alerts_within_a_minute_of_a_replayed_exhaustion_and_never_for_a_pool() {
    use std::os::unix::fs::MetadataExt as _;
    let _alone = NODE_WIDE.write().unwrap_or_else(|e| e.into_inner());
    let inode = |ns: &observer_testing::Netns| std::fs::metadata(ns.path()).unwrap().ino();
    let daemon = start_daemon_with_env(&[], &[]);
    let prometheus = Prometheus::start_with_rules(daemon.port, Some(&dashboards_dir().join("alerts.yaml")));
    let pooled = narrow_range();
    let _pool_server = Nginx::start(&pooled, "127.0.0.1:8080");
    let pool = Wrk::start(&pooled, "http://127.0.0.1:8080/", 150, Duration::from_secs(120));
    pool.until_open(&pooled, 150);

    let replay = narrow_range();
    let _nginx = Nginx::start(&replay, "127.0.0.1:8080");
    let start = std::time::Instant::now();
    let client = CurlLoop::start(&replay, "http://127.0.0.1:8080/", 4);
    let alert = |ns: &observer_testing::Netns, state: &str| {
        format!(
            "ALERTS{{alertname=\"ObserverConnectionReuseMissing\", {state}observer_network_namespace=\"{}\"}}",
            inode(ns)
        )
    };
    let firing = prometheus.query_until_found(&alert(&replay, "alertstate=\"firing\", "), Duration::from_secs(60));
    let took = start.elapsed();
    assert_eq!(firing.len(), 1, "not firing within 60 s: {firing:?}\n{}", daemon.log());
    assert!(took <= Duration::from_secs(60), "fired {took:?} after the replay's start");
    assert!(client.eaddrnotavail() > 0, "the replay must meet EADDRNOTAVAIL (fired after {took:?})");
    let labels = &firing[0].0;
    assert_eq!((labels["server_address"].as_str(), labels["server_port"].as_str()), (Some("127.0.0.1"), Some("8080")));

    // The pool held most of its ports open the whole time, pending never.
    let pool_ports = prometheus.query(&format!(
        "min_over_time(observer_ephemeral_port_usage{{observer_network_namespace=\"{}\", server_port=\"8080\"}}[30s])",
        inode(&pooled)
    ));
    assert!(pool_ports.iter().any(|(_, v)| *v >= 150.0), "the pool's ports: {pool_ports:?}");
    let pool_alerts = prometheus.query(&format!("max_over_time({}[5m])", alert(&pooled, "")));
    assert!(pool_alerts.is_empty(), "a pool that reuses its connections: {pool_alerts:?}");
}

/// A CLI in a loop: 30 runs of curl toward nginx, each its own process
/// living a few milliseconds, far less than a scrape (a copy named
/// `short-cli`, so that no other test's curl counts). Each pid's series is
/// born at its final count, which rate() cannot see; the panel that
/// compares a program's connect rate with its own last 30 minutes must
/// still show it, having counted every connect the kernel made
/// (TcpActiveOpens of the namespace), and so must the ranking by process
/// and the "Is it happening?" rate.
#[test]
fn short_lived_processes_show_on_the_connect_rate_panel() {
    let _beside_others = NODE_WIDE.read().unwrap_or_else(|e| e.into_inner());
    let daemon = start_daemon_with_env(&[], &[]);
    let prometheus = Prometheus::start(daemon.port);
    let dir = std::env::temp_dir().join(format!("observer-short-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cli = dir.join("short-cli");
    let curl = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("curl"))
        .find(|p| p.is_file())
        .expect("curl on PATH: run the tests with `cargo xtask test`, which installs it");
    std::fs::copy(curl, &cli).unwrap();
    let ns = observer_testing::Netns::new();
    let _nginx = Nginx::start(&ns, "127.0.0.1:8080");
    let opens_before = ns.nstat("TcpActiveOpens");
    let started = now();
    for _ in 0..30 {
        let status =
            ns.command(cli.to_str().unwrap()).args(["-sf", "-o", "/dev/null", "http://127.0.0.1:8080/"]).status();
        assert!(status.unwrap().success());
        std::thread::sleep(Duration::from_millis(100));
    }
    let opened = (ns.nstat("TcpActiveOpens") - opens_before) as f64;
    assert_eq!(opened, 30.0, "one connect per run");

    // Every run scraped, with its count: each pid's last value, summed.
    let counted = "sum(last_over_time(observer_tcp_connects_total{process_executable_name=\"short-cli\"}[5m]))";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while prometheus.query(counted).first().is_none_or(|(_, v)| *v < opened) {
        assert!(std::time::Instant::now() < deadline, "{:?}\n{}", prometheus.query(counted), daemon.log());
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(prometheus.query(counted)[0].1, opened, "once each");

    // The panel: every connect of the last 2 minutes was one of these 30,
    // and so was every one of the last 30: (30 / 120 s) / (30 / 1800 s).
    // A panel's query as Grafana runs it with the process variable set to
    // the CLI.
    let avalanche = board("connection-avalanche.json");
    let cli_on = |title: &str| {
        let panel = panels(&avalanche).into_iter().find(|p| p["title"] == title).expect(title);
        substitute(panel["targets"][0]["expr"].as_str().unwrap(), now() - started)
            .replace("process_executable_name=~\".*\"", "process_executable_name=\"short-cli\"")
    };
    let expr = cli_on("Connect rate against its own last 30 minutes");
    let shown = prometheus.query(&expr);
    assert_eq!(shown.len(), 1, "{expr}: {shown:?}");
    assert_eq!(shown[0].0["process_executable_name"], "short-cli");
    assert!((shown[0].1 - 1800.0 / 120.0).abs() < 1e-9, "{expr}: {shown:?}");

    // The ranking by process shows them too, each at its one connect in
    // the last minute (those it ranks: the top 10).
    let expr = cli_on("Connects by process");
    let ranked = prometheus.query(&expr);
    assert_eq!(ranked.len(), 10, "{expr}: {ranked:?}");
    assert!(ranked.iter().all(|(_, v)| (v - 1.0 / 60.0).abs() < 1e-9), "{expr}: {ranked:?}");
    // And "Is it happening?": its 30 connects in the last minute.
    let expr = cli_on("Connects /s");
    let now_rate = prometheus.query(&expr);
    assert!(now_rate.len() == 1 && (now_rate[0].1 - opened / 60.0).abs() < 1e-9, "{expr}: {now_rate:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first incident's server, a limit nobody declared: a real database,
/// redis-server with `maxclients 5`, holds 5 connections and turns every
/// further one away at once ("-ERR max number of clients reached", then
/// its FIN) while a pool keeps opening new ones. Beside it, its
/// look-alike: a server whose 5 pooled connections stay open and whose
/// other clients open short connections at the same pace, closing each
/// themselves. On a real Prometheus, observer_tcp_connection_limit_inferred
/// equals the 5 `ss` shows held, and ObserverServerLimitInferred,
/// unchanged from alerts.yaml, is pending for the first and never for the
/// look-alike.
#[test]
fn a_servers_undeclared_limit_is_inferred_and_its_look_alike_is_not() {
    let _beside_others = NODE_WIDE.read().unwrap_or_else(|e| e.into_inner());
    let daemon = start_daemon_with_env(&[], &[]);
    let prometheus = Prometheus::start_with_rules(daemon.port, Some(&dashboards_dir().join("alerts.yaml")));
    let ns = observer_testing::Netns::new();
    let (limited, healthy) = ("127.0.0.1:27018", "127.0.0.1:27019");
    let _redis = Redis::start(&ns, limited, 5);
    let _healthy_server = ns.serve(&["--listen", healthy]);
    let _healthy_pool = ns.client_holding(&["--to", healthy, "--count", "5"]);
    let spawn = |args: &[&str]| {
        ns.command(&observer_testing::churn()).args(args).stdout(std::process::Stdio::null()).spawn().unwrap()
    };
    let mut pool = spawn(&["connect", "--to", limited, "--count", "90", "--hold", "--spread", "30s"]);
    let mut short = spawn(&["connect", "--to", healthy, "--count", "90", "--spread", "30s"]);

    let pending = "ALERTS{alertname=\"ObserverServerLimitInferred\", server_port=\"27018\"}";
    let alerts = prometheus.query_until_found(pending, Duration::from_secs(40));
    assert_eq!(alerts.len(), 1, "{alerts:?}\n{}", daemon.log());
    assert_eq!(alerts[0].0["server_address"], "127.0.0.1");
    let held = ns.established("dport = :27018", Some(pool.id()));
    assert_eq!(held, 5, "ss: the connections the server holds");
    let inferred = prometheus.query("observer_tcp_connection_limit_inferred{server_port=\"27018\"}");
    assert_eq!(inferred.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [held as f64]);
    let look_alike = prometheus.query(
        "max_over_time(observer_tcp_connection_limit_inferred{server_port=\"27019\"}[5m]) or \
         max_over_time(ALERTS{alertname=\"ObserverServerLimitInferred\", server_port=\"27019\"}[5m])",
    );
    assert!(look_alike.is_empty(), "clients that close their short connections: {look_alike:?}");
    // Its look-alike had the same pace of short connections: it did.
    let ends =
        prometheus.query("sum(observer_tcp_connections_closed_total{server_port=\"27019\", observer_le=\"+Inf\"})");
    assert!(ends.first().is_some_and(|(_, v)| *v >= 10.0), "the look-alike's short connections: {ends:?}");
    let _ = (pool.kill(), pool.wait(), short.kill(), short.wait());
}
