//! The chart's alerts and Grafana dashboard (docs/runbook.md): the PrometheusRule passes
//! `promtool check rules` and its unit tests (`monitoring/alerts.test.yaml`: each alert
//! fires on its broken series with its labels and `runbook_url`, and not on healthy
//! ones), each alert has its runbook section, the dashboard's queries parse, and every
//! metric a rule or a panel reads is one a running agent exports.

use std::{collections::BTreeSet, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};
use kube_testenv::{deploy::AGENT_NS, env_path};
use serde_json::Value;

use crate::{
    PORT,
    agent::{self, HelmRelease, helm_template},
    kube::{FIX, k, label_node, repo},
    pods::Namespace,
    wait_path,
};

/// The `runbookBaseUrl` the unit tests expect.
const RUNBOOK_BASE: &str = "https://runbook.example/runbook.md";
/// The rule's promtool unit tests (their `rule_files` is `rules.yaml` beside them).
const UNIT_TESTS: &str = include_str!("monitoring/alerts.test.yaml");
/// Series the rules read that no agent exports: Prometheus's own per target, and
/// kube-state-metrics' (BypassAgentRestarting; the agent exports no process start time).
const NOT_THE_AGENTS: [&str; 3] = [
    "up",
    "kube_pod_container_status_restarts_total",
    "kube_pod_info",
];

/// One template of the chart rendered with `sets`, as JSON.
fn render(template: &str, sets: &[&str]) -> Result<Value> {
    let text = helm_template("bypass", Some(AGENT_NS), Some(template), sets)?;
    Ok(serde_saphyr::from_str(&text)?)
}

/// The PrometheusRule's rule groups (its `spec`), as Prometheus reads a rule file.
fn rule_groups() -> Result<Value> {
    let base = format!("prometheusRule.runbookBaseUrl={RUNBOOK_BASE}");
    let rule = render(
        "templates/prometheusrule.yaml",
        &["prometheusRule.enabled=true", &base],
    )?;
    ensure!(
        rule["kind"] == "PrometheusRule",
        "not a PrometheusRule: {rule}"
    );
    Ok(rule["spec"].clone())
}

/// Every rule of `groups`.
fn rules(groups: &Value) -> Vec<&Value> {
    groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect()
}

/// The dashboard the chart ships, and the ConfigMap that carries it.
fn dashboard() -> Result<(Value, Value)> {
    let cm = render("templates/dashboard.yaml", &["dashboard.enabled=true"])?;
    let text = cm["data"]["bypass.json"]
        .as_str()
        .context("the dashboard ConfigMap has no bypass.json")?;
    Ok((serde_json::from_str(text)?, cm))
}

/// Every PromQL expression of `dashboard`: its panels' targets and its query variables
/// (`label_values(METRIC, LABEL)` as the selector `METRIC`), by panel title.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((format!("panel {title:?}"), e.to_owned()));
            }
        }
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(q) = v["query"]["query"].as_str() {
            let selector = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map_or(q, |(m, _)| m);
            out.push((format!("variable {}", v["name"]), selector.to_owned()));
        }
    }
    out
}

/// `promtool args` in `dir`: its output, or an error with it.
fn promtool(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(env_path("BYPASS_PROMTOOL", FIX)?)
        .args(args)
        .current_dir(dir)
        .output()
        .context("run promtool")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "promtool {}: {}\n{text}",
        args.join(" "),
        out.status
    );
    Ok(text)
}

#[test]
fn alerts_pass_promtool_fire_on_broken_series_only_and_the_dashboard_parses() -> Result<()> {
    let groups = rule_groups()?;
    let alerts: BTreeSet<String> = rules(&groups)
        .iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect();
    ensure!(alerts.len() == 7, "alerts: {alerts:?}");
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md"))?;
    for r in rules(&groups) {
        let name = r["alert"].as_str().context("a rule without alert")?;
        ensure!(
            ["warning", "critical"].contains(&r["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity {}",
            r["labels"]["severity"]
        );
        for a in ["summary", "description"] {
            let text = r["annotations"][a].as_str().unwrap_or("");
            ensure!(
                text.contains("{{ $labels.node }}"),
                "{name}: the {a} does not name the node: {text:?}"
            );
        }
        let url = format!("{RUNBOOK_BASE}#{}", name.to_lowercase());
        ensure!(
            r["annotations"]["runbook_url"] == url.as_str(),
            "{name}: runbook_url {}",
            r["annotations"]["runbook_url"]
        );
        ensure!(
            runbook.contains(&format!("\n## {name}\n")),
            "docs/runbook.md has no section {name}"
        );
    }
    // Each alert is expected to fire in some unit test.
    let tests: Value = serde_saphyr::from_str(UNIT_TESTS)?;
    let fired: BTreeSet<String> = tests["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|c| c["alertname"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        fired == alerts,
        "alerts {alerts:?}, unit tests that fire {fired:?}"
    );

    let dir = std::env::temp_dir().join(format!("bt-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("rules.yaml"),
        serde_json::to_string_pretty(&groups)?,
    )?;
    std::fs::write(dir.join("alerts.test.yaml"), UNIT_TESTS)?;
    let check = promtool(&dir, &["check", "rules", "rules.yaml"])?;
    ensure!(
        check.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{check}"
    );
    let unit = promtool(&dir, &["test", "rules", "alerts.test.yaml"])?;
    eprintln!("promtool test rules: {}", unit.trim());
    ensure!(unit.contains("SUCCESS"), "{unit}");

    // The dashboard's queries, with Grafana's variables given values, parse as PromQL:
    // one recording rule each.
    let (dashboard, cm) = dashboard()?;
    ensure!(
        cm["metadata"]["labels"]["grafana_dashboard"] == "1",
        "the dashboard ConfigMap is not labelled for Grafana's sidecar: {}",
        cm["metadata"]
    );
    let queries = dashboard_queries(&dashboard);
    let recorded: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, e))| {
            let expr = e.replace("$__rate_interval", "5m").replace("$node", ".*");
            serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": expr})
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": recorded}]});
    std::fs::write(dir.join("dashboard.yaml"), serde_json::to_string(&file)?)?;
    let check = promtool(&dir, &["check", "rules", "dashboard.yaml"])?;
    ensure!(
        check.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{check}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn alert_and_dashboard_queries_read_only_metrics_a_running_agent_exports() -> Result<()> {
    let _release = HelmRelease::install(&[
        &format!("image.tag={}", kube_testenv::image::VERSION),
        "dashboard.enabled=true",
    ])?;
    // The dashboard's ConfigMap as the API server keeps it.
    let (dashboard, _) = dashboard()?;
    let stored = k(&[
        "-n",
        AGENT_NS,
        "get",
        "configmap",
        "-l",
        "grafana_dashboard=1",
        "-o",
        "jsonpath={.items[0].data.bypass\\.json}",
    ])?;
    ensure!(
        serde_json::from_str::<Value>(&stored)? == dashboard,
        "the dashboard ConfigMap on the cluster is not the chart's dashboard"
    );

    // A bypassed exchange, so that the per-pod series exist too.
    label_node(Some(true))?;
    let ns = Namespace::create("bt-monitoring", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    wait_path(&client, &server, &format!("{}:{PORT}", server.ip), true)?;
    let (code, body) = agent::http_get("/metrics")?;
    ensure!(code == 200, "/metrics: {code}");
    let exported = exported_names(&body);

    let groups = rule_groups()?;
    let mut queries: Vec<(String, String)> = rules(&groups)
        .iter()
        .map(|r| {
            (
                format!("alert {}", r["alert"]),
                r["expr"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let alerts = queries.len();
    queries.extend(dashboard_queries(&dashboard));
    let mut missing = Vec::new();
    let mut read = BTreeSet::new();
    for (i, (what, expr)) in queries.iter().enumerate() {
        let names = metric_names(expr);
        ensure!(!names.is_empty(), "{what} reads no metric: {expr}");
        for name in names {
            let elsewhere = i < alerts && NOT_THE_AGENTS.contains(&name.as_str());
            if !elsewhere && !exported.contains(&name) {
                missing.push(format!("{what}: {name}"));
            }
            read.insert(name);
        }
    }
    eprintln!(
        "{} queries read {} metrics: {read:?}",
        queries.len(),
        read.len()
    );
    ensure!(
        missing.is_empty(),
        "not exported by the agent: {missing:?}\n/metrics:\n{body}"
    );
    Ok(())
}

/// The series names an OpenMetrics or Prometheus text exposition offers (pure): each
/// sample's, and each family's as its `# TYPE` line declares it (a counter's `_total`,
/// a histogram's `_bucket`, `_sum` and `_count`), so a family with no sample yet (a
/// labelled family nothing was counted in) counts too.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" if !name.ends_with("_total") => &["_total"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let name = line
                .split(|c: char| c == '{' || c.is_whitespace())
                .next()
                .unwrap_or("");
            if !name.is_empty() {
                out.insert(name.to_owned());
            }
        }
    }
    out
}

/// PromQL words that are no metric.
const KEYWORDS: [&str; 11] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Keywords followed by a list of label names.
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression reads (pure): its identifiers, leaving out
/// strings, label matchers (`{...}`), ranges (`[...]`), Grafana variables (`$node`),
/// numbers, functions and aggregations (followed by `(`), keywords, and the label lists
/// of `by`, `without`, `on`, `ignoring`, `group_left` and `group_right`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    // Past the bracket that closes the one at `i` (strings inside skipped).
    let skip_group = |mut i: usize, open: char, close: char| {
        let mut depth = 0;
        let mut quote: Option<char> = None;
        while i < chars.len() {
            let c = chars[i];
            match quote {
                Some(q) if c == '\\' && q != '`' => i += 1,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '"' || c == '\'' || c == '`' => quote = Some(c),
                None if c == open => depth += 1,
                None if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                None => {}
            }
            i += 1;
        }
        i
    };
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            // A string: find its end as a one-character group would.
            let mut j = i + 1;
            while j < chars.len() && chars[j] != c {
                j += if chars[j] == '\\' && c != '`' { 2 } else { 1 };
            }
            i = j + 1;
        } else if c == '{' {
            i = skip_group(i, '{', '}');
        } else if c == '[' {
            i = skip_group(i, '[', ']');
        } else if c == '$' || c.is_ascii_digit() || c == '.' {
            // A variable or a number (durations only appear in ranges or after offset).
            i += 1;
            while i < chars.len() && (is_part(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_start(c) {
            let start = i;
            while i < chars.len() && is_part(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            // `max by (...) (x)`: an aggregation whose label list comes first.
            let rest: String = chars[next..].iter().take(8).collect();
            let grouped = ["by", "without"].iter().any(|k| {
                rest.strip_prefix(k)
                    .is_some_and(|r| !r.starts_with(is_part))
            });
            if LABEL_LISTS.contains(&word.as_str()) {
                if call {
                    i = skip_group(next, '(', ')');
                }
            } else if !call && !grouped && !KEYWORDS.contains(&word.as_str()) {
                out.insert(word);
            }
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).into_iter().collect()
    }

    #[test]
    fn metric_names_of_promql_and_of_an_exposition() {
        assert_eq!(
            names(
                r#"increase(kube_pod_container_status_restarts_total{namespace="a",pod=~"b-.*"}[30m]) * on (namespace, pod) group_left (node) max by (namespace, pod, node) (kube_pod_info) > 0"#
            ),
            ["kube_pod_container_status_restarts_total", "kube_pod_info"]
        );
        assert_eq!(
            names(
                r#"topk(20, sum by (namespace, pod) (rate(bypass_pod_redirected_bytes_total{node=~"$node"}[$__rate_interval])))"#
            ),
            ["bypass_pod_redirected_bytes_total"]
        );
        assert_eq!(
            names("bypass_sockets / (bypass_sockets_capacity > 0) > 0.8 and on() up offset 5m"),
            ["bypass_sockets", "bypass_sockets_capacity", "up"]
        );
        assert_eq!(
            names(r#"sum(x{a="}{ \" y"}) without (b) unless bool z"#),
            ["x", "z"]
        );
        assert_eq!(names("max without (a) (m) or count by(b) (n)"), ["m", "n"]);
        let text = "# TYPE bypass_reconciles counter\nbypass_reconciles_total 3\n\
                    # TYPE bypass_refused gauge\n# HELP bypass_refused why\n\
                    # TYPE lat histogram\nbypass_sockets{a=\"b\"} 1\n# EOF\n";
        let got: Vec<String> = exported_names(text).into_iter().collect();
        assert_eq!(
            got,
            [
                "bypass_reconciles_total",
                "bypass_refused",
                "bypass_sockets",
                "lat_bucket",
                "lat_count",
                "lat_sum"
            ]
        );
    }
}
