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
        let _ = Rules::compile(
            &files,
            &LoadOptions {
                merge_domains,
                regions: None,
            },
        );
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

/// Bytes read front to back by the structured harnesses; zeros once they run out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        first
    }

    fn word(&mut self) -> [u8; 8] {
        std::array::from_fn(|_| self.byte())
    }

    fn take(&mut self, most: usize) -> &[u8] {
        let (taken, rest) = self.0.split_at(most.min(self.0.len()));
        self.0 = rest;
        taken
    }
}

/// A Redis reply (RESP value tree) made from the input: every kind fred hands the
/// decoders, nested up to `depth` arrays.
fn reply_value(input: &mut Input<'_>, depth: u8) -> fred::types::Value {
    use fred::types::Value;
    match input.byte() % 8 {
        0 => Value::Null,
        1 => Value::from(i64::from_le_bytes(input.word())),
        2 => Value::from(f64::from_le_bytes(input.word())),
        3 => Value::from(input.byte() % 2 == 1),
        4 => {
            let len = usize::from(input.byte());
            Value::from(input.take(len))
        }
        5 => {
            let len = usize::from(input.byte());
            Value::from(String::from_utf8_lossy(input.take(len)).into_owned())
        }
        // The script's own shape: a string of five doubles per limit.
        6 => {
            let limits = usize::from(input.byte() % 4);
            Value::from(input.take(limits * 40))
        }
        _ if depth > 0 => {
            let len = usize::from(input.byte() % 10);
            Value::Array((0..len).map(|_| reply_value(input, depth - 1)).collect())
        }
        _ => Value::Array(Vec::new()),
    }
}

/// Bytes → a Redis reply and an error reply → every Redis reply decoder
/// (`sluice::fuzzing::redis_reply`): never a panic.
pub fn redis_reply(data: &[u8]) {
    let mut input = Input(data);
    let limits = usize::from(input.byte() % 4);
    let error_len = usize::from(input.byte());
    let error = String::from_utf8_lossy(input.take(error_len)).into_owned();
    let reply = reply_value(&mut input, 3);
    sluice::fuzzing::redis_reply(&reply, limits, &error);
}

/// Bytes → one xDS resource (a `RateLimitConfig`, protobuf; a first byte of 0xff gives
/// it a wrong type) → rule files → rules: the number of rules, or why not.
pub fn xds(data: &[u8]) -> Result<usize, String> {
    let (type_url, value) = match data.split_first() {
        Some((0xff, rest)) => ("type.googleapis.com/google.protobuf.Empty", rest),
        _ => (sluice::xds::TYPE_URL, data),
    };
    let resource = prost_types::Any {
        type_url: type_url.into(),
        value: value.to_vec(),
    };
    sluice::fuzzing::xds_resources(&[resource])
}

/// Bytes → a `POST /json` body → a request, decided as [`request`] decides one:
/// whether it parsed and was answered.
pub fn json(data: &[u8]) -> bool {
    match sluice::fuzzing::json_request(data) {
        Ok(parsed) => request(&parsed.encode_to_vec()),
        Err(_) => false,
    }
}
