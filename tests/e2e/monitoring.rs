//! The chart's alerts and Grafana dashboard (`deploy/helm/sluice/files/`), as the chart
//! renders them: `promtool test rules` unit-tests the alerts
//! (`tests/e2e/prometheus_rules_test.yaml`), `promtool check rules` parses every dashboard
//! query, and every metric either names must be one a running Sluice exports (memory
//! store; Redis store up, then down, for the store's error and failure-mode series).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::process::SluiceProcess;
use support::redis::RedisServer;
use support::repo_root;

/// promtool, from Debian's `prometheus` package: `SLUICE_PROMTOOL_BIN`, else the `PATH`.
fn promtool_bin() -> PathBuf {
    let found = std::env::var_os("SLUICE_PROMTOOL_BIN")
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|dir| dir.join("promtool"))
                .find(|path| path.is_file())
        });
    match found {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "promtool not found: install the Debian package prometheus (apt-get install \
             --no-install-recommends prometheus; scripts/test does) or set SLUICE_PROMTOOL_BIN"
        ),
    }
}

fn promtool(args: &[&str], file: &Path) {
    let output = Command::new(promtool_bin())
        .args(args)
        .arg(file)
        .output()
        .expect("run promtool");
    assert!(
        output.status.success(),
        "promtool {args:?} {} failed:\n{}{}",
        file.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The checks of the files the chart rendered in `dir` (`tests/e2e/helm_chart.py` writes
/// `prometheus-rules.yaml` and `grafana-dashboard.json` for the `monitoring` scenario).
pub(crate) fn check_rendered(dir: &Path) {
    let test = dir.join("prometheus_rules_test.yaml");
    std::fs::copy(
        repo_root().join("tests/e2e/prometheus_rules_test.yaml"),
        &test,
    )
    .expect("copy the alert tests next to the rendered rules");
    promtool(&["test", "rules"], &test);

    let text = std::fs::read_to_string(dir.join("grafana-dashboard.json")).expect("dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let rules: Vec<Value> = dashboard_queries(&dashboard)
        .into_iter()
        .enumerate()
        .map(
            |(i, expr)| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": expr}),
        )
        .collect();
    assert!(rules.len() >= 20, "only {} dashboard queries", rules.len());
    // JSON is YAML: a rule file with each query as a recording rule.
    let file = dir.join("dashboard-queries.yaml");
    let groups = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(&file, groups.to_string()).expect("write the queries");
    promtool(&["check", "rules"], &file);
}

/// Every panel query of the dashboard, with Grafana's variables replaced by values
/// Prometheus parses (`$__rate_interval` by `5m`, `$namespace` and the like by `.*`).
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let panels = dashboard["panels"].as_array().expect("panels");
    panels
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .map(|target| {
            let expr = target["expr"].as_str().expect("every target has an expr");
            substitute_variables(expr)
        })
        .collect()
}

fn substitute_variables(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let name: String = rest[at + 1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '{' || *c == '}')
            .collect();
        out.push_str(if name.starts_with("__") { "5m" } else { ".*" });
        rest = &rest[at + 1 + name.len()..];
    }
    out.push_str(rest);
    out
}

/// The `sluice_*` names in `text`.
fn metric_names(text: &str, into: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(at) = rest.find("sluice_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        into.insert(name);
    }
}

/// The metric names the alerts' expressions and the dashboard's queries (and its
/// variables' queries) use, from the files the chart renders unchanged.
fn used_metric_names() -> BTreeSet<String> {
    let files = repo_root().join("deploy/helm/sluice/files");
    let mut names = BTreeSet::new();
    let alerts = std::fs::read_to_string(files.join("prometheus-rules.yaml")).expect("alerts");
    let alerts: Value = serde_saphyr::from_str(&alerts).expect("the alerts are YAML");
    for group in alerts["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            metric_names(rule["expr"].as_str().expect("expr"), &mut names);
        }
    }
    let dashboard = std::fs::read_to_string(files.join("grafana-dashboard.json")).expect("json");
    let dashboard: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    for query in dashboard_queries(&dashboard) {
        metric_names(&query, &mut names);
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        metric_names(
            variable["definition"].as_str().unwrap_or_default(),
            &mut names,
        );
    }
    names
}

/// A good call through the reference's JSON endpoint (its answer does not matter here).
const CALL: &str =
    r#"{"domain":"example","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;

/// A call Sluice refuses as a bad request (`sluice_call_errors_total{kind="service_error"}`).
const BAD_CALL: &str = r#"{"domain":"","descriptors":[]}"#;

async fn call(http: &str, body: &'static str) {
    let _ = reqwest::Client::new()
        .post(format!("http://{http}/json"))
        .body(body)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .expect("POST /json");
}

/// The names of the samples `/metrics` holds now (`name` of each `name{...} value` line).
async fn exported(http: &str, into: &mut BTreeSet<String>) {
    let text = reqwest::get(format!("http://{http}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body");
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        if !name.is_empty() {
            into.insert(name.to_owned());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_use_only_exported_metrics() {
    let used = used_metric_names();
    assert!(used.len() >= 15, "too few metric names found: {used:?}");
    let config = repo_root().join("config");
    let mut samples = BTreeSet::new();

    let (memory, _, http) = SluiceProcess::serve(&config, &[]);
    call(&http, CALL).await;
    call(&http, BAD_CALL).await;
    exported(&http, &mut samples).await;
    drop(memory);

    // A Redis store, healthy and then gone: store errors, failure-mode answers.
    let mut redis = RedisServer::start();
    let url = redis.url();
    let (with_redis, _, http) =
        SluiceProcess::serve(&config, &["--store", "redis", "--redis-url", &url]);
    call(&http, CALL).await;
    redis.kill();
    for _ in 0..5 {
        call(&http, CALL).await;
    }
    exported(&http, &mut samples).await;
    drop(with_redis);

    let missing: Vec<&String> = used.difference(&samples).collect();
    assert!(
        missing.is_empty(),
        "the alerts or the dashboard use metrics no running Sluice exported: {missing:?}\n\
         (exported: {samples:?})"
    );
}

#[test]
fn grafana_variables_are_replaced() {
    assert_eq!(
        substitute_variables(
            r#"rate(x{namespace=~"$namespace", job=~"${job}"}[$__rate_interval])"#
        ),
        r#"rate(x{namespace=~".*", job=~".*"}[5m])"#
    );
}
