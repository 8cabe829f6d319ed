//! The admin port: `/status`, probes, `/metrics` names, and the debug reports
//! (`/debug/shadow`, `/debug/hotkeys`) behind `--debug-endpoints`.

use serde_json::Value;
use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::RateLimitRequest;
use support::TestServer;

const RULES: &str = "\
domain: web
descriptors:
  - key: user
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 1}
";

fn request(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "web".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        }],
        hits_addend: 0,
    }
}

async fn start(env: &[(&str, &str)], flags: &[&str]) -> TestServer {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    TestServer::start(&[("web.yaml".into(), RULES.into())], &env, flags).await
}

async fn get(server: &TestServer, path: &str) -> (u16, String) {
    let response = reqwest::get(server.url(path)).await.expect("GET");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

async fn get_json(server: &TestServer, path: &str) -> Value {
    let (status, body) = get(server, path).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_probes() {
    let server = start(&[], &[]).await;
    assert_eq!(get(&server, "/livez").await.0, 200);
    assert_eq!(get(&server, "/readyz").await.0, 200);
    assert_eq!(get(&server, "/healthcheck").await, (200, "OK".into()));
    let status = get_json(&server, "/status").await;
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(status["ready"], true);
    assert_eq!(status["rules"]["version"], 1);
    assert_eq!(status["rules"]["count"], 2);
    assert_eq!(status["rules"]["hash"].as_str().map(str::len), Some(64));
    assert!(status["rules"]["loaded_at"].is_string(), "{status}");
    assert_eq!(status["last_reload"]["result"], "success");
    assert_eq!(status["last_reload"]["error"], Value::Null);
    assert_eq!(status["store"]["kind"], "memory");
    assert_eq!(status["store"]["health"], "ok");
    assert_eq!(status["store"]["lua"], serde_json::Value::Null);
    assert!(status["uptime_seconds"].is_u64());

    let metrics = server.metrics().await;
    assert_eq!(
        metrics.get("sluice_config_reload_total{result=\"success\"}"),
        1.0
    );
    assert_eq!(metrics.get("sluice_config_rules"), 2.0);
    // Debug reports are off by default.
    assert_eq!(get(&server, "/debug/shadow").await.0, 404);
    assert_eq!(get(&server, "/debug/hotkeys").await.0, 404);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_report_lists_would_be_refusals_per_rule() {
    let server = start(&[], &["--debug-endpoints"]).await;
    let mut client = server.client().await;
    for (value, calls) in [("alice", 6), ("bob", 3), ("carol", 1)] {
        for _ in 0..calls {
            let response = client
                .should_rate_limit(request("user", value))
                .await
                .expect("call")
                .into_inner();
            assert_eq!(
                response.overall_code,
                Code::Ok as i32,
                "shadow never refuses"
            );
        }
    }
    let report = get_json(&server, "/debug/shadow").await;
    let rules = report["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 1, "{report}");
    let rule = &rules[0];
    assert_eq!(rule["rule"], "web.user");
    assert_eq!(rule["cause"], "rule");
    assert_eq!(rule["would_refuse_hits"], 5 + 2);
    let keys = rule["top_keys"].as_array().expect("keys");
    assert_eq!(keys[0]["key"], "web: user=alice");
    assert_eq!(keys[0]["count"], 5);
    assert_eq!(keys[1]["key"], "web: user=bob");
    assert_eq!(keys[1]["count"], 2);
    assert!(
        keys[0]["first_seen"].as_str().unwrap_or("") <= keys[0]["last_seen"].as_str().unwrap_or("")
    );
    assert_eq!(keys.len(), 2, "carol was never refused: {report}");

    let metrics = server.metrics().await;
    assert_eq!(
        metrics.reference_stat("ratelimit.service.rate_limit.web.user.shadow_mode"),
        7.0
    );
    assert_eq!(
        metrics.get("sluice_requests_total{domain=\"web\",rule=\"web.user\",decision=\"shadow_over_limit\"}"),
        7.0
    );

    let hot = get_json(&server, "/debug/hotkeys").await;
    let sampled: u64 = hot["current_window"]
        .as_array()
        .expect("window")
        .iter()
        .map(|entry| entry["count"].as_u64().unwrap_or(0))
        .sum();
    assert!(sampled >= 1, "{hot}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_shadow_mode_is_reported_too() {
    let server = start(
        &[("SHADOW_MODE", "true")],
        &["--debug-endpoints", "--response-headers", "all"],
    )
    .await;
    let mut client = server.client().await;
    for _ in 0..4 {
        let response = client
            .should_rate_limit(request("ip", "10.0.0.1"))
            .await
            .expect("call")
            .into_inner();
        assert_eq!(response.overall_code, Code::Ok as i32);
        let headers = &response.response_headers_to_add;
        assert!(headers.iter().any(|h| h.key == "RateLimit-Remaining"));
        // Let through: no client is told to wait.
        assert!(
            !headers.iter().any(|h| h.key == "Retry-After"),
            "{headers:?}"
        );
    }
    let report = get_json(&server, "/debug/shadow").await;
    let rule = &report["rules"][0];
    assert_eq!(rule["rule"], "web.ip", "{report}");
    assert_eq!(rule["cause"], "global");
    assert_eq!(rule["top_keys"][0]["key"], "web: ip=10.0.0.1");
    assert_eq!(rule["top_keys"][0]["count"], 3);
    server.stop().await;
}

/// A full memory store's evictions show in `sluice_memory_evictions_total` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_evictions_are_counted_in_the_metric() {
    // 64 keys at most: one per shard.
    let server = start(&[], &["--memory-max-keys", "64"]).await;
    let mut client = server.client().await;
    for user in 0..300 {
        client
            .should_rate_limit(request("ip", &format!("10.0.0.{user}")))
            .await
            .expect("answered");
    }
    let evicted = server.metrics().await.get("sluice_memory_evictions_total");
    assert!(evicted >= 300.0 - 64.0, "evictions counted: {evicted}");
    server.stop().await;
}

/// A `rule` label built from request values (here a limit override's) is the
/// reference's statistic name (`:`, `|` and IPv4 dots as `_`), at most 256 bytes long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_built_rule_labels_are_named_as_the_reference_and_capped() {
    use sluice::proto::common::rate_limit_descriptor::RateLimitOverride;
    let server = start(&[], &[]).await;
    let mut client = server.client().await;
    let long = "x".repeat(1000);
    for value in ["10.1.2.3", "a:b|c", long.as_str()] {
        let mut request = request("ip", value);
        request.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: sluice::proto::types::RateLimitUnit::Hour as i32,
        });
        client.should_rate_limit(request).await.expect("answered");
    }
    let metrics = server.metrics().await;
    for name in ["web.ip_10_1_2_3", "web.ip_a_b_c"] {
        let sample = format!("sluice_rule_hits_total{{rule=\"{name}\",stat=\"total_hits\"}}");
        assert_eq!(metrics.get(&sample), 1.0, "{sample}");
    }
    let long_labels: Vec<&String> = metrics
        .0
        .keys()
        .filter(|name| name.contains("xxxx"))
        .collect();
    assert!(!long_labels.is_empty());
    for name in long_labels {
        let label = name
            .split("rule=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("a rule label");
        assert!(label.len() <= 256 && label.ends_with("..."), "{label}");
    }
    server.stop().await;
}
