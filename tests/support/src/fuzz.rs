//! Fuzz harness bodies, shared by the cargo-fuzz targets (`fuzz/fuzz_targets/`) and the
//! corpus-replay smoke test (`tests/properties/fuzz_smoke.rs`): hostile bytes in, an
//! answer or an error out, never a panic.

use std::sync::{Arc, OnceLock};

use prost::Message;
use sluice::clock::{Clock, SystemClock};
use sluice::limiter::LimiterSettings;
use sluice::proto::rls::RateLimitRequest;
use sluice::rules::live::LiveRules;
use sluice::rules::{ConfigFile, LoadOptions, Rules};
use sluice::service::{HeaderMode, ResponseOptions, Service};
use sluice::store::memory::MemoryStore;
use sluice::telemetry::Metrics;

/// Rules the request target decides against: every algorithm, nesting, wildcard,
/// unlimited, shadow and quota rules.
pub const RULES: &str = r#"
domain: fuzz
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
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: path
        value: "/api/*"
        rate_limit: {unit: second, requests_per_unit: 100}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
"#;

/// Compiles arbitrary bytes as one rule file: must return rules or errors.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    let files = [ConfigFile {
        name: "fuzz.yaml".into(),
        text,
    }];
    for merge_domains in [false, true] {
        let _ = Rules::compile(&files, &LoadOptions { merge_domains });
    }
}

struct RequestRig {
    runtime: tokio::runtime::Runtime,
    service: Service<Arc<MemoryStore>>,
    _dir: tempfile::TempDir,
}

fn rig() -> &'static RequestRig {
    static RIG: OnceLock<RequestRig> = OnceLock::new();
    RIG.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("fuzz.yaml"), RULES).expect("write rules");
        let rules = Arc::new(LiveRules::new(dir.path(), LoadOptions::default()));
        let outcome = rules.reload();
        assert!(
            matches!(outcome, sluice::rules::live::ReloadOutcome::Loaded(_)),
            "fuzz rules do not load"
        );
        let clock: Arc<dyn Clock> = SystemClock::shared();
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(MemoryStore::new(10_000, clock.clone()));
        let service = Service::builder(store, rules)
            .clock(clock)
            .limiter_settings(LimiterSettings {
                near_limit_ratio: 0.8,
                stop_increment_when_over_limit: true,
                report_local_cache: false,
                replicas: 1,
            })
            .response(ResponseOptions {
                header_mode: HeaderMode::Reference,
                dynamic_metadata: true,
                ..ResponseOptions::default()
            })
            .metrics(metrics)
            .build();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        RequestRig {
            runtime,
            service,
            _dir: dir,
        }
    })
}

/// Decodes protobuf bytes as a `RateLimitRequest` and decides it with a memory store:
/// an answer or an error, never a panic. Returns whether the bytes decoded and were
/// answered (as opposed to refused with an error).
pub fn request(data: &[u8]) -> bool {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return false;
    };
    let rig = rig();
    rig.runtime
        .block_on(rig.service.should_rate_limit(&request))
        .is_ok()
}
