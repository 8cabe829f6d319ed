//! Unit tests of `scope`, `sharing` and `weights`: limits shared between regions.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::regions::{RegionPlan, RegionWeights};

/// The regions of every test with a plan: `ap`, `eu` and `us` (indexes 0, 1, 2).
const REGIONS: [&str; 3] = ["ap", "eu", "us"];

/// Compiles one file for an instance of region `local` (none: no plan).
fn compile_in(text: &str, local: Option<&str>) -> Result<Rules, Vec<ConfigError>> {
    let files = [ConfigFile {
        name: "t.yaml".into(),
        text: text.into(),
    }];
    let regions = local.map(|local| {
        let peers = REGIONS.iter().copied().filter(|peer| *peer != local);
        Arc::new(RegionPlan::new(local, peers).unwrap())
    });
    let options = LoadOptions {
        regions,
        ..LoadOptions::default()
    };
    Rules::compile(&files, &options)
}

/// A file with one descriptor `a` limited by `rate_limit`.
fn file_with(rate_limit: &str) -> String {
    format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {rate_limit}\n")
}

/// The limit of descriptor `a` as region `local` compiles it.
fn limit_in(rate_limit: &str, local: Option<&str>) -> Limit {
    let rules = compile_in(&file_with(rate_limit), local).unwrap();
    let rule = rules.rules().next().unwrap();
    rule.limits[0].clone()
}

/// The errors of loading `rate_limit` in region `local` (none: no plan), one string.
fn errors_in(rate_limit: &str, local: Option<&str>) -> String {
    match compile_in(&file_with(rate_limit), local) {
        Ok(_) => String::new(),
        Err(errors) => errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// Weights of the three test regions, in plan order.
fn weights(ap: u16, eu: u16, us: u16) -> RegionWeights {
    let mut weights = RegionWeights::default();
    weights.0[..3].copy_from_slice(&[ap, eu, us]);
    weights
}

#[test]
fn a_split_limit_is_this_regions_share_by_sorted_name() {
    let rate_limit = "{unit: second, requests_per_unit: 100, scope: global, sharing: split}";
    let shares: Vec<u32> = REGIONS
        .iter()
        .map(|local| limit_in(rate_limit, Some(local)).requests_per_unit)
        .collect();
    assert_eq!(shares, [34, 33, 33]);
    assert_eq!(
        limit_in(rate_limit, Some("eu")).scope,
        Scope::Split {
            global_limit: 100,
            global_burst: None,
            weights: weights(1, 1, 1),
        }
    );
}

#[test]
fn weights_set_the_shares() {
    let rate_limit = "{unit: second, requests_per_unit: 100, scope: global, sharing: split, \
                      weights: {us: 2, eu: 1, ap: 1}}";
    let shares: Vec<u32> = REGIONS
        .iter()
        .map(|local| limit_in(rate_limit, Some(local)).requests_per_unit)
        .collect();
    assert_eq!(shares, [25, 25, 50]);
}

#[test]
fn burst_and_max_in_flight_are_split_too() {
    let rate_limit = "{unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 30, \
                      scope: global, sharing: split}";
    let ap = limit_in(rate_limit, Some("ap"));
    assert_eq!((ap.requests_per_unit, ap.burst), (4, Some(10)));
    let us = limit_in(rate_limit, Some("us"));
    assert_eq!((us.requests_per_unit, us.burst), (3, Some(10)));
    let text = "domain: d\ndescriptors:\n  - key: id\n    slot: true\n    rate_limit: \
                {algorithm: concurrency, max_in_flight: 7, scope: global, sharing: split}\n";
    let rules = compile_in(text, Some("ap")).unwrap();
    let limit = &rules.rules().next().unwrap().limits[0];
    assert_eq!(limit.requests_per_unit, 3);
    assert!(matches!(
        limit.scope,
        Scope::Split {
            global_limit: 7,
            ..
        }
    ));
}

#[test]
fn without_a_plan_a_global_limit_is_whole() {
    let split = limit_in(
        "{unit: second, requests_per_unit: 100, algorithm: gcra, burst: 20, scope: global, \
         sharing: split, weights: {us: 2, eu: 1}}",
        None,
    );
    assert_eq!((split.requests_per_unit, split.burst), (100, Some(20)));
    assert_eq!(
        split.scope,
        Scope::Split {
            global_limit: 100,
            global_burst: Some(20),
            weights: RegionWeights([1, 0, 0, 0, 0, 0, 0, 0]),
        }
    );
    let aggregate = limit_in(
        "{unit: minute, requests_per_unit: 100, scope: global, sharing: aggregate}",
        None,
    );
    assert_eq!(aggregate.requests_per_unit, 100);
    assert_eq!(
        aggregate.scope,
        Scope::Aggregate {
            weights: RegionWeights([1, 0, 0, 0, 0, 0, 0, 0]),
        }
    );
}

#[test]
fn a_request_override_is_regional() {
    let rules = compile_in(
        &file_with("{unit: second, requests_per_unit: 100, scope: global, sharing: aggregate}"),
        Some("eu"),
    )
    .unwrap();
    let limit = LimitOverride {
        requests_per_unit: 7,
        unit: Unit::Minute,
    };
    let Lookup::Matched(matched) = rules.lookup(
        "d",
        &[Entry {
            key: "a",
            value: "x",
        }],
        Some(limit),
    ) else {
        panic!("no match");
    };
    assert_eq!(matched.rule.limits[0].scope, Scope::Regional);
}

#[test]
fn a_regional_rule_file_compiles_as_before() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, \
                requests_per_unit: 10}\n  - key: b\n    rate_limit: {unit: minute, \
                requests_per_unit: 5, algorithm: token_bucket, burst: 9, scope: regional}\n";
    let without = compile_in(text, None).unwrap();
    let with = compile_in(text, Some("us")).unwrap();
    assert!(without.rules().eq(with.rules()));
    assert!(with
        .rules()
        .all(|rule| rule.limits[0].scope == Scope::Regional));
    assert_eq!(
        with.dump_lines(),
        [
            "d.a: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false",
            "d.b: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false, \
             limits: [5/MINUTE token_bucket burst=9 failure_mode=open]",
        ]
    );
}

#[test]
fn bad_scopes_are_refused_with_the_path() {
    let cases = [
        (
            "{unit: second, requests_per_unit: 5, scope: world}",
            "rate_limit.scope: unknown scope 'world' (expected regional or global)",
        ),
        (
            "{unit: second, requests_per_unit: 5, scope: global}",
            "rate_limit.sharing: scope: global needs sharing: split",
        ),
        (
            "{unit: second, requests_per_unit: 5, scope: global, sharing: evenly}",
            "rate_limit.sharing: unknown sharing 'evenly' (expected split or aggregate)",
        ),
        (
            "{unit: second, requests_per_unit: 5, sharing: split}",
            "rate_limit.sharing: sharing needs scope: global",
        ),
        (
            "{unit: second, requests_per_unit: 5, scope: regional, weights: {eu: 1}}",
            "rate_limit.weights: weights needs scope: global",
        ),
        (
            "{unlimited: true, scope: global, sharing: split}",
            "rate_limit.scope: scope does not apply to unlimited",
        ),
    ];
    for (rate_limit, expected) in cases {
        let found = errors_in(rate_limit, Some("eu"));
        assert!(found.contains(expected), "{rate_limit}: {found}");
    }
}

#[test]
fn weights_must_name_every_region_of_the_plan() {
    let global = "unit: second, requests_per_unit: 100, scope: global, sharing: split";
    let cases = [
        (
            "weights: {ap: 1, eu: 1, us: 1, sa: 1}",
            "rate_limit.weights: region \"sa\" is not one of the regions (ap, eu, us)",
        ),
        (
            "weights: {eu: 1}",
            "rate_limit.weights: weights leave out region \"ap\", \"us\": every region needs \
             a weight",
        ),
        (
            "weights: {ap: 1, eu: 0, us: 1}",
            "rate_limit.weights: the weight of region \"eu\" must be from 1 to 1000, got 0",
        ),
        (
            "weights: {ap: 1, eu: 1001, us: 1}",
            "the weight of region \"eu\" must be from 1 to 1000, got 1001",
        ),
    ];
    for (weights, expected) in cases {
        let rate_limit = format!("{{{global}, {weights}}}");
        let found = errors_in(&rate_limit, Some("eu"));
        assert!(found.contains(expected), "{weights}: {found}");
    }
    // Without a plan, names are only checked to be region names.
    assert_eq!(
        errors_in(&format!("{{{global}, weights: {{anywhere: 3}}}}"), None),
        ""
    );
    let found = errors_in(&format!("{{{global}, weights: {{EU: 1}}}}"), None);
    assert!(
        found.contains("rate_limit.weights: region name \"EU\" must be 1 to 32 characters"),
        "{found}"
    );
}

#[test]
fn every_region_must_get_a_share() {
    let found = errors_in(
        "{unit: second, requests_per_unit: 2, scope: global, sharing: split}",
        Some("us"),
    );
    assert!(
        found.contains(
            "rate_limit.requests_per_unit: requests_per_unit 2 split by weights leaves region \
             \"us\" a share of 0"
        ),
        "{found}"
    );
    let found = errors_in(
        "{unit: second, requests_per_unit: 30, algorithm: token_bucket, burst: 2, \
         scope: global, sharing: split, weights: {ap: 1, eu: 1, us: 1}}",
        Some("ap"),
    );
    assert!(
        found.contains("rate_limit.burst: burst 2 split by weights leaves region \"us\""),
        "{found}"
    );
    let found = errors_in(
        "{unit: second, requests_per_unit: 30, lease: 20, scope: global, sharing: split}",
        Some("ap"),
    );
    assert!(
        found.contains(
            "rate_limit.lease: a lease of 20 units can never be granted by this region's \
             share of 10"
        ),
        "{found}"
    );
}

#[test]
fn aggregate_needs_a_window_count_the_store_keeps() {
    let cases = [
        (
            "algorithm: token_bucket",
            "sharing: aggregate needs fixed_window or sliding_window: their usage is a count \
             per aligned window that another region's can be added to; use sharing: split for \
             token_bucket",
        ),
        (
            "algorithm: sliding_log",
            "sharing: aggregate needs fixed_window or sliding_window",
        ),
        (
            "lease: 5",
            "sharing: aggregate cannot be combined with lease: a lease is taken from this \
             region's count alone",
        ),
        (
            "on_over_limit: charge",
            "sharing: aggregate cannot be combined with on_over_limit: charge",
        ),
        (
            "algorithm: sliding_log, max_delay: 1s",
            "sharing: aggregate cannot be combined with max_delay",
        ),
    ];
    for (fields, expected) in cases {
        let rate_limit = format!(
            "{{unit: second, requests_per_unit: 50, scope: global, sharing: aggregate, {fields}}}"
        );
        let found = errors_in(&rate_limit, Some("eu"));
        assert!(
            found.contains(&format!("rate_limit.sharing: {expected}")),
            "{fields}: {found}"
        );
    }
    assert_eq!(
        errors_in(
            "{unit: second, requests_per_unit: 50, scope: global, sharing: aggregate, \
             lease: off}",
            Some("eu")
        ),
        ""
    );
    let text = "domain: d\ndescriptors:\n  - key: id\n    slot: true\n    rate_limit: \
                {algorithm: concurrency, max_in_flight: 7, scope: global, sharing: aggregate}\n";
    let found = match compile_in(text, Some("eu")) {
        Ok(_) => String::new(),
        Err(errors) => errors[0].to_string(),
    };
    assert!(
        found.contains("use sharing: split for concurrency"),
        "{found}"
    );
}

#[test]
fn an_aggregate_limit_stays_whole_and_shows_its_weights() {
    let rate_limit = "{unit: minute, requests_per_unit: 100, algorithm: sliding_window, \
                      scope: global, sharing: aggregate, weights: {ap: 1, eu: 3, us: 1}}";
    let limit = limit_in(rate_limit, Some("eu"));
    assert_eq!(limit.requests_per_unit, 100);
    assert_eq!(
        limit.scope,
        Scope::Aggregate {
            weights: weights(1, 3, 1)
        }
    );
    let rules = compile_in(&file_with(rate_limit), Some("eu")).unwrap();
    assert_eq!(
        rules.dump_lines(),
        [
            "d.a: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, \
          limits: [100/MINUTE sliding_window failure_mode=open global aggregate \
          (weights ap=1,eu=3,us=1)]"
        ]
    );
}

#[test]
fn rlconfig_shows_a_split_limits_share_and_global_numbers() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, \
                requests_per_unit: 100, scope: global, sharing: split}\n      - {unit: day, \
                requests_per_unit: 5000, scope: regional}\n";
    assert_eq!(
        compile_in(text, Some("ap")).unwrap().dump_lines(),
        [
            "d.a: unit=SECOND requests_per_unit=34, shadow_mode: false, quota_mode: false, \
          limits: [34/SECOND fixed_window failure_mode=open global split of 100 \
          (weights ap=1,eu=1,us=1), 5000/DAY fixed_window failure_mode=open]"
        ]
    );
    assert_eq!(
        compile_in(text, None).unwrap().dump_lines(),
        [
            "d.a: unit=SECOND requests_per_unit=100, shadow_mode: false, quota_mode: false, \
          limits: [100/SECOND fixed_window failure_mode=open global split of 100, \
          5000/DAY fixed_window failure_mode=open]"
        ]
    );
}
