//! Beyond requests per second, over gRPC: delayed answers (`max_delay`) within the
//! caller's `grpc-timeout`, bounded and drained at shutdown; concurrency limits
//! (`algorithm: concurrency`) released by stream-done calls.

use std::time::{Duration, Instant};

use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::{rate_limit::Unit, Code};
use sluice::proto::rls::{RateLimitRequest, RateLimitResponse};
use support::TestServer;

const RULES: &str = r#"
domain: beyond
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: gcra, burst: 1, max_delay: 2s}
  - key: login
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_log, max_delay: 2s}
  - key: user
    descriptors:
      - key: request_id
        slot: true
        rate_limit: {algorithm: concurrency, max_in_flight: 3, max_hold: 60s}
"#;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

async fn start() -> TestServer {
    TestServer::start(
        &[("rules.yaml".into(), RULES.into())],
        &[],
        &["--response-headers", "all"],
    )
    .await
}

fn request(entries: &[(&str, &str)], release: bool) -> RateLimitRequest {
    RateLimitRequest {
        domain: "beyond".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: (*key).into(),
                    value: (*value).into(),
                })
                .collect(),
            limit: None,
            hits_addend: release.then_some(1),
            is_negative_hits: release,
        }],
        hits_addend: 0,
    }
}

/// One call with a `grpc-timeout` of `timeout`: its answer and when it came.
async fn call(
    server: &TestServer,
    request: RateLimitRequest,
    timeout: Duration,
) -> (RateLimitResponse, Instant) {
    let mut request = tonic::Request::new(request);
    request.set_timeout(timeout);
    let answer = server
        .client()
        .await
        .should_rate_limit(request)
        .await
        .expect("answered")
        .into_inner();
    (answer, Instant::now())
}

/// `calls` calls of one client at once, each with `timeout`: answers and arrival times,
/// sorted by arrival.
async fn burst(server: &TestServer, calls: usize, timeout: Duration) -> Vec<(i32, Duration)> {
    burst_on(server, "client", calls, timeout).await
}

/// [`burst`] on descriptor `key`.
async fn burst_on(
    server: &TestServer,
    key: &str,
    calls: usize,
    timeout: Duration,
) -> Vec<(i32, Duration)> {
    let started = Instant::now();
    let answers = futures::future::join_all(
        (0..calls).map(|_| call(server, request(&[(key, "c1")], false), timeout)),
    )
    .await;
    let mut out: Vec<(i32, Duration)> = answers
        .into_iter()
        .map(|(answer, at)| (answer.overall_code, at - started))
        .collect();
    out.sort_by_key(|(_, at)| *at);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_spaced_instead_of_refused_within_max_delay() {
    let server = start().await;
    let answers = burst(&server, 20, Duration::from_secs(3)).await;
    assert!(answers.iter().all(|(code, _)| *code == OK), "{answers:?}");
    let last = answers.last().map(|(_, at)| *at).unwrap_or_default();
    assert!(
        last >= Duration::from_millis(1_750) && last < Duration::from_millis(2_800),
        "20 calls at 10/s end after ~1.9 s: {answers:?}"
    );
    // About 100 ms apart: the median gap between answers.
    let mut gaps: Vec<Duration> = answers.windows(2).map(|w| w[1].1 - w[0].1).collect();
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    assert!(
        median >= Duration::from_millis(70) && median <= Duration::from_millis(130),
        "median gap {median:?}: {answers:?}"
    );
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.get(r#"sluice_delayed_answers_total{outcome="answered"}"#),
        19.0
    );
    assert_eq!(metrics.get("sluice_delayed_answers_pending"), 0.0);
    assert_eq!(metrics.get("sluice_delay_seconds_count"), 19.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_answers_the_next_window_when_the_first_leaves() {
    let server = start().await;
    let answers = burst_on(&server, "login", 10, Duration::from_secs(3)).await;
    assert!(answers.iter().all(|(code, _)| *code == OK), "{answers:?}");
    // Five at once; five when those leave the window, a second later.
    let at_once = answers
        .iter()
        .filter(|(_, at)| *at < Duration::from_millis(400))
        .count();
    assert_eq!(at_once, 5, "{answers:?}");
    assert!(
        answers[5..]
            .iter()
            .all(|(_, at)| *at >= Duration::from_millis(900) && *at < Duration::from_millis(1_600)),
        "{answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_callers_deadline_is_a_refusal_in_time() {
    let server = start().await;
    let answers = burst(&server, 10, Duration::from_millis(500)).await;
    let admitted = answers.iter().filter(|(code, _)| *code == OK).count();
    // 500 ms, 10 % kept back: waits of 100 to 400 ms fit, 500 ms and more do not.
    assert!((4..=6).contains(&admitted), "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|(code, at)| *code == OVER || *at < Duration::from_millis(500)),
        "every OK before the deadline: {answers:?}"
    );
    assert!(answers.iter().any(|(code, _)| *code == OVER));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_answers_a_delayed_call_at_once() {
    let server = start().await;
    // The first call takes the burst; the next waits ~100 ms, the 10th ~1 s.
    let answers = burst(&server, 2, Duration::from_secs(3)).await;
    assert!(answers.iter().all(|(code, _)| *code == OK));
    let client = server.client().await;
    let waiting = futures::future::join_all((0..10).map(|_| {
        let mut client = client.clone();
        let mut request = tonic::Request::new(request(&[("client", "c1")], false));
        request.set_timeout(Duration::from_secs(3));
        tokio::spawn(async move {
            let answer = client.should_rate_limit(request).await;
            (answer.map(|a| a.into_inner().overall_code), Instant::now())
        })
    }));
    let waiting = tokio::spawn(waiting);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    tokio::spawn(server.stop());
    let answers = waiting.await.expect("calls");
    for answer in answers {
        let (code, at) = answer.expect("call task");
        assert_eq!(code.expect("answered before the listener closed"), OK);
        assert!(
            at.saturating_duration_since(stopping) < Duration::from_millis(500),
            "answered at once by the drain"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_slots_are_taken_and_given_back_over_grpc() {
    let server = start().await;
    let timeout = Duration::from_secs(1);
    let acquire = |id: &'static str| request(&[("user", "alice"), ("request_id", id)], false);
    let release = |id: &'static str| request(&[("user", "alice"), ("request_id", id)], true);
    let mut codes = Vec::new();
    for id in ["r1", "r2", "r3", "r4"] {
        codes.push(call(&server, acquire(id), timeout).await.0);
    }
    let refused = &codes[3];
    assert_eq!(
        codes.iter().map(|a| a.overall_code).collect::<Vec<_>>(),
        [OK, OK, OK, OVER]
    );
    let status = &refused.statuses[0];
    let limit = status.current_limit.as_ref().expect("current limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, Unit::Unknown as i32)
    );
    let retry = refused
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "Retry-After")
        .map(|h| h.value.clone());
    assert_eq!(retry.as_deref(), Some("1"));
    // The refused request's stream-done call frees nothing; r1's frees its slot.
    assert_eq!(
        call(&server, release("r4"), timeout).await.0.overall_code,
        OK
    );
    assert_eq!(
        call(&server, acquire("r5"), timeout).await.0.overall_code,
        OVER
    );
    assert_eq!(
        call(&server, release("r1"), timeout).await.0.overall_code,
        OK
    );
    assert_eq!(
        call(&server, acquire("r5"), timeout).await.0.overall_code,
        OK
    );
    // Another user has slots of their own.
    let bob = request(&[("user", "bob"), ("request_id", "r1")], false);
    assert_eq!(call(&server, bob, timeout).await.0.overall_code, OK);
}
