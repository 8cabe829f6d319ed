use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::rules::{ConfigFile, LoadOptions};
use crate::store::StoreError;

/// A store that is down: every call fails.
struct DownStore;

impl Store for DownStore {
    async fn check(&self, _: &[StoreCheck], _: &mut Vec<Decision>) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }

    async fn peek(&self, _: &StoreCheck, _: &mut Vec<Decision>) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }

    async fn hold(&self, _: &crate::store::HoldCall) -> Result<Decision, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }

    fn kind(&self) -> &'static str {
        "down"
    }
}

const RULES: &str = r#"
domain: d
descriptors:
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 4, failure_mode: closed}
  - key: local
    rate_limit: {unit: minute, requests_per_unit: 4, failure_mode: local}
  - key: error
    rate_limit: {unit: minute, requests_per_unit: 4, failure_mode: error}
"#;

fn rules() -> Rules {
    compile_one(RULES)
}

/// `text` compiled as one rule file.
fn compile_one(text: &str) -> Rules {
    let file = ConfigFile {
        name: "t.yaml".into(),
        text: text.into(),
    };
    Rules::compile(&[file], &LoadOptions::default()).expect("rules compile")
}

/// `text` compiled as one rule file, and a limiter with `settings` on a fresh memory
/// store.
fn on_memory(
    text: &str,
    settings: LimiterSettings,
) -> (
    Rules,
    Limiter<crate::store::memory::MemoryStore>,
    Arc<Metrics>,
) {
    let rules = compile_one(text);
    let metrics = Arc::new(Metrics::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = crate::store::memory::MemoryStore::new(100, clock.clone());
    let limiter = Limiter::new(store, clock, settings, metrics.clone());
    (rules, limiter, metrics)
}

fn limiter(metrics: Arc<Metrics>) -> Limiter<DownStore> {
    let settings = LimiterSettings {
        replicas: 2,
        ..LimiterSettings::default()
    };
    Limiter::new(
        DownStore,
        Arc::new(ManualClock::new(1_000_000)),
        settings,
        metrics,
    )
}

fn request<'a>(key: &'a str) -> CheckRequest<'a> {
    CheckRequest {
        domain: "d",
        descriptors: vec![Descriptor {
            entries: vec![Entry { key, value: "v" }],
            limit_override: None,
            hits_addend: None,
            refund: false,
        }],
        hits_addend: 0,
    }
}

fn allowed(verdicts: &[Verdict<'_>]) -> bool {
    match &verdicts[0] {
        Verdict::Limited(limited) => !limited.over_limit,
        other => panic!("not limited: {other:?}"),
    }
}

/// Whether each of `calls` calls on `key` (one hit each) was allowed, in order.
async fn allowed_calls<S: Store>(
    limiter: &Limiter<S>,
    rules: &Rules,
    key: &str,
    calls: usize,
) -> Vec<bool> {
    let mut out = Vec::with_capacity(calls);
    for _ in 0..calls {
        let verdicts = limiter.check(rules, &request(key)).await.expect("answers");
        out.push(allowed(&verdicts));
    }
    out
}

#[tokio::test]
async fn failure_modes_decide_when_the_store_is_down() {
    let metrics = Arc::new(Metrics::new());
    let limiter = limiter(metrics.clone());
    let rules = rules();
    for _ in 0..10 {
        let verdicts = limiter
            .check(&rules, &request("open"))
            .await
            .expect("open answers");
        assert!(allowed(&verdicts), "open admits");
        let verdicts = limiter
            .check(&rules, &request("closed"))
            .await
            .expect("closed answers");
        assert!(!allowed(&verdicts), "closed refuses");
    }
    // local: 4 per minute shared by 2 replicas = 2 here.
    let local = allowed_calls(&limiter, &rules, "local", 3).await;
    assert_eq!(local, vec![true, true, false]);
    let error = limiter
        .check(&rules, &request("error"))
        .await
        .expect_err("error mode fails the call");
    assert!(matches!(
        error,
        LimiterError::Store(StoreError::Unavailable(_))
    ));

    let text = metrics.encode();
    assert!(
        text.contains(r#"sluice_store_fallback_total{rule="d.open",mode="open"} 10"#),
        "{text}"
    );
    assert!(
        text.contains(r#"sluice_store_fallback_total{rule="d.local",mode="local"} 3"#),
        "{text}"
    );
}

/// A shared store that is down, counting the calls it gets.
#[derive(Default)]
struct DownSharedStore {
    checks: std::sync::atomic::AtomicU32,
    leases: std::sync::atomic::AtomicU32,
}

impl Store for DownSharedStore {
    async fn check(&self, _: &[StoreCheck], _: &mut Vec<Decision>) -> Result<(), StoreError> {
        self.checks
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(StoreError::Timeout(std::time::Duration::from_millis(20)))
    }

    async fn peek(&self, _: &StoreCheck, _: &mut Vec<Decision>) -> Result<(), StoreError> {
        Err(StoreError::Timeout(std::time::Duration::from_millis(20)))
    }

    async fn hold(&self, _: &crate::store::HoldCall) -> Result<Decision, StoreError> {
        Err(StoreError::Timeout(std::time::Duration::from_millis(20)))
    }

    fn kind(&self) -> &'static str {
        "down-shared"
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn lease(
        &self,
        _: &crate::store::LeaseRequest,
    ) -> Result<crate::store::LeaseGrant, StoreError> {
        self.leases
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(StoreError::Timeout(std::time::Duration::from_millis(20)))
    }
}

#[tokio::test]
async fn a_failed_lease_call_is_answered_by_the_failure_mode_without_a_second_call() {
    let rules = compile_one("domain: d\ndescriptors:\n  - key: closed\n    rate_limit: {unit: minute, requests_per_unit: 40, lease: 4, failure_mode: closed}\n  - key: error\n    rate_limit: {unit: minute, requests_per_unit: 40, lease: 4, failure_mode: error}\n");
    let metrics = Arc::new(Metrics::new());
    let limiter = Limiter::new(
        DownSharedStore::default(),
        Arc::new(ManualClock::new(1_000_000)),
        LimiterSettings::default(),
        metrics.clone(),
    );
    let verdicts = limiter
        .check(&rules, &request("closed"))
        .await
        .expect("closed answers");
    assert!(!allowed(&verdicts), "closed refuses");
    let error = limiter
        .check(&rules, &request("error"))
        .await
        .expect_err("error mode fails the call");
    assert!(matches!(error, LimiterError::Store(StoreError::Timeout(_))));
    let store = limiter.store();
    assert_eq!(store.leases.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(
        store.checks.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no second store call after a failed lease call"
    );
    let text = metrics.encode();
    assert!(
        text.contains(r#"sluice_store_fallback_total{rule="d.closed",mode="closed"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn shadow_rules_skip_the_blocked_cache_unless_in_reference_local_cache_mode() {
    for report_local_cache in [false, true] {
        let settings = LimiterSettings {
            report_local_cache,
            ..LimiterSettings::default()
        };
        let (rules, limiter, metrics) = on_memory(SHADOW, settings);
        for _ in 0..4 {
            let verdicts = limiter
                .check(&rules, &request("shadow"))
                .await
                .expect("answers");
            assert!(allowed(&verdicts), "a shadow rule never refuses");
        }
        let text = metrics.encode();
        let cached = text.contains(r#"sluice_local_decisions_total{layer="blocked_cache"}"#);
        assert_eq!(cached, report_local_cache, "{text}");
        assert!(
            text.contains(r#"sluice_rule_hits_total{rule="d.shadow",stat="shadow_mode"} 3"#),
            "{text}"
        );
    }
}

/// Statistic `stat` of rule label `rule` in `metrics` (0 when never counted).
fn rule_stat(metrics: &Metrics, rule: &str, stat: &str) -> u64 {
    let sample = format!(r#"sluice_rule_hits_total{{rule="{rule}",stat="{stat}"}} "#);
    metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(&sample).map(str::to_owned))
        .map_or(0, |value| value.parse::<u64>().expect("a count"))
}

/// One shadow rule: 1 an hour.
const SHADOW: &str =
    "domain: d\ndescriptors:\n  - key: shadow\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// A shadow rule counts in `shadow_mode` the hits past its limit, as `over_limit` does:
/// a request of 3 hits on a fresh limit of 1 counts 2 (the reference's
/// `increaseShadowModeStats`), and every hit of a request already over it.
#[tokio::test]
async fn shadow_mode_counts_the_hits_past_the_limit() {
    let (rules, limiter, metrics) = on_memory(SHADOW, LimiterSettings::default());
    let stat = |name: &str| rule_stat(&metrics, "d.shadow", name);
    for (hits, shadow, over) in [(3, 2, 2), (2, 4, 4)] {
        let mut request = request("shadow");
        request.hits_addend = hits;
        let verdicts = limiter.check(&rules, &request).await.expect("answers");
        assert!(allowed(&verdicts), "a shadow rule never refuses");
        assert_eq!((stat("shadow_mode"), stat("over_limit")), (shadow, over));
    }
}

/// An unlimited rule's `replaces` apply, in either order: the named limit is neither
/// charged nor answered (the reference collects `replaces` before it sets unlimited
/// rules aside).
#[tokio::test]
async fn an_unlimited_rule_replaces_too() {
    let (rules, limiter, _) = on_memory(
        "domain: d\ndescriptors:\n  - key: named\n    rate_limit: {unit: hour, requests_per_unit: 1, name: one}\n  - key: free\n    rate_limit: {unlimited: true, replaces: [{name: one}]}\n",
        LimiterSettings::default(),
    );
    for keys in [["named", "free"], ["free", "named"]] {
        let mut request = request(keys[0]);
        request.descriptors.push(request.descriptors[0].clone());
        request.descriptors[1].entries[0].key = keys[1];
        for _ in 0..3 {
            let verdicts = limiter.check(&rules, &request).await.expect("answers");
            let named = keys.iter().position(|key| *key == "named").expect("named");
            assert_eq!(verdicts[named], Verdict::NoLimit, "{keys:?}");
            assert_eq!(verdicts[1 - named], Verdict::Unlimited, "{keys:?}");
        }
    }
}

/// A memory store that fails every call while `down` is set.
struct FlakyStore {
    down: std::sync::atomic::AtomicBool,
    memory: crate::store::memory::MemoryStore,
}

impl Store for FlakyStore {
    async fn check(
        &self,
        checks: &[StoreCheck],
        out: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        if self.down.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(StoreError::Unavailable("connection refused".into()));
        }
        self.memory.check(checks, out).await
    }

    async fn peek(&self, check: &StoreCheck, out: &mut Vec<Decision>) -> Result<(), StoreError> {
        self.memory.peek(check, out).await
    }

    async fn hold(&self, call: &crate::store::HoldCall) -> Result<Decision, StoreError> {
        if self.down.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(StoreError::Unavailable("connection refused".into()));
        }
        self.memory.hold(call).await
    }

    fn kind(&self) -> &'static str {
        "flaky"
    }
}

/// A refusal of the `local` failure mode is never remembered by the blocked-until
/// cache nor the pre-check: once the store is back, it decides the key again.
#[tokio::test]
async fn a_failure_modes_refusal_is_forgotten_when_the_store_is_back() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = FlakyStore {
        down: true.into(),
        memory: crate::store::memory::MemoryStore::new(100, clock.clone()),
    };
    let metrics = Arc::new(Metrics::new());
    let settings = LimiterSettings {
        replicas: 2,
        ..LimiterSettings::default()
    };
    let limiter = Limiter::new(store, clock, settings, metrics.clone()).with_precheck(true);
    let rules = rules();
    let local = allowed_calls(&limiter, &rules, "local", 3).await;
    assert_eq!(local, vec![true, true, false], "2 of 4 a minute here");
    limiter
        .store
        .down
        .store(false, std::sync::atomic::Ordering::Relaxed);
    for call in 0..4 {
        let verdicts = limiter
            .check(&rules, &request("local"))
            .await
            .expect("answers");
        assert!(
            allowed(&verdicts),
            "call {call}: the store has counted nothing yet"
        );
    }
    let text = metrics.encode();
    assert!(!text.contains(r#"layer="blocked_cache"} "#), "{text}");
    assert!(!text.contains(r#"layer="precheck"} "#), "{text}");
}

/// Hit statistics stop at `u64::MAX`: a client's `hits_addend` never wraps a counter
/// (Prometheus would read the smaller value as a reset).
#[tokio::test]
async fn hit_statistics_saturate_instead_of_wrapping() {
    let (rules, limiter, metrics) = on_memory(
        "domain: d\ndescriptors:\n  - key: big\n    rate_limit: {unit: minute, requests_per_unit: 8}\n",
        LimiterSettings::default(),
    );
    for hits in [u64::MAX, 1 << 32, u64::MAX] {
        let mut request = request("big");
        request.hits_addend = hits;
        limiter.check(&rules, &request).await.expect("answers");
        assert_eq!(
            rule_stat(&metrics, "d.big", "total_hits"),
            u64::MAX,
            "{hits}"
        );
    }
    assert_eq!(rule_stat(&metrics, "d.big", "over_limit"), u64::MAX);
}

/// A cost no limit can ever hold is answered by the store, with the store's reset,
/// even on a hot key: the pre-check's own view (empty when the key turned hot) would
/// say 0. The blocked-until cache, which only keeps the latest refusal, does not hide
/// it: the costs alternate.
#[tokio::test]
async fn a_cost_above_capacity_gets_the_stores_reset_on_a_hot_key() {
    let (rules, limiter, _) = on_memory(
        "domain: d\ndescriptors:\n  - key: tb\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket, burst: 7}\n",
        LimiterSettings::default(),
    );
    let limiter = limiter.with_precheck(true);
    let reset_of = |verdicts: &[Verdict<'_>]| match &verdicts[0] {
        Verdict::Limited(limited) => (limited.over_limit, limited.decision.reset_after),
        other => panic!("not limited: {other:?}"),
    };
    let call = |cost: u64| {
        let mut request = request("tb");
        request.hits_addend = cost;
        request
    };
    // Empty the bucket (7), then make the key hot with refusals.
    for _ in 0..19 {
        limiter.check(&rules, &call(1)).await.expect("answers");
    }
    // 7 tokens short of full at 12 s each: 84 s, for every refusal of any cost.
    for cost in [9, 1, 9, 9, 1, 9] {
        let verdicts = limiter.check(&rules, &call(cost)).await.expect("answers");
        assert_eq!(reset_of(&verdicts), (true, 84_000_000), "cost {cost}");
    }
}

const SLOTS: &str = r#"
domain: d
descriptors:
  - key: user
    descriptors:
      - key: request_id
        slot: true
        rate_limit: {algorithm: concurrency, max_in_flight: 2, max_hold: 10s}
"#;

/// A request of `user` whose x-request-id is `id`: the request phase, or (`release`)
/// its stream-done call.
fn slot_request<'a>(user: &'a str, id: &'a str, release: bool) -> CheckRequest<'a> {
    CheckRequest {
        domain: "d",
        descriptors: vec![Descriptor {
            entries: vec![
                Entry {
                    key: "user",
                    value: user,
                },
                Entry {
                    key: "request_id",
                    value: id,
                },
            ],
            limit_override: None,
            hits_addend: None,
            refund: release,
        }],
        hits_addend: 0,
    }
}

#[tokio::test]
async fn a_user_holds_at_most_max_in_flight_slots_and_frees_only_its_own() {
    let (rules, limiter, _) = on_memory(SLOTS, LimiterSettings::default());
    let mut calls = Vec::new();
    for (user, id, release) in [
        ("alice", "1", false),
        ("alice", "2", false),
        ("alice", "3", false),
        // The refused request's stream-done call frees nothing.
        ("alice", "3", true),
        ("alice", "4", false),
        ("bob", "1", false),
        ("alice", "1", true),
        ("alice", "4", false),
        // A release sent twice frees one slot.
        ("alice", "1", true),
        ("alice", "5", false),
    ] {
        let verdicts = limiter
            .check(&rules, &slot_request(user, id, release))
            .await
            .expect("answers");
        calls.push(allowed(&verdicts));
        if let (Verdict::Limited(limited), false) = (&verdicts[0], allowed(&verdicts)) {
            assert_eq!(limited.decision.retry_after, 1_000_000, "at most a second");
        }
    }
    assert_eq!(
        calls,
        [true, true, false, true, false, true, true, true, true, false]
    );
}

#[tokio::test]
async fn a_concurrency_limit_takes_its_failure_mode_when_the_store_is_down() {
    let text = SLOTS.replace("max_hold: 10s", "max_hold: 10s, failure_mode: local");
    let rules = compile_one(&text);
    let limiter = limiter(Arc::new(Metrics::new()));
    let mut calls = Vec::new();
    for id in ["1", "2", "1"] {
        let verdicts = limiter
            .check(&rules, &slot_request("alice", id, false))
            .await
            .expect("local answers");
        calls.push(allowed(&verdicts));
    }
    // 2 slots shared by 2 replicas: 1 here, and the same slot again is admitted.
    assert_eq!(calls, [true, false, true]);
}

#[tokio::test]
async fn a_request_that_names_no_slot_holds_none() {
    let (rules, limiter, _) = on_memory(SLOTS, LimiterSettings::default());
    let mut calls = Vec::new();
    for (id, release) in [("", false), ("", true), ("1", false), ("", false)] {
        let verdicts = limiter
            .check(&rules, &slot_request("alice", id, release))
            .await
            .expect("answers");
        calls.push(allowed(&verdicts));
    }
    // No empty name shares a slot, and its release is never refused.
    assert_eq!(calls, [false, true, true, false]);
}
