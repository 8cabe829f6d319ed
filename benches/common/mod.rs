//! Fixtures shared by the benches: generated rule sets and an in-process service.
#![allow(dead_code, missing_docs)]

use std::sync::Arc;

use sluice::clock::{Clock, ManualClock};
use sluice::rules::live::LiveRules;
use sluice::rules::{ConfigFile, LoadOptions, Rules};
use sluice::service::Service;
use sluice::store::memory::MemoryStore;
use sluice::telemetry::Metrics;

/// Whether criterion runs for real (`cargo bench`) rather than as a smoke test.
pub fn full_run() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

/// Rule counts to bench: the big one only for real runs, so `cargo test` stays quick.
pub fn rule_counts() -> Vec<usize> {
    if full_run() {
        vec![10, 1_000, 100_000]
    } else {
        vec![10, 1_000]
    }
}

/// YAML of domain `bench` with `rules` rules in groups of four, depth 1 to 4:
/// `k1=g<i>` → `k2=a` → `k3=p*` (wildcard) → `k4` (key only), each with a limit.
pub fn rules_yaml(rules: usize) -> String {
    let mut yaml = String::from("domain: bench\ndescriptors:\n");
    let limit = "rate_limit: {unit: second, requests_per_unit: 1000000000}";
    let mut left = rules;
    let mut group = 0;
    while left > 0 {
        yaml.push_str(&format!("  - key: k1\n    value: g{group}\n    {limit}\n"));
        if left > 1 {
            yaml.push_str(&format!(
                "    descriptors:\n      - key: k2\n        value: a\n        {limit}\n"
            ));
        }
        if left > 2 {
            yaml.push_str(&format!(
                "        descriptors:\n          - key: k3\n            value: p*\n            {limit}\n"
            ));
        }
        if left > 3 {
            yaml.push_str(&format!(
                "            descriptors:\n              - key: k4\n                {limit}\n"
            ));
        }
        left = left.saturating_sub(4);
        group += 1;
    }
    yaml
}

/// Compiled rules with `count` rules.
pub fn rules(count: usize) -> Rules {
    let file = ConfigFile {
        name: "bench.yaml".into(),
        text: rules_yaml(count),
    };
    Rules::compile(&[file], &LoadOptions::default()).expect("generated rules compile")
}

/// Group whose rules a lookup in a set of `count` rules should hit (the middle one).
pub fn middle_group(count: usize) -> usize {
    count.div_ceil(4) / 2
}

/// An in-process service over a memory store with `yaml` as its only rule file.
pub struct Fixture {
    pub service: Service<MemoryStore>,
    pub clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new(yaml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("rules.yaml"), yaml).expect("write rules");
        let rules = Arc::new(LiveRules::new(dir.path(), LoadOptions::default()));
        assert!(
            matches!(
                rules.reload(),
                sluice::rules::live::ReloadOutcome::Loaded(_)
            ),
            "rules load"
        );
        let clock = Arc::new(ManualClock::new(1_700_000_000_000_000));
        let dyn_clock: Arc<dyn Clock> = clock.clone();
        let metrics = Arc::new(Metrics::new());
        let store = MemoryStore::new(1_000_000, dyn_clock.clone());
        let service = Service::builder(store, rules)
            .clock(dyn_clock)
            .metrics(metrics)
            .build();
        Self {
            service,
            clock,
            _dir: dir,
        }
    }
}
