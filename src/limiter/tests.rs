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
    let file = ConfigFile {
        name: "d.yaml".into(),
        text: RULES.into(),
    };
    Rules::compile(&[file], &LoadOptions::default()).expect("rules compile")
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
    let mut local = Vec::new();
    for _ in 0..3 {
        let verdicts = limiter
            .check(&rules, &request("local"))
            .await
            .expect("local answers");
        local.push(allowed(&verdicts));
    }
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
