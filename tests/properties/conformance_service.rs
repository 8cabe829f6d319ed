//! Runs the reference's service-level conformance cases (`../shared/conformance`) against
//! Sluice with the memory store: `scenario` over real gRPC to a server on loopback;
//! `service_aggregation`, `backend_arithmetic`, `service_reload`, `json_endpoint` and
//! `health` through the library's public API and the admin port. Cases listed in
//! `tests/properties/conformance_exclusions.yaml` are skipped, each with its reason.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::algorithm::{AlgorithmKind, Quota, MICROS_PER_SECOND};
use sluice::clock::ManualClock;
use sluice::proto::common::rate_limit_descriptor::Entry as WireEntry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::{RateLimitRequest, RateLimitResponse};
use sluice::rules::live::LiveRules;
use sluice::rules::{Entry, Unit};
use sluice::service::Service;
use sluice::store::memory::MemoryStore;
use sluice::store::{CounterKey, LimitCheck, Store, StoreCheck};
use sluice::telemetry::Metrics as SluiceMetrics;
use support::{settings_from, Metrics, TestServer};

type Failures = Vec<String>;

/// Runs `run` for every case of `kinds` not excluded; fails listing every failure.
async fn run_kind<F, Fut>(kinds: &[&str], run: F)
where
    F: Fn(Value, std::path::PathBuf) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let Some(dir) = support::conformance_dir() else {
        return;
    };
    let exclusions = support::exclusions();
    let cases = support::load_cases(&dir);
    for id in exclusions.keys() {
        assert!(
            cases.iter().any(|case| case["id"] == json!(id)),
            "excluded case {id} does not exist"
        );
    }
    let mut failures: Failures = Vec::new();
    let mut ran = 0;
    for case in cases {
        let kind = case["kind"].as_str().unwrap_or_default();
        let id = case["id"].as_str().unwrap_or_default().to_owned();
        if !kinds.contains(&kind) || exclusions.contains_key(&id) {
            continue;
        }
        ran += 1;
        if let Err(error) = run(case, dir.join("configs")).await {
            failures.push(format!("{id}: {error}"));
        }
    }
    eprintln!("{kinds:?}: ran {ran} cases, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "failing cases:\n{}",
        failures.join("\n")
    );
    assert!(ran > 0, "no {kinds:?} case ran");
}

// === scenarios over gRPC =====================================================

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios() {
    run_kind(&["scenario"], run_scenario).await;
}

async fn run_scenario(case: Value, configs: std::path::PathBuf) -> Result<(), String> {
    support::early_in_minute(Duration::from_secs(15)).await;
    let placeholders: Vec<(String, String)> = case["placeholders"]
        .as_object()
        .map(|map| {
            map.keys()
                .map(|key| (key.clone(), format!("v{:016x}", rand_u64())))
                .collect()
        })
        .unwrap_or_default();
    let substitute = |text: &str| {
        placeholders
            .iter()
            .fold(text.to_owned(), |acc, (from, to)| acc.replace(from, to))
    };
    let files = config_files(&case["configs"], &configs)?;
    let env = string_map(&case["settings"]);
    let server = TestServer::start(&files, &env, &[]).await;
    let mut client = server.client().await;
    let mut step_durations: HashMap<String, i64> = HashMap::new();
    let mut before_action: Option<Metrics> = None;

    for (index, step) in case["steps"].as_array().into_iter().flatten().enumerate() {
        let context = |error: String| format!("step {index}: {error}");
        if let Some(call) = step.get("call") {
            let request = request_from(call, &substitute);
            let response = client
                .should_rate_limit(request)
                .await
                .map_err(|status| context(format!("gRPC error {status}")))?
                .into_inner();
            let expect = &step["expect"];
            check_response(&response, expect).map_err(context)?;
            if let Some(stats) = expect.get("stats").and_then(Value::as_object) {
                let metrics = server.metrics().await;
                for (name, value) in stats {
                    let got = metrics.reference_stat(&substitute(name));
                    if got != value.as_f64().unwrap_or(-1.0) {
                        return Err(context(format!("stat {name}: expected {value}, got {got}")));
                    }
                }
            }
            let duration = response
                .statuses
                .first()
                .and_then(|s| s.duration_until_reset.as_ref())
                .map_or(0, |d| d.seconds);
            if let Some(id) = step.get("id").and_then(Value::as_str) {
                step_durations.insert(id.to_owned(), duration);
            }
            if let Some(earlier) = expect
                .get("duration_until_reset_less_than_step")
                .and_then(Value::as_str)
            {
                let then = step_durations.get(earlier).copied().unwrap_or(0);
                if duration >= then {
                    return Err(context(format!(
                        "duration_until_reset {duration} not less than step {earlier}'s {then}"
                    )));
                }
            }
        } else if let Some(action) = step.get("action").and_then(Value::as_str) {
            let file = step["file"].as_str().unwrap_or_default();
            if action != "wait_until_counter_increases" {
                before_action = Some(server.metrics().await);
            }
            match action {
                "add_config_file" => {
                    let text = std::fs::read_to_string(configs.join(file))
                        .map_err(|e| context(format!("{file}: {e}")))?;
                    server.write_config(file, &text);
                }
                "remove_config_file" => server.remove_config(file),
                "wait_until_counter_increases" => {
                    let counter = step["counter"].as_str().unwrap_or_default();
                    let start = before_action
                        .as_ref()
                        .map_or(0.0, |m| m.reference_stat(counter));
                    let deadline = Instant::now() + Duration::from_secs(10);
                    loop {
                        if server.metrics().await.reference_stat(counter) > start {
                            break;
                        }
                        if Instant::now() > deadline {
                            return Err(context(format!("{counter} did not increase in 10 s")));
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                other => return Err(context(format!("unknown action {other}"))),
            }
        } else if let Some(seconds) = step.get("sleep_seconds").and_then(Value::as_f64) {
            tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        }
    }
    server.stop().await;
    Ok(())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(support::unix_seconds());
    hasher.finish()
}

// === in-process cases ==========================================================

/// A service wired by hand around a manual clock, as `server::run` wires it.
struct Harness {
    service: Service<Arc<MemoryStore>>,
    store: Arc<MemoryStore>,
    metrics: Arc<SluiceMetrics>,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new(files: &[(String, String)], env: &[(String, String)], now_seconds: u64) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            support::write_file(dir.path(), name, text);
        }
        let path = dir.path().to_string_lossy().into_owned();
        let settings = settings_from(&["sluice", "serve", "--config", &path], env);
        let clock = Arc::new(ManualClock::new(now_seconds * MICROS_PER_SECOND));
        let store = Arc::new(MemoryStore::new(10_000, clock.clone()));
        let metrics = Arc::new(SluiceMetrics::new());
        let rules = Arc::new(LiveRules::new(dir.path(), settings.load));
        let _ = rules.reload();
        let service = Service::builder(store.clone(), rules)
            .clock(clock.clone())
            .limiter_settings(settings.limiter)
            .response(settings.response.clone())
            .bounds(settings.bounds)
            .metrics(metrics.clone())
            .build();
        Self {
            service,
            store,
            metrics,
            clock,
            _dir: dir,
        }
    }

    fn metrics(&self) -> Metrics {
        Metrics::parse(&self.metrics.encode())
    }

    /// Adds `hits` to a fixed-window counter directly in the store.
    async fn charge(
        &self,
        domain: &str,
        entries: &[(String, String)],
        limit: u64,
        unit: Unit,
        hits: u64,
    ) {
        if hits == 0 {
            return;
        }
        let borrowed: Vec<Entry<'_>> = entries
            .iter()
            .map(|(key, value)| Entry { key, value })
            .collect();
        let check = StoreCheck {
            key: CounterKey::new(
                domain,
                &borrowed,
                &[],
                [(AlgorithmKind::FixedWindow, unit.micros())],
            ),
            limits: vec![LimitCheck {
                algorithm: AlgorithmKind::FixedWindow,
                quota: Quota {
                    limit,
                    period: unit.micros(),
                    burst: limit,
                    on_over_limit: Default::default(),
                },
                sharing: sluice::regions::Sharing::Regional,
            }]
            .into(),
            cost: hits,
            refund: false,
            max_wait: 0,
        };
        let mut decisions = Vec::new();
        self.store
            .check(&[check], &mut decisions)
            .await
            .expect("memory store never fails");
    }
}

/// One descriptor's limit as a case states it.
#[derive(Clone)]
struct CaseLimit {
    requests_per_unit: u64,
    unit: Unit,
    json: Value,
}

fn case_limit(value: &Value) -> Option<CaseLimit> {
    if value.is_null() {
        return None;
    }
    Some(CaseLimit {
        requests_per_unit: value["requests_per_unit"].as_u64().unwrap_or(0),
        unit: Unit::parse(value["unit"].as_str().unwrap_or("second")).unwrap_or(Unit::Second),
        json: value.clone(),
    })
}

fn entries_of(value: &Value) -> Vec<(String, String)> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["key"].as_str().unwrap_or_default().to_owned(),
                e["value"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// A descriptor's entries and the limit the case gives it.
type CaseItem = (Vec<(String, String)>, Option<CaseLimit>);

/// A rule file (JSON is YAML) giving each entry path its limit.
fn synthesize_config(domain: &str, items: &[CaseItem]) -> String {
    fn insert(nodes: &mut Vec<Value>, path: &[(String, String)], limit: &Option<CaseLimit>) {
        let Some(((key, value), rest)) = path.split_first() else {
            return;
        };
        let position = nodes
            .iter()
            .position(|n| n["key"] == json!(key) && n["value"] == json!(value));
        let index = position.unwrap_or_else(|| {
            nodes.push(json!({"key": key, "value": value}));
            nodes.len() - 1
        });
        let node = &mut nodes[index];
        if rest.is_empty() {
            if let Some(limit) = limit {
                let mut rate_limit = json!({
                    "unit": limit.unit.as_upper_str().to_ascii_lowercase(),
                    "requests_per_unit": limit.requests_per_unit,
                });
                if let Some(name) = limit.json.get("name") {
                    rate_limit["name"] = name.clone();
                }
                node["rate_limit"] = rate_limit;
                for flag in ["shadow_mode", "quota_mode"] {
                    if limit.json.get(flag) == Some(&json!(true)) {
                        node[flag] = json!(true);
                    }
                }
            }
        } else {
            let mut children = node
                .get("descriptors")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            insert(&mut children, rest, limit);
            node["descriptors"] = Value::Array(children);
        }
    }
    let mut nodes = Vec::new();
    for (entries, limit) in items {
        insert(&mut nodes, entries, limit);
    }
    json!({"domain": domain, "descriptors": nodes}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_aggregation() {
    run_kind(&["service_aggregation"], |case, _| async move {
        let domain = case["domain"].as_str().unwrap_or_default();
        let descriptors = case["descriptors"].as_array().cloned().unwrap_or_default();
        let items: Vec<_> = descriptors
            .iter()
            .map(|d| (entries_of(&d["entries"]), case_limit(&d["resolved_limit"])))
            .collect();
        let mut files = vec![("rules.yaml".to_owned(), synthesize_config(domain, &items))];
        if case.get("precondition").is_some() {
            files = vec![("rules.yaml".to_owned(), "domain: [".to_owned())];
        }
        let env = string_map(&case["env"]);
        let harness = Harness::new(&files, &env, case["now"].as_u64().unwrap_or(1_000_000));
        // Bring each counter to where the case's stub store answered from.
        for (descriptor, (entries, limit)) in descriptors.iter().zip(&items) {
            let Some(limit) = limit else { continue };
            let backend = &descriptor["backend_status"];
            let remaining = backend["limit_remaining"].as_u64().unwrap_or(0);
            let before = match backend["code"].as_str() {
                Some("OVER_LIMIT") => limit.requests_per_unit,
                _ => limit.requests_per_unit.saturating_sub(remaining + 1),
            };
            harness
                .charge(domain, entries, limit.requests_per_unit, limit.unit, before)
                .await;
        }
        let request = RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: descriptors
                .iter()
                .map(|d| wire_descriptor(&d["entries"], &|s: &str| s.to_owned(), None))
                .collect(),
            hits_addend: 0,
        };
        let result = harness.service.should_rate_limit(&request).await;
        let expect = &case["expect"];
        match (result, expect.get("error").and_then(Value::as_str)) {
            (Err(error), Some(message)) => {
                if error.to_string() != message {
                    return Err(format!("error {error:?}, expected {message:?}"));
                }
            }
            (Err(error), None) => return Err(format!("unexpected error {error}")),
            (Ok(_), Some(message)) => return Err(format!("expected error {message:?}")),
            (Ok(response), None) => check_response(&response, expect)?,
        }
        check_stats(&harness.metrics(), expect, &HashMap::new())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_arithmetic() {
    run_kind(&["backend_arithmetic"], |case, _| async move {
        let steps = case["steps"].as_array().cloned().unwrap_or_default();
        let domain = steps
            .first()
            .and_then(|s| s["domain"].as_str())
            .unwrap_or("domain")
            .to_owned();
        let mut items = Vec::new();
        for step in &steps {
            for descriptor in step["descriptors"].as_array().into_iter().flatten() {
                items.push((
                    entries_of(&descriptor["entries"]),
                    case_limit(&descriptor["limit"]),
                ));
            }
        }
        let settings = &case["settings"];
        let mut env = vec![(
            "NEAR_LIMIT_RATIO".to_owned(),
            settings["near_limit_ratio"]
                .as_f64()
                .unwrap_or(0.8)
                .to_string(),
        )];
        if settings["local_cache"] == json!(true) {
            env.push(("LOCAL_CACHE_SIZE_IN_BYTES".into(), "1000".into()));
        }
        if settings["stop_cache_key_increment_when_overlimit"] == json!(true) {
            env.push((
                "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT".into(),
                "true".into(),
            ));
        }
        let files = vec![("rules.yaml".to_owned(), synthesize_config(&domain, &items))];
        let first_now = steps
            .first()
            .and_then(|s| s["now"].as_u64())
            .unwrap_or(1_000_000);
        let harness = Harness::new(&files, &env, first_now);
        let mut counters: HashMap<String, u64> = HashMap::new();
        for (index, step) in steps.iter().enumerate() {
            let context = |error: String| format!("step {index}: {error}");
            let now = step["now"].as_u64().unwrap_or(first_now);
            harness.clock.set(now * MICROS_PER_SECOND);
            let request_hits = step["request_hits_addend"].as_u64().unwrap_or(0);
            let mut wire = Vec::new();
            for descriptor in step["descriptors"].as_array().into_iter().flatten() {
                let entries = entries_of(&descriptor["entries"]);
                let hits_addend = descriptor["hits_addend"].as_u64();
                if let (Some(limit), Some(after)) = (
                    case_limit(&descriptor["limit"]),
                    descriptor["counter_after"].as_u64(),
                ) {
                    let hits = hits_addend.unwrap_or(request_hits.max(1));
                    // The store's real content before the step: what the reference read,
                    // else what its increment started from.
                    let before = descriptor["counter_read_before"]
                        .as_u64()
                        .or_else(|| descriptor["counter_before"].as_u64())
                        .unwrap_or(after.saturating_sub(hits));
                    let window = now - now % limit.unit.seconds();
                    let counter = format!("{entries:?}@{window}");
                    let current = counters.get(&counter).copied().unwrap_or(0);
                    if before < current {
                        return Err(context(format!(
                            "the stub's counter goes back from {current} to {before}"
                        )));
                    }
                    harness
                        .charge(
                            &domain,
                            &entries,
                            limit.requests_per_unit,
                            limit.unit,
                            before - current,
                        )
                        .await;
                    counters.insert(counter, after);
                }
                wire.push(wire_descriptor(
                    &descriptor["entries"],
                    &|s: &str| s.to_owned(),
                    hits_addend,
                ));
            }
            let request = RateLimitRequest {
                domain: domain.clone(),
                descriptors: wire,
                hits_addend: u32::try_from(request_hits).unwrap_or(u32::MAX),
            };
            let response = harness
                .service
                .should_rate_limit(&request)
                .await
                .map_err(|e| context(format!("error {e}")))?;
            check_response(&response, &step["expect"]).map_err(context)?;
            check_stats(
                &harness.metrics(),
                &step["expect"],
                &stats_labels(&domain, step),
            )
            .map_err(context)?;
        }
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_reload() {
    run_kind(&["service_reload"], |case, _| async move {
        let good = "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
        let server = TestServer::start(&[("rules.yaml".into(), good.into())], &[], &[]).await;
        let mut successes = 1.0;
        for step in case["steps"].as_array().into_iter().flatten().skip(1) {
            let wait_for = match step.get("config_event").and_then(Value::as_str) {
                Some("ok") => {
                    successes += 1.0;
                    server.write_config("rules.yaml", &format!("{good}# edit {successes}\n"));
                    ("ratelimit.service.config_load_success", successes)
                }
                Some(_) => {
                    server.write_config("rules.yaml", "domain: reload\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n");
                    ("ratelimit.service.config_load_error", 1.0)
                }
                None => {
                    let request = RateLimitRequest {
                        domain: "reload".into(),
                        descriptors: vec![wire_descriptor(&json!([{"key": "k", "value": "v"}]), &|s: &str| s.to_owned(), None)],
                        hits_addend: 0,
                    };
                    let response = server.client().await.should_rate_limit(request).await.map_err(|e| e.to_string())?.into_inner();
                    if response.statuses[0].current_limit.is_none() {
                        return Err("previous rules no longer served".into());
                    }
                    let metrics = server.metrics().await;
                    for (name, value) in step["expect"]["stats"].as_object().into_iter().flatten() {
                        let got = metrics.reference_stat(name);
                        if got != value.as_f64().unwrap_or(-1.0) {
                            return Err(format!("stat {name}: expected {value}, got {got}"));
                        }
                    }
                    continue;
                }
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while server.metrics().await.reference_stat(wait_for.0) < wait_for.1 {
                if Instant::now() > deadline {
                    return Err(format!("{} never reached {}", wait_for.0, wait_for.1));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        server.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoint() {
    run_kind(&["json_endpoint"], |case, _| async move {
        let rules = "domain: foo\ndescriptors:\n  - key: blocked\n    rate_limit: {unit: minute, requests_per_unit: 0}\n";
        let server = TestServer::start(&[("rules.yaml".into(), rules.into())], &[], &[]).await;
        // A stub result is reproduced with a request that makes the real service answer so.
        let body = match &case["service_result"] {
            Value::String(_) => case["request_body"].as_str().unwrap_or_default().to_owned(),
            result if result.get("error").is_some() => r#"{"domain": "foo"}"#.to_owned(),
            result => match result["response"]["overallCode"].as_str() {
                Some("OVER_LIMIT") => r#"{"domain":"foo","descriptors":[{"entries":[{"key":"blocked","value":"x"}]}]}"#.to_owned(),
                _ => r#"{"domain":"foo","descriptors":[{"entries":[{"key":"free","value":"x"}]}]}"#.to_owned(),
            },
        };
        let response = reqwest::Client::new()
            .post(server.url("/json"))
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let expect = &case["expect"];
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if Some(u64::from(status)) != expect["http_status"].as_u64() {
            return Err(format!("status {status}, body {text:?}"));
        }
        if Some(content_type.as_str()) != expect["content_type"].as_str() {
            return Err(format!("content type {content_type}"));
        }
        let expected_body = expect["body"].as_str().unwrap_or_default();
        if content_type == "application/json" {
            let got: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let want: Value = serde_json::from_str(expected_body).map_err(|e| e.to_string())?;
            if got["overallCode"] != want["overallCode"] {
                return Err(format!("body {text}, expected overall code of {expected_body}"));
            }
        } else if text != expected_body {
            return Err(format!("body {text:?}"));
        }
        server.stop().await;
        Ok(())
    })
    .await;
}

// === comparisons ===============================================================

fn check_response(response: &RateLimitResponse, expect: &Value) -> Result<(), String> {
    let overall = code_name(response.overall_code);
    if let Some(code) = expect.get("overall_code").and_then(Value::as_str) {
        if overall != code {
            return Err(format!(
                "overall_code {overall}, expected {code}; statuses {:?}",
                response.statuses
            ));
        }
    }
    if let Some(codes) = expect.get("overall_code_in").and_then(Value::as_array) {
        if !codes.iter().any(|c| c.as_str() == Some(overall)) {
            return Err(format!("overall_code {overall} not in {codes:?}"));
        }
    }
    if let Some(statuses) = expect.get("statuses").and_then(Value::as_array) {
        if statuses.len() != response.statuses.len() {
            return Err(format!(
                "{} statuses, expected {}",
                response.statuses.len(),
                statuses.len()
            ));
        }
        for (index, (want, got)) in statuses.iter().zip(&response.statuses).enumerate() {
            let fail = |what: String| Err(format!("status {index}: {what}; got {got:?}"));
            if let Some(code) = want.get("code").and_then(Value::as_str) {
                if code_name(got.code) != code {
                    return fail(format!("code expected {code}"));
                }
            }
            if let Some(remaining) = want.get("limit_remaining").and_then(Value::as_u64) {
                if u64::from(got.limit_remaining) != remaining {
                    return fail(format!("limit_remaining expected {remaining}"));
                }
            }
            if let Some(reset) = want.get("duration_until_reset").and_then(Value::as_i64) {
                let seconds = got.duration_until_reset.as_ref().map_or(-1, |d| d.seconds);
                if seconds != reset {
                    return fail(format!("duration_until_reset expected {reset}"));
                }
            }
            match (want.get("current_limit"), &got.current_limit) {
                (None, _) => {}
                (Some(Value::Null), None) => {}
                (Some(Value::Null), Some(_)) => return fail("current_limit expected null".into()),
                (Some(_), None) => return fail("current_limit missing".into()),
                (Some(limit), Some(current)) => {
                    let unit = sluice::proto::rls::rate_limit_response::rate_limit::Unit::try_from(
                        current.unit,
                    )
                    .map(|u| u.as_str_name())
                    .unwrap_or("?");
                    if limit["requests_per_unit"].as_u64()
                        != Some(u64::from(current.requests_per_unit))
                        || limit["unit"].as_str().is_some_and(|u| u != unit)
                        || limit["name"].as_str().is_some_and(|n| n != current.name)
                    {
                        return fail(format!("current_limit expected {limit}"));
                    }
                }
            }
        }
    }
    if let Some(headers) = expect
        .get("response_headers_to_add")
        .and_then(Value::as_array)
    {
        let got: Vec<(String, String)> = response
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        let want: Vec<(String, String)> = headers
            .iter()
            .map(|h| {
                (
                    h["key"].as_str().unwrap_or_default().to_owned(),
                    h["value"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        if got != want {
            return Err(format!("headers {got:?}, expected {want:?}"));
        }
    }
    if let Some(subset) = expect.get("dynamic_metadata_subset") {
        let got = response
            .dynamic_metadata
            .as_ref()
            .map(sluice::admin::json::struct_to_json)
            .unwrap_or(Value::Null);
        if !is_subset(subset, &got) {
            return Err(format!(
                "dynamic metadata {got}, expected to contain {subset}"
            ));
        }
    }
    Ok(())
}

/// The reference's unit tests name each limit's stats freely (`key_value`); Sluice's
/// stats key is the rule's (`domain.key_value.subkey_subvalue`). Maps one to the other.
fn stats_labels(domain: &str, step: &Value) -> HashMap<String, String> {
    step["descriptors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| {
            let name = d["stats_key"].as_str()?;
            let path: Vec<String> = entries_of(&d["entries"])
                .into_iter()
                .map(|(key, value)| format!("{key}_{value}"))
                .collect();
            Some((name.to_owned(), format!("{domain}.{}", path.join("."))))
        })
        .collect()
}

fn check_stats(
    metrics: &Metrics,
    expect: &Value,
    labels: &HashMap<String, String>,
) -> Result<(), String> {
    let Some(stats) = expect.get("stats").and_then(Value::as_object) else {
        return Ok(());
    };
    for (name, value) in stats {
        if let Some(per_stat) = value.as_object() {
            // backend_arithmetic: {stats_key: {stat: value}} without the domain prefix.
            for (stat, expected) in per_stat {
                let rule = labels.get(name).cloned().unwrap_or_else(|| name.clone());
                let full = format!("ratelimit.service.rate_limit.{rule}.{stat}");
                let got = metrics.reference_stat(&full);
                if got != expected.as_f64().unwrap_or(-1.0) {
                    return Err(format!(
                        "stat {name}.{stat}: expected {expected}, got {got}"
                    ));
                }
            }
        } else {
            let got = metrics.reference_stat(name);
            if got != value.as_f64().unwrap_or(-1.0) {
                return Err(format!("stat {name}: expected {value}, got {got}"));
            }
        }
    }
    Ok(())
}

fn is_subset(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Object(want), Value::Object(got)) => want
            .iter()
            .all(|(k, v)| got.get(k).is_some_and(|g| is_subset(v, g))),
        _ => want == got,
    }
}

fn code_name(code: i32) -> &'static str {
    match code {
        1 => "OK",
        2 => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

// === building requests =========================================================

fn request_from(call: &Value, substitute: &dyn Fn(&str) -> String) -> RateLimitRequest {
    RateLimitRequest {
        domain: substitute(call["domain"].as_str().unwrap_or_default()),
        descriptors: call["descriptors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| wire_descriptor(&d["entries"], substitute, d["hits_addend"].as_u64()))
            .collect(),
        hits_addend: call["hits_addend"].as_u64().map_or(0, |h| h as u32),
    }
}

fn wire_descriptor(
    entries: &Value,
    substitute: &dyn Fn(&str) -> String,
    hits_addend: Option<u64>,
) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| WireEntry {
                key: substitute(e["key"].as_str().unwrap_or_default()),
                value: substitute(e["value"].as_str().unwrap_or_default()),
            })
            .collect(),
        limit: None,
        hits_addend,
        is_negative_hits: false,
    }
}

fn config_files(configs: &Value, dir: &Path) -> Result<Vec<(String, String)>, String> {
    configs
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|name| {
            std::fs::read_to_string(dir.join(name))
                .map(|text| (name.to_owned(), text))
                .map_err(|e| format!("{name}: {e}"))
        })
        .collect()
}

fn string_map(value: &Value) -> Vec<(String, String)> {
    value
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            )
        })
        .collect()
}

#[tokio::test]
async fn mask_url() {
    run_kind(&["mask_url"], |case, _| async move {
        let input = case["input"].as_str().unwrap_or_default();
        let expected = case["expect"].as_str().unwrap_or_default();
        let masked = sluice::store::redis::mask_url(input);
        if masked == expected {
            Ok(())
        } else {
            Err(format!(
                "{input:?} masked as {masked:?}, expected {expected:?}"
            ))
        }
    })
    .await;
}
