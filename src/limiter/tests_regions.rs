//! Unit tests of how the limiter hands a global limit to the store and explains it.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::regions::{RegionPlan, RegionWeights};
use crate::rules::{ConfigFile, LoadOptions, Lookup};
use crate::store::memory::MemoryStore;

/// `text` compiled as one rule file by an instance of region `eu` whose peers are `ap`
/// and `us` (indexes 0, 1, 2).
fn compile_in_eu(text: &str) -> Rules {
    let file = ConfigFile {
        name: "t.yaml".into(),
        text: text.into(),
    };
    let options = LoadOptions {
        regions: Some(Arc::new(RegionPlan::new("eu", ["ap", "us"]).unwrap())),
        ..LoadOptions::default()
    };
    Rules::compile(&[file], &options).unwrap()
}

/// The sharing of each limit of the store check for `key=x`.
fn sharing_of(rules: &Rules, key: &str) -> Vec<Sharing> {
    let entries = [Entry { key, value: "x" }];
    let Lookup::Matched(matched) = rules.lookup("d", &entries, None) else {
        panic!("no match for {key}");
    };
    let check = store_check("d", &entries, &matched, 1);
    check.limits.iter().map(|limit| limit.sharing).collect()
}

#[test]
fn only_an_aggregate_limit_is_counted_across_regions() {
    let rules = compile_in_eu(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, \
         requests_per_unit: 100, scope: global, sharing: aggregate, weights: {ap: 1, eu: 3, \
         us: 1}}\n  - key: b\n    rate_limits:\n      - {unit: second, requests_per_unit: 100, \
         scope: global, sharing: split}\n      - {unit: day, requests_per_unit: 5000}\n",
    );
    let mut weights = RegionWeights::default();
    weights.0[..3].copy_from_slice(&[1, 3, 1]);
    assert_eq!(sharing_of(&rules, "a"), [Sharing::Aggregate(weights)]);
    assert_eq!(
        sharing_of(&rules, "b"),
        [Sharing::Regional, Sharing::Regional]
    );
}

#[test]
fn explain_shows_how_a_global_limit_is_shared_and_nothing_more_for_a_regional_one() {
    let rules = compile_in_eu(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, \
         requests_per_unit: 100, scope: global, sharing: split}\n  - key: b\n    \
         rate_limit: {unit: second, requests_per_unit: 100}\n",
    );
    let limit_json = |key: &str| {
        let request = CheckRequest {
            domain: "d",
            descriptors: vec![Descriptor {
                entries: vec![Entry { key, value: "x" }],
                limit_override: None,
                hits_addend: None,
                refund: false,
            }],
            hits_addend: 0,
        };
        let explained =
            futures::executor::block_on(explain::explain::<MemoryStore>(&rules, &request, None))
                .unwrap();
        serde_json::to_string(&explained[0].rule.as_ref().unwrap().limits[0]).unwrap()
    };
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&limit_json("a")).unwrap(),
        serde_json::json!({
            "requests_per_unit": 33,
            "unit": "second",
            "algorithm": "fixed_window",
            "burst": null,
            "failure_mode": "open",
            "on_over_limit": "refuse",
            "scope": "global",
            "sharing": "split",
            "global_limit": 100,
            "weights": {"ap": 1, "eu": 1, "us": 1},
        })
    );
    // Byte for byte as before regions: conformance tests compare it.
    assert_eq!(
        limit_json("b"),
        "{\"requests_per_unit\":100,\"unit\":\"second\",\"algorithm\":\"fixed_window\",\
         \"burst\":null,\"failure_mode\":\"open\",\"on_over_limit\":\"refuse\"}"
    );
}
