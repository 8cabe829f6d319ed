//! What Envoy 1.40 sends for the page's bootstraps, seen by a recording rate limit
//! service: the facts the patterns rest on, and the page's table "What Envoy 1.40
//! sends". A newer Envoy that sends otherwise fails here first.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::RateLimitRequest;
use support::e2e::doc_block;
use support::e2e::recording_rls::{Call, RecordingRls};
use support::e2e::upstream::Upstream;

use super::{Edge, PAGE, SETTLE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_sends_what_the_patterns_need() {
    let rls = RecordingRls::start(refuse_the_refused);
    concurrency_calls(&rls).await;
    budget_calls(&rls).await;
    route_level_calls(&rls).await;
    delay_calls(&rls).await;
}

/// The concurrency bootstrap: an acquire, then a release of the same slot when the
/// response is sent, when the filter answered 429, and at once when the client goes.
async fn concurrency_calls(rls: &RecordingRls) {
    let upstream = Upstream::holding().await;
    let bootstrap = doc_block(PAGE, "concurrency-envoy");
    let edge = Edge::start(&bootstrap, &[rls.port], upstream.port).await;

    // A client's own x-request-id is replaced at the edge.
    let request = edge.spawn(&[("x-user", "u1"), ("x-request-id", "chosen-by-the-client")]);
    upstream.wait_for_arrivals(1, SETTLE).await;
    upstream.release(1);
    assert_eq!(
        request.await.expect("request task").status(),
        StatusCode::OK
    );
    let calls = rls.wait_for_calls(2, SETTLE).await;
    let slot = entries(&calls[0].request)[1].1.clone();
    assert_ne!(slot, "chosen-by-the-client");
    assert_acquire_then_release(&calls[0..2], "u1", &slot);
    for call in &calls[0..2] {
        let deadline = Some(Duration::from_millis(250));
        assert_eq!(call.timeout, deadline, "the filter's timeout: {call:?}");
    }

    let refused = [("x-user", "refused")];
    assert_eq!(edge.status(&refused).await, StatusCode::TOO_MANY_REQUESTS);
    let calls = rls.wait_for_calls(4, SETTLE).await;
    let slot = entries(&calls[2].request)[1].1.clone();
    assert_acquire_then_release(&calls[2..4], "refused", &slot);

    let request = edge.spawn(&[("x-user", "u3")]);
    upstream.wait_for_arrivals(2, SETTLE).await;
    let calls = rls.wait_for_calls(5, SETTLE).await;
    let slot = entries(&calls[4].request)[1].1.clone();
    let gone = Instant::now();
    request.abort();
    let calls = rls.wait_for_calls(6, Duration::from_secs(1)).await;
    eprintln!("release {:?} after the client disconnected", gone.elapsed());
    assert_acquire_then_release(&calls[4..6], "u3", &slot);
    upstream.release(1);
}

/// The budget bootstrap: a check of cost 0, then a charge of the response's cost, as a
/// whole number; no charge when the response has no cost or when the filter answered 429.
async fn budget_calls(rls: &RecordingRls) {
    let upstream = Upstream::start().await;
    let bootstrap = doc_block(PAGE, "budget-envoy");
    let edge = Edge::start(&bootstrap, &[rls.port], upstream.port).await;
    let seen = rls.calls().len();
    let costly = [("x-tenant", "t1"), ("x-echo-x-tokens-used", "1500")];
    assert_eq!(edge.status(&costly).await, StatusCode::OK);
    rls.wait_for_calls(seen + 2, SETTLE).await;
    let refused = [("x-tenant", "refused"), ("x-echo-x-tokens-used", "7")];
    assert_eq!(edge.status(&refused).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(edge.status(&[("x-tenant", "t2")]).await, StatusCode::OK);
    // The last request's charge comes after any the two before it would have made.
    let last = [("x-tenant", "t3"), ("x-echo-x-tokens-used", "12.7")];
    assert_eq!(edge.status(&last).await, StatusCode::OK);
    let calls = rls.wait_for_calls(seen + 6, SETTLE).await;
    let tenants: Vec<_> = calls[seen..]
        .iter()
        .map(|call| (entries(&call.request)[0].1.clone(), hits(call)))
        .collect();
    let check = (Some(0), false);
    assert_eq!(
        tenants,
        [
            ("t1".to_owned(), check),
            ("t1".to_owned(), (Some(1500), false)),
            ("refused".to_owned(), check),
            ("t2".to_owned(), check),
            ("t3".to_owned(), check),
            ("t3".to_owned(), (Some(12), false)),
        ],
        "no charge after a 429 or without a cost; a cost of 12.7 is sent as 12"
    );
}

/// The budget bootstrap with its `rate_limits` in the route itself: the stream-done
/// call is made, but without the descriptor's `hits_addend`.
async fn route_level_calls(rls: &RecordingRls) {
    let upstream = Upstream::start().await;
    let bootstrap = route_level(&doc_block(PAGE, "budget-envoy"));
    let edge = Edge::start(&bootstrap, &[rls.port], upstream.port).await;
    let seen = rls.calls().len();
    let costly = [("x-tenant", "t1"), ("x-echo-x-tokens-used", "1500")];
    assert_eq!(edge.status(&costly).await, StatusCode::OK);
    let calls = rls.wait_for_calls(seen + 2, SETTLE).await;
    for call in &calls[seen..] {
        assert_eq!(
            hits(call),
            (None, false),
            "a route's own rate_limits send no hits_addend: {call:?}"
        );
    }
}

/// The delay bootstrap: the filter's timeout of 3 s is the call's deadline.
async fn delay_calls(rls: &RecordingRls) {
    let upstream = Upstream::start().await;
    let bootstrap = doc_block(PAGE, "delay-envoy");
    let edge = Edge::start(&bootstrap, &[rls.port], upstream.port).await;
    let seen = rls.calls().len();
    assert_eq!(edge.status(&[("x-client", "c")]).await, StatusCode::OK);
    let calls = rls.wait_for_calls(seen + 1, SETTLE).await;
    assert_eq!(calls[seen].timeout, Some(Duration::from_secs(3)));
}

/// Answers OVER_LIMIT when an entry's value is `refused`, OK otherwise.
fn refuse_the_refused(request: &RateLimitRequest) -> Code {
    let mut entries = request.descriptors.iter().flat_map(|d| &d.entries);
    if entries.any(|entry| entry.value == "refused") {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// `calls` are an acquire (no hits: one) and a release (one, negative) of `slot`.
fn assert_acquire_then_release(calls: &[Call], user: &str, slot: &str) {
    let expected = [
        ("user".to_owned(), user.to_owned()),
        ("request_id".to_owned(), slot.to_owned()),
    ];
    assert_eq!(entries(&calls[0].request), expected, "{calls:?}");
    assert_eq!(hits(&calls[0]), (None, false), "acquire: {calls:?}");
    assert_eq!(entries(&calls[1].request), expected, "{calls:?}");
    assert_eq!(hits(&calls[1]), (Some(1), true), "release: {calls:?}");
}

/// The one descriptor's entries as (key, value).
fn entries(request: &RateLimitRequest) -> Vec<(String, String)> {
    assert_eq!(request.descriptors.len(), 1, "{request:?}");
    let entries = &request.descriptors[0].entries;
    entries
        .iter()
        .map(|entry| (entry.key.clone(), entry.value.clone()))
        .collect()
}

/// The one descriptor's `hits_addend` and `is_negative_hits`; the request's own
/// `hits_addend` is 0 (unset) in every call Envoy makes.
fn hits(call: &Call) -> (Option<u64>, bool) {
    assert_eq!(call.request.hits_addend, 0, "{call:?}");
    let descriptor = &call.request.descriptors[0];
    (descriptor.hits_addend, descriptor.is_negative_hits)
}

/// `bootstrap` with the `rate_limits` of its rate limit filter's per-route config moved
/// into the route itself, where they validate too.
fn route_level(bootstrap: &str) -> String {
    let mut out = Vec::new();
    let mut lines = bootstrap.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "route: {cluster: api}" {
            out.push(line.to_owned());
            continue;
        }
        let indent = &line[..line.len() - line.trim_start().len()];
        out.push(format!("{indent}route:"));
        out.push(format!("{indent}  cluster: api"));
        let per_route: Vec<&str> = lines.by_ref().take(3).collect();
        assert!(
            per_route[0].contains("typed_per_filter_config")
                && per_route[2].contains("RateLimitPerRoute"),
            "per-route rate limit config after the route: {per_route:?}"
        );
        for line in lines.by_ref() {
            if line.trim() == "http_filters:" {
                out.push(line.to_owned());
                break;
            }
            out.push(line[2..].to_owned());
        }
    }
    out.join("\n") + "\n"
}
