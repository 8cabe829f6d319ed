//! The local hot-key layers replayed against the store (DESIGN §6, layers 1 and 2).
//!
//! Two limiters ("instances") share one memory store and one manual clock, with the
//! pre-check forced on. Random traffic (costs 1 to 3, random time steps, random
//! instance) drives keys of every algorithm far over their limits. Before every call the
//! store is peeked for the same key and cost at the same instant; whenever a local layer
//! answers (the blocked-until cache or the pre-check), the store must refuse too, and so
//! must the answer. Layers never admit, so "never answers differently" is exactly this.

use std::sync::Arc;

use sluice::algorithm::Decision;
use sluice::clock::ManualClock;
use sluice::limiter::{store_check, CheckRequest, Descriptor, Limiter, LimiterSettings, Verdict};
use sluice::rules::{ConfigFile, Entry, LoadOptions, Lookup, Rules};
use sluice::store::memory::MemoryStore;
use sluice::store::Store;
use sluice::telemetry::{LayerLabel, Metrics};

const ALGORITHMS: [&str; 5] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "gcra",
];

fn rules() -> Rules {
    let mut yaml = String::from("domain: h\ndescriptors:\n");
    for algorithm in ALGORITHMS {
        yaml.push_str(&format!(
            "  - key: {algorithm}\n    rate_limit: {{unit: second, requests_per_unit: 6, algorithm: {algorithm}}}\n"
        ));
        yaml.push_str(&format!(
            "  - key: two_{algorithm}\n    rate_limits:\n      - {{unit: second, requests_per_unit: 8, algorithm: {algorithm}}}\n      - {{unit: minute, requests_per_unit: 40, algorithm: {algorithm}}}\n"
        ));
    }
    let file = ConfigFile {
        name: "h.yaml".into(),
        text: yaml,
    };
    Rules::compile(&[file], &LoadOptions::default()).expect("rules compile")
}

/// xorshift64*: deterministic, dependency-free randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % below
    }
}

fn layer_count(metrics: &Metrics, layer: &'static str) -> u64 {
    metrics
        .local_decisions
        .get_or_create(&LayerLabel { layer })
        .get()
}

fn local_count(metrics: &Metrics) -> u64 {
    layer_count(metrics, "blocked_cache") + layer_count(metrics, "precheck")
}

fn allowed(verdict: &Verdict<'_>) -> bool {
    match verdict {
        Verdict::Limited(limited) => !limited.over_limit,
        other => panic!("not limited: {other:?}"),
    }
}

#[tokio::test]
async fn local_layers_only_refuse_what_the_store_refuses() {
    let rules = rules();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000));
    let store = Arc::new(MemoryStore::new(10_000, clock.clone()));
    let instances: Vec<(Limiter<Arc<MemoryStore>>, Arc<Metrics>)> = (0..2)
        .map(|_| {
            let metrics = Arc::new(Metrics::new());
            let limiter = Limiter::new(
                store.clone(),
                clock.clone(),
                LimiterSettings::default(),
                metrics.clone(),
            )
            .with_precheck(true);
            (limiter, metrics)
        })
        .collect();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for key in ALGORITHMS
        .iter()
        .map(|a| a.to_string())
        .chain(ALGORITHMS.iter().map(|a| format!("two_{a}")))
    {
        let (mut local, mut store_refused) = (0, 0);
        for _ in 0..3_000 {
            // Mostly small steps (about 40 calls a second: the keys are hot), traffic
            // far above the limit, with pauses now and then.
            let step = match rng.next(50) {
                0 => rng.next(1_500_000),
                _ => rng.next(20_000),
            };
            clock.advance(step);
            let cost = 1 + rng.next(3);
            let entries = [Entry {
                key: &key,
                value: "v",
            }];
            let Lookup::Matched(matched) = rules.lookup("h", &entries, None) else {
                panic!("{key} matches");
            };
            let check = store_check("h", &entries, &matched, cost);
            let mut peeked: Vec<Decision> = Vec::new();
            store.peek(&check, &mut peeked).await.expect("peek");
            let store_admits = peeked.iter().all(|d| d.allowed);

            let (limiter, metrics) = &instances[rng.next(2) as usize];
            let before = local_count(metrics);
            let request = CheckRequest {
                domain: "h",
                descriptors: vec![Descriptor {
                    entries: entries.to_vec(),
                    limit_override: None,
                    hits_addend: Some(cost),
                    refund: false,
                }],
                hits_addend: 0,
            };
            let verdicts = limiter.check(&rules, &request).await.expect("check");
            let answered_locally = local_count(metrics) > before;
            if answered_locally {
                local += 1;
                assert!(
                    !store_admits,
                    "{key}: a local layer refused cost {cost} at {} that the store admits",
                    clock_now(&clock)
                );
                assert!(!allowed(&verdicts[0]), "{key}: local answers refuse");
            } else {
                assert_eq!(
                    allowed(&verdicts[0]),
                    store_admits,
                    "{key}: the store's answer at the same instant"
                );
            }
            store_refused += usize::from(!store_admits);
        }
        println!("{key}: {store_refused} refusals, {local} answered locally");
        assert!(
            local > 100,
            "{key}: the local layers were exercised ({local})"
        );
    }
    let prechecked: u64 = instances
        .iter()
        .map(|(_, metrics)| layer_count(metrics, "precheck"))
        .sum();
    println!("pre-check refusals: {prechecked}");
    assert!(
        prechecked > 100,
        "the pre-check was exercised ({prechecked})"
    );
}

fn clock_now(clock: &ManualClock) -> u64 {
    use sluice::clock::Clock;
    clock.now()
}
