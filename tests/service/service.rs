//! The service as Envoy sees it: a real server on loopback, gRPC calls, answers checked
//! field by field. Request bounds, algorithms per rule, headers, health and `/explain`.

use std::time::Duration;

use sluice::proto::common::rate_limit_descriptor::{Entry, RateLimitOverride};
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::{RateLimitRequest, RateLimitResponse};
use sluice::proto::types::RateLimitUnit;
use support::TestServer;
use tokio_stream::StreamExt;
use tonic::Code as GrpcCode;

const RULES: &str = r#"
domain: api
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 5}
  - key: gcra
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra, burst: 3}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 2}
      - {unit: day, requests_per_unit: 3}
"#;

fn request(entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![descriptor(entries)],
        hits_addend: 0,
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
        is_negative_hits: false,
    }
}

async fn start() -> TestServer {
    TestServer::start(
        &[("rules.yaml".into(), RULES.into())],
        &[],
        &["--response-headers", "all"],
    )
    .await
}

/// A clock stopped one second into a minute (1 800 000 000 s is a whole number of
/// minutes): the calls of a test on it fall in one minute's window without waiting for
/// the wall clock to be early in one, and time passes when the test says so.
fn early_in_a_minute() -> std::sync::Arc<sluice::clock::ManualClock> {
    std::sync::Arc::new(sluice::clock::ManualClock::new(1_800_000_001_000_000))
}

/// [`start`] on `clock`.
async fn start_on(clock: std::sync::Arc<sluice::clock::ManualClock>) -> TestServer {
    TestServer::start_with_clock(
        &[("rules.yaml".into(), RULES.into())],
        &[],
        &["--response-headers", "all"],
        clock,
    )
    .await
}

/// [`start`] on [`early_in_a_minute`].
async fn start_early_in_a_minute() -> TestServer {
    start_on(early_in_a_minute()).await
}

async fn call(
    server: &TestServer,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    server
        .client()
        .await
        .should_rate_limit(request)
        .await
        .map(tonic::Response::into_inner)
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

fn codes(responses: &[RateLimitResponse]) -> Vec<i32> {
    responses.iter().map(|r| r.overall_code).collect()
}

async fn sequence(server: &TestServer, key: &str, calls: usize) -> Vec<RateLimitResponse> {
    let mut out = Vec::new();
    for _ in 0..calls {
        out.push(
            call(server, request(&[(key, "user-1")]))
                .await
                .expect("call answered"),
        );
    }
    out
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_burst_then_refill() {
    let clock = early_in_a_minute();
    let server = start_on(clock.clone()).await;
    let responses = sequence(&server, "bucket", 6).await;
    assert_eq!(codes(&responses), vec![OK, OK, OK, OK, OK, OVER]);
    let refused = &responses[5];
    assert_eq!(header(refused, "Retry-After"), Some("1"));
    // 1 a second with a burst of 5: the bucket's capacity, refilled in 5 s.
    assert_eq!(
        header(refused, "RateLimit-Policy"),
        Some("\"api.bucket\";q=5;w=5")
    );
    assert_eq!(header(&responses[0], "RateLimit-Limit"), Some("5"));
    assert!(header(refused, "RateLimit").is_some_and(|v| v.starts_with("\"api.bucket\";r=0;t=")));
    assert_eq!(header(&responses[0], "RateLimit-Remaining"), Some("4"));
    clock.advance(1_050_000);
    assert_eq!(codes(&sequence(&server, "bucket", 2).await), vec![OK, OVER]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_spaces_requests_after_the_burst() {
    let clock = early_in_a_minute();
    let server = start_on(clock.clone()).await;
    let responses = sequence(&server, "gcra", 4).await;
    assert_eq!(codes(&responses), vec![OK, OK, OK, OVER]);
    assert_eq!(header(&responses[3], "Retry-After"), Some("1"));
    clock.advance(1_050_000);
    assert_eq!(codes(&sequence(&server, "gcra", 2).await), vec![OK, OVER]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_algorithms_refuse_the_fourth_call() {
    let server = start().await;
    for key in ["fixed", "sliding", "log"] {
        let responses = sequence(&server, key, 4).await;
        assert_eq!(codes(&responses), vec![OK, OK, OK, OVER], "{key}");
        let retry: u64 = header(&responses[3], "Retry-After")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        // The sliding window counter waits for the previous window's weight to decay:
        // up to two periods.
        let most = if key == "sliding" { 120 } else { 60 };
        assert!((1..=most).contains(&retry), "{key}: Retry-After {retry}");
        let status = &responses[3].statuses[0];
        assert_eq!(status.limit_remaining, 0, "{key}");
        assert_eq!(
            status.current_limit.as_ref().map(|l| l.requests_per_unit),
            Some(3),
            "{key}"
        );
        assert_eq!(responses[1].statuses[0].limit_remaining, 1, "{key}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_are_all_or_nothing() {
    let clock = early_in_a_minute();
    let server = start_on(clock.clone()).await;
    // token bucket 2 burst, and 3 per day: the bucket refuses the third call without
    // charging the daily limit; the daily limit then refuses the fourth passing call.
    let first = sequence(&server, "multi", 3).await;
    assert_eq!(codes(&first), vec![OK, OK, OVER]);
    clock.advance(1_100_000);
    let second = sequence(&server, "multi", 2).await;
    assert_eq!(codes(&second), vec![OK, OVER]);
    let limit = second[1].statuses[0]
        .current_limit
        .clone()
        .expect("limit reported");
    assert_eq!(
        limit.requests_per_unit, 3,
        "the daily limit refuses: {limit:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bounds_are_enforced_at_the_boundary() {
    let server = start().await;
    let mut ok = request(&[("fixed", "x")]);
    ok.descriptors = (0..64)
        .map(|i| descriptor(&[("none", &i.to_string())]))
        .collect();
    assert!(
        call(&server, ok.clone()).await.is_ok(),
        "64 descriptors pass"
    );
    ok.descriptors.push(descriptor(&[("none", "65")]));
    let error = call(&server, ok).await.expect_err("65 descriptors refused");
    assert_eq!(error.code(), GrpcCode::InvalidArgument);
    assert!(
        error.message().contains("65 descriptors"),
        "{}",
        error.message()
    );

    let entries: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let borrowed: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert!(
        call(&server, request(&borrowed[..32])).await.is_ok(),
        "32 entries pass"
    );
    let error = call(&server, request(&borrowed))
        .await
        .expect_err("33 entries refused");
    assert_eq!(error.code(), GrpcCode::InvalidArgument);

    let long = "v".repeat(1024);
    assert!(
        call(&server, request(&[("k", &long)])).await.is_ok(),
        "1024-byte value passes"
    );
    let longer = "v".repeat(1025);
    let error = call(&server, request(&[("k", &longer)]))
        .await
        .expect_err("1025 bytes refused");
    assert_eq!(error.code(), GrpcCode::InvalidArgument);
    let error = call(&server, request(&[(&longer, "v")]))
        .await
        .expect_err("1025-byte key refused");
    assert_eq!(error.code(), GrpcCode::InvalidArgument);

    let mut empty_domain = request(&[("fixed", "x")]);
    empty_domain.domain.clear();
    let error = call(&server, empty_domain)
        .await
        .expect_err("empty domain refused");
    assert_eq!(error.message(), "rate limit domain must not be empty");
    let mut no_descriptors = request(&[]);
    no_descriptors.descriptors.clear();
    let error = call(&server, no_descriptors)
        .await
        .expect_err("no descriptors refused");
    assert_eq!(
        error.message(),
        "rate limit descriptor list must not be empty"
    );

    let mut huge_addend = request(&[("fixed", "addend")]);
    huge_addend.descriptors[0].hits_addend = Some(u64::MAX);
    let response = call(&server, huge_addend)
        .await
        .expect("u64::MAX addend answered");
    assert_eq!(response.overall_code, OVER);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_without_entries_is_ok_with_no_limit() {
    let server = start().await;
    let response = call(&server, request(&[])).await.expect("answered");
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses.len(), 1);
    assert!(response.statuses[0].current_limit.is_none());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_endpoint_needs_the_debug_flag_and_charges_nothing() {
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"fixed","value":"e"}]}]}"#;
    let closed = start().await;
    let response = reqwest::Client::new()
        .post(closed.url("/explain"))
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status().as_u16(), 404);
    closed.stop().await;

    let server = TestServer::start(
        &[("rules.yaml".into(), RULES.into())],
        &[],
        &["--debug-endpoints"],
    )
    .await;
    for _ in 0..5 {
        let response = reqwest::Client::new()
            .post(server.url("/explain"))
            .body(body)
            .send()
            .await
            .expect("post");
        assert_eq!(response.status().as_u16(), 200);
        let explained: serde_json::Value = response.json().await.expect("json");
        assert_eq!(explained[0]["outcome"], "limited");
        assert_eq!(explained[0]["would_decide"][0]["allowed"], true);
        assert_eq!(
            explained[0]["would_decide"][0]["remaining"], 2,
            "explain never charges"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_rule_loading() {
    let server = TestServer::start(&[("rules.yaml".into(), "domain: [".into())], &[], &[]).await;
    let status = reqwest::get(server.url("/healthcheck"))
        .await
        .expect("get")
        .status()
        .as_u16();
    assert_eq!(status, 500, "no rules loaded yet");
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let check = |service: &str| tonic_health::pb::HealthCheckRequest {
        service: service.into(),
    };
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let answer = health
        .check(check("ratelimit"))
        .await
        .expect("health")
        .into_inner();
    assert_ne!(answer.status, serving);
    let error = call(&server, request(&[("fixed", "x")]))
        .await
        .expect_err("no rules");
    assert_eq!(error.code(), GrpcCode::Unavailable);
    assert_eq!(error.message(), "no rate limit configuration loaded");

    server.write_config("rules.yaml", RULES);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let status = reqwest::get(server.url("/healthcheck")).await.expect("get");
        if status.status().as_u16() == 200 {
            assert_eq!(status.text().await.expect("body"), "OK");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "rules never loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // gRPC health mirrors readiness from a task: it may trail /healthcheck briefly.
    for name in ["", "ratelimit"] {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let answer = health
                .check(check(name))
                .await
                .expect("health")
                .into_inner();
            if answer.status == serving {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "service {name:?} never SERVING"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_reflection_lists_and_describes_the_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = start().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = ServerReflectionClient::new(channel);
    let ask = |request: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let requests = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "envoy.service.ratelimit.v3.RateLimitService".into(),
        )),
    ];
    let mut answers = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("reflection stream")
        .into_inner();
    let Some(Ok(first)) = answers.next().await else {
        panic!("no list answer");
    };
    let Some(MessageResponse::ListServicesResponse(list)) = first.message_response else {
        panic!("unexpected answer {first:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
    let Some(Ok(second)) = answers.next().await else {
        panic!("no file answer");
    };
    let Some(MessageResponse::FileDescriptorResponse(files)) = second.message_response else {
        panic!("unexpected answer {second:?}");
    };
    assert!(!files.file_descriptor_proto.is_empty());
    server.stop().await;
}

/// `fixed` (3 a minute) with the request's limit override `limit` per `unit`.
fn overridden(requests_per_unit: u32, unit: RateLimitUnit) -> RateLimitRequest {
    let mut request = request(&[("fixed", "override-user")]);
    request.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit,
        unit: unit as i32,
    });
    request
}

/// A request's limit override with another unit than the rule counts apart from it (as
/// the reference, whose key holds the unit's window), so neither empties nor resets the
/// other; an override with the rule's unit shares its counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_of_another_unit_counts_apart() {
    // Every call in one minute's window.
    let server = start_early_in_a_minute().await;
    let rule = || request(&[("fixed", "override-user")]);
    let remaining = |response: &RateLimitResponse| response.statuses[0].limit_remaining;
    for expected in [2, 1] {
        assert_eq!(
            remaining(&call(&server, rule()).await.expect("rule")),
            expected
        );
    }
    let second = call(&server, overridden(100, RateLimitUnit::Second))
        .await
        .expect("override");
    assert_eq!(second.overall_code, OK);
    assert_eq!(remaining(&second), 99, "a second's window of its own");
    let hour = call(&server, overridden(100, RateLimitUnit::Hour))
        .await
        .expect("override");
    assert_eq!(remaining(&hour), 99, "an hour's window of its own");
    let last = call(&server, rule()).await.expect("rule");
    assert_eq!(
        (last.overall_code, remaining(&last)),
        (OK, 0),
        "the rule's count kept"
    );
    let reset = last.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("reset");
    assert!(reset.seconds <= 60, "still the minute's window: {reset:?}");
    // The rule's unit: the same counter (3 used), under the override's number.
    let minute = call(&server, overridden(10, RateLimitUnit::Minute))
        .await
        .expect("override");
    assert_eq!(remaining(&minute), 6, "3 + 1 used of 10");
    assert_eq!(
        call(&server, rule()).await.expect("rule").overall_code,
        OVER
    );
    server.stop().await;
}

/// `Retry-After` is the longest wait of the descriptors over their limit, whatever
/// their order: a client that waits it is not refused by another descriptor at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_the_longest_wait_of_the_refusing_descriptors() {
    // The fixed window's wait (to the minute's end) is then 59 s, gcra's 1 s.
    let server = start_early_in_a_minute().await;
    for (user, order) in [("wait-1", ["fixed", "gcra"]), ("wait-2", ["gcra", "fixed"])] {
        let both = || RateLimitRequest {
            descriptors: order.iter().map(|key| descriptor(&[(key, user)])).collect(),
            ..request(&[])
        };
        for _ in 0..3 {
            assert_eq!(call(&server, both()).await.expect("call").overall_code, OK);
        }
        let refused = call(&server, both()).await.expect("call");
        assert_eq!(refused.overall_code, OVER, "{order:?}");
        let fixed = order.iter().position(|key| *key == "fixed").expect("fixed");
        let fixed_reset = refused.statuses[fixed]
            .duration_until_reset
            .as_ref()
            .expect("reset")
            .seconds;
        assert!(fixed_reset > 5, "{fixed_reset}");
        assert_eq!(
            header(&refused, "Retry-After"),
            Some(fixed_reset.to_string().as_str()),
            "{order:?}"
        );
    }
    server.stop().await;
}

/// Under `QUOTA_MODE`, a descriptor no rule limits is a quota descriptor that passed,
/// as in the reference: the request is OK while one quota group is not over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_quota_mode_counts_an_unlimited_descriptor_as_a_group_that_passed() {
    let server = TestServer::start_with_clock(
        &[("rules.yaml".into(), RULES.into())],
        &[("QUOTA_MODE".into(), "true".into())],
        &[],
        early_in_a_minute(),
    )
    .await;
    let limited = || request(&[("fixed", "quota-user")]);
    let with_unmatched = || RateLimitRequest {
        descriptors: vec![
            descriptor(&[("fixed", "quota-user")]),
            descriptor(&[("nothing", "x")]),
        ],
        ..request(&[])
    };
    for _ in 0..3 {
        assert_eq!(
            call(&server, limited()).await.expect("call").overall_code,
            OK
        );
    }
    let alone = call(&server, limited()).await.expect("call");
    assert_eq!(alone.overall_code, OVER, "its only group is over");
    let both = call(&server, with_unmatched()).await.expect("call");
    assert_eq!(both.statuses[0].code, OVER);
    assert_eq!(
        both.overall_code, OK,
        "the unmatched descriptor's group passed"
    );
    server.stop().await;
}

/// When several limits of one descriptor refuse, the status and `Retry-After` describe
/// the one with the longest wait: the request passes no sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_wait_of_a_descriptors_limits_is_answered() {
    let server = start().await;
    let two = || {
        let mut request = request(&[("multi", "longest-wait")]);
        request.descriptors[0].hits_addend = Some(2);
        request
    };
    assert_eq!(call(&server, two()).await.expect("call").overall_code, OK);
    // The bucket (2 a second) and the day (3) both refuse 2 more.
    let refused = call(&server, two()).await.expect("call");
    assert_eq!(refused.overall_code, OVER);
    let status = &refused.statuses[0];
    let limit = status.current_limit.as_ref().expect("limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, RateLimitUnit::Day as i32)
    );
    let reset = status.duration_until_reset.as_ref().expect("reset").seconds;
    assert_eq!(
        header(&refused, "Retry-After"),
        Some(reset.to_string().as_str())
    );
    server.stop().await;
}

/// A negative hit (Envoy 1.40's `is_negative_hits`) gives its hits back on every
/// algorithm: a limit used up admits again at once, the refund itself is OK (never
/// refused, even against a used-up limit), and it is counted as a refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_hits_give_back_on_every_algorithm() {
    let server = start_early_in_a_minute().await;
    // The fixed window counts the refused hit too (the reference's semantics): one more
    // to give back there.
    for (key, capacity, given_back) in [
        ("fixed", 3, 3),
        ("sliding", 3, 2),
        ("log", 3, 2),
        ("bucket", 5, 2),
        ("gcra", 3, 2),
        ("multi", 2, 2),
    ] {
        let charge = |hits: u64, negative: bool| {
            let mut request = request(&[(key, "refunded")]);
            request.descriptors[0].hits_addend = Some(hits);
            request.descriptors[0].is_negative_hits = negative;
            request
        };
        let used_up = call(&server, charge(capacity, false)).await.expect("call");
        assert_eq!(used_up.overall_code, OK, "{key}");
        let over = call(&server, charge(1, false)).await.expect("call");
        assert_eq!(over.overall_code, OVER, "{key}: used up");
        let refund = call(&server, charge(given_back, true)).await.expect("call");
        assert_eq!(refund.overall_code, OK, "{key}: a refund is never refused");
        assert_eq!(refund.statuses[0].limit_remaining, 2, "{key}: two back");
        for round in 0..2 {
            let again = call(&server, charge(1, false)).await.expect("call");
            assert_eq!(again.overall_code, OK, "{key}: given back, round {round}");
        }
        let over = call(&server, charge(1, false)).await.expect("call");
        assert_eq!(
            over.overall_code, OVER,
            "{key}: no more than was given back"
        );
    }
    let metrics = server.metrics().await;
    let refunds: f64 = metrics
        .0
        .iter()
        .filter(|(name, _)| {
            name.starts_with("sluice_requests_total") && name.contains("decision=\"refund\"")
        })
        .map(|(_, value)| value)
        .sum();
    assert_eq!(refunds, 6.0, "one refund per algorithm counted");
    server.stop().await;
}

/// A descriptor that says its hits are negative but has none of its own, in a request
/// whose `hits_addend` is positive, asks for a negative and a positive cost at once:
/// refused with INVALID_ARGUMENT, never guessed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_and_a_positive_cost_for_one_descriptor_is_refused() {
    let server = start().await;
    let mut contradictory = request(&[("fixed", "contradiction")]);
    contradictory.hits_addend = 3;
    contradictory.descriptors[0].is_negative_hits = true;
    let error = call(&server, contradictory.clone())
        .await
        .expect_err("refused");
    assert_eq!(error.code(), GrpcCode::InvalidArgument);
    assert!(error.message().contains("is_negative_hits"), "{error:?}");
    // With its own hits, the descriptor's refund is what it asks for.
    contradictory.descriptors[0].hits_addend = Some(1);
    let answer = call(&server, contradictory).await.expect("a refund");
    assert_eq!(answer.overall_code, OK);
    server.stop().await;
}

/// A refund on a `ledger: true` limit is refused (the ledger records admitted units
/// only: the next restore would undo it); a charge there is answered as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_a_ledger_limit_is_refused() {
    let server = TestServer::start(
        &[(
            "ledger.yaml".to_owned(),
            "domain: api\ndescriptors:\n  - key: quota\n    rate_limit: {unit: day, requests_per_unit: 10, ledger: true}\n"
                .to_owned(),
        )],
        &[],
        &[],
    )
    .await;
    let mut refund = request(&[("quota", "customer")]);
    refund.descriptors[0].hits_addend = Some(1);
    refund.descriptors[0].is_negative_hits = true;
    let error = call(&server, refund).await.expect_err("refused");
    assert_eq!(error.code(), GrpcCode::InvalidArgument);
    assert!(error.message().contains("ledger"), "{error:?}");
    let charge = call(&server, request(&[("quota", "customer")]))
        .await
        .expect("a charge");
    assert_eq!(charge.overall_code, OK);
    server.stop().await;
}

/// The LLM-token pattern with `on_over_limit: charge`: the request phase checks with
/// `hits_addend: 0`, the response phase charges the real cost. A cost above what is
/// left is charged all the same (debt), the next checks are refused until time has paid
/// it back at the limit's rate, and `explain`'s view of the rule shows the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_charged_after_the_response_goes_into_debt() {
    const DEBT: &str = r#"
domain: api
descriptors:
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: token_bucket, on_over_limit: charge}
"#;
    let clock = early_in_a_minute();
    let server = TestServer::start_with_clock(
        &[("rules.yaml".into(), DEBT.into())],
        &[],
        &["--response-headers", "all"],
        clock.clone(),
    )
    .await;
    let tokens = |hits: u64| {
        let mut request = request(&[("tokens", "user-1")]);
        request.descriptors[0].hits_addend = Some(hits);
        request
    };
    let probe = call(&server, tokens(0)).await.expect("call");
    assert_eq!(probe.overall_code, OK, "the budget is not spent");
    // 5 000 tokens against 1 000 left: refused as a request, charged as a cost.
    let response = call(&server, tokens(5_000)).await.expect("call");
    assert_eq!(response.overall_code, OVER);
    let probe = call(&server, tokens(0)).await.expect("call");
    assert_eq!(probe.overall_code, OVER, "in debt: 4 000 tokens owed");
    // 1 000 tokens a minute: the debt of 4 000 is paid after four minutes.
    clock.advance(239_000_000);
    let probe = call(&server, tokens(0)).await.expect("call");
    assert_eq!(probe.overall_code, OVER, "a second short of four minutes");
    clock.advance(1_000_000);
    let probe = call(&server, tokens(0)).await.expect("call");
    assert_eq!(probe.overall_code, OK, "paid back at the configured rate");
    let rlconfig = reqwest::get(server.url("/rlconfig"))
        .await
        .expect("GET /rlconfig")
        .text()
        .await
        .expect("text");
    assert!(rlconfig.contains("on_over_limit=charge"), "{rlconfig}");
    server.stop().await;
}
