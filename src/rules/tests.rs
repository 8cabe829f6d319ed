//! Unit tests of rule loading and matching.
#![allow(clippy::unwrap_used)]

use super::index::wildcard_match;
use super::*;

fn compile(text: &str) -> Result<Rules, Vec<ConfigError>> {
    let files = [ConfigFile {
        name: "t.yaml".into(),
        text: text.into(),
    }];
    Rules::compile(&files, &LoadOptions::default())
}

fn errors(text: &str) -> Vec<String> {
    match compile(text) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

fn entries<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<Entry<'a>> {
    pairs
        .iter()
        .map(|&(key, value)| Entry { key, value })
        .collect()
}

fn stats_key(rules: &Rules, pairs: &[(&str, &str)]) -> Option<String> {
    match rules.lookup("d", &entries(pairs), None) {
        Lookup::Matched(m) => Some(m.stats_key.into_owned()),
        _ => None,
    }
}

#[test]
fn wildcard_patterns() {
    assert!(wildcard_match("foo*", "foo"));
    assert!(wildcard_match("foo*", "foobar"));
    assert!(!wildcard_match("foo*", "fo"));
    assert!(wildcard_match("bar*b", "barab"));
    assert!(wildcard_match("bar*b", "barb"));
    assert!(!wildcard_match("bar*b", "bar"));
    assert!(wildcard_match("svc*ep*rpc", "svceprpc"));
    assert!(wildcard_match("svc*ep*rpc", "svcXepYrpc"));
    assert!(!wildcard_match("foo*bar*baz", "foo123baz"));
    assert!(wildcard_match("*", ""));
    assert!(wildcard_match("*x", "aax"));
    assert!(!wildcard_match("abc", "abcd"));
}

const ORDER: &str = "
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: a*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: abc
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: p
    value: x
    descriptors:
      - key: q
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: p
    rate_limit: {unit: second, requests_per_unit: 6}
    descriptors:
      - key: r
        rate_limit: {unit: second, requests_per_unit: 7}
";

fn limit_of(rules: &Rules, pairs: &[(&str, &str)]) -> Option<u32> {
    match rules.lookup("d", &entries(pairs), None) {
        Lookup::Matched(m) => Some(m.rule.limits[0].requests_per_unit),
        _ => None,
    }
}

#[test]
fn exact_then_wildcards_in_order_then_key_only() {
    let rules = compile(ORDER).unwrap();
    assert_eq!(limit_of(&rules, &[("k", "abc")]), Some(4));
    assert_eq!(
        limit_of(&rules, &[("k", "abd")]),
        Some(2),
        "first wildcard wins"
    );
    assert_eq!(limit_of(&rules, &[("k", "zzz")]), Some(1));
    assert_eq!(limit_of(&rules, &[("other", "zzz")]), None);
    assert_eq!(rules.rule_count(), 7);
}

#[test]
fn no_backtracking_and_limit_only_at_last_entry() {
    let rules = compile(ORDER).unwrap();
    assert_eq!(limit_of(&rules, &[("p", "x"), ("q", "1")]), Some(5));
    // p=x matched exactly; its children have no `r`: no fallback to key-only `p`.
    assert_eq!(limit_of(&rules, &[("p", "x"), ("r", "1")]), None);
    assert_eq!(limit_of(&rules, &[("p", "y"), ("r", "1")]), Some(7));
    assert_eq!(limit_of(&rules, &[("p", "y")]), Some(6));
    // More entries than config depth: nothing applies.
    assert_eq!(limit_of(&rules, &[("k", "abc"), ("z", "1")]), None);
    assert_eq!(limit_of(&rules, &[]), None);
}

#[test]
fn common_lookup_borrows() {
    let rules = compile(ORDER).unwrap();
    let Lookup::Matched(m) = rules.lookup("d", &entries(&[("k", "abd")]), None) else {
        panic!("no match");
    };
    assert!(matches!(m.rule, RuleRef::Borrowed(_)));
    assert!(matches!(m.stats_key, std::borrow::Cow::Borrowed("d.k_a*")));
    assert_eq!(m.share_patterns.capacity(), 0);
    assert_eq!(&*m.rule.config_path, "t.yaml: descriptors[1]");
}

#[test]
fn unknown_domain_and_override() {
    let rules = compile(ORDER).unwrap();
    assert_eq!(rules.lookup("x", &[], None), Lookup::UnknownDomain);
    let limit = LimitOverride {
        requests_per_unit: 9,
        unit: Unit::Hour,
    };
    assert_eq!(rules.lookup("x", &[], Some(limit)), Lookup::UnknownDomain);
    let Lookup::Matched(m) = rules.lookup("d", &entries(&[("p", ""), ("q", "v")]), Some(limit))
    else {
        panic!("no match");
    };
    assert_eq!(m.stats_key, "d.p.q_v");
    assert_eq!(m.rule.limits[0].requests_per_unit, 9);
    assert!(m.rule.name.is_none() && !m.rule.shadow_mode);
}

#[test]
fn extensions_compile() {
    let rules = compile(
        "
domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20, failure_mode: closed}
    descriptors:
      - key: plan
        value: free
        rate_limits:
          - {unit: second, requests_per_unit: 5, algorithm: gcra, burst: 10, name: free}
          - {unit: day, requests_per_unit: 10000}
",
    )
    .unwrap();
    let all: Vec<&Rule> = rules.rules().collect();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].limits[0].burst, Some(20));
    assert_eq!(all[0].limits[0].failure_mode, FailureMode::Closed);
    assert_eq!(all[1].limits.len(), 2);
    assert_eq!(all[1].name.as_deref(), Some("free"));
    assert_eq!(
        all[1].limits[1].algorithm,
        crate::algorithm::AlgorithmKind::FixedWindow
    );
    assert_eq!(
        rules.dump_lines()[1],
        "d.api_key.plan_free: unit=SECOND requests_per_unit=5, shadow_mode: false, \
         quota_mode: false, limits: [5/SECOND gcra burst=10 failure_mode=open, \
         10000/DAY fixed_window failure_mode=open]"
    );
}

#[test]
fn extension_errors_name_the_path() {
    let e = errors(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n",
    );
    assert_eq!(
        e,
        ["t.yaml: descriptors[0].rate_limit.burst: burst is only valid with algorithm token_bucket or gcra, not fixed_window"]
    );
    let e = errors(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: []\n",
    );
    assert_eq!(
        e,
        ["t.yaml: descriptors[0]: rate_limit and rate_limits cannot both be given"]
    );
    let e = errors(
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limits:\n          - {unit: minute, requests_per_unit: 20000, algorithm: sliding_log}\n          - {unit: hour, requests_per_unit: 1, algorithm: leaky, failure_mode: maybe}\n",
    );
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(e[0]
        .contains("descriptors[0].descriptors[0].rate_limits[0].requests_per_unit: sliding_log"));
    assert!(e[1].contains("rate_limits[1].algorithm: unknown algorithm 'leaky'"));
    assert!(e[2].contains("rate_limits[1].failure_mode: unknown failure_mode 'maybe'"));
    let e = errors("domain: d\ndescriptors:\n  - key: a\n    rate_limits: []\n");
    assert!(e[0].contains("rate_limits must list at least one limit"));
}

#[test]
fn depth_cap() {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for depth in 0..=super::compile::MAX_DEPTH {
        let indent = "  ".repeat(2 * depth);
        text.push_str(&format!(
            "{indent}- key: k{depth}\n{indent}  descriptors:\n"
        ));
    }
    let e = errors(&text);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("nested deeper than 32 levels"), "{e:?}");
    // 32 levels are fine.
    let cut = text.rfind("- key: k32").unwrap();
    assert!(compile(&text[..cut]).is_ok());
}

#[test]
fn reference_checks_collect_all_errors() {
    let e = errors(
        "domain: d\ndescriptors:\n  - value: v\n  - key: a\n  - key: a\n  - key: b\n    rate_limit: {unit: fortnight}\n",
    );
    assert_eq!(
        e,
        [
            "t.yaml: descriptor has empty key",
            "t.yaml: duplicate descriptor composite key 'd.a'",
            "t.yaml: invalid rate limit unit 'fortnight'",
        ]
    );
    // The reference's composite key collision is a duplicate too.
    let e = errors("domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n");
    assert_eq!(e, ["t.yaml: duplicate descriptor composite key 'd.a_b'"]);
    assert_eq!(
        errors("domain: d\nfoo: 1\n"),
        ["t.yaml: config error, unknown key 'foo'"]
    );
    assert_eq!(errors("domain: d\nx: 1.5\n").len(), 1);
    assert!(errors("- a\n")[0].starts_with("t.yaml: error loading config file: "));
}

#[test]
fn scalars_read_as_strings_and_metadata_is_free_form() {
    let rules = compile(
        "domain: 7\ndescriptors:\n  - key: k\n    value: 123\n    metadata: {any_key: [1, 2.5]}\n    rate_limit: {unit: Second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let Lookup::Matched(m) = rules.lookup("7", &entries(&[("k", "123")]), None) else {
        panic!("no match");
    };
    assert_eq!(
        m.rule.metadata.as_deref(),
        Some(&serde_json::json!({"any_key": [1, 2.5]}))
    );
}

#[test]
fn value_to_metric_and_detailed_keys() {
    let rules = compile(
        "domain: d\ndescriptors:\n  - key: a\n    value: x*\n    value_to_metric: true\n    descriptors:\n      - key: b\n        detailed_metric: true\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    assert_eq!(
        stats_key(&rules, &[("a", "x1"), ("b", "")]).as_deref(),
        Some("d.a_x1.b_")
    );
}

#[test]
fn read_config_path_skips_hidden_and_follows_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("..2024_01_01/sub")).unwrap();
    std::fs::write(root.join("..2024_01_01/rules.yaml"), "domain: a\n").unwrap();
    std::fs::write(root.join("..2024_01_01/sub/more.yml"), "domain: b\n").unwrap();
    std::os::unix::fs::symlink("..2024_01_01", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/rules.yaml", root.join("rules.yaml")).unwrap();
    std::os::unix::fs::symlink("..data/sub", root.join("sub")).unwrap();
    std::os::unix::fs::symlink(".", root.join("sub2")).unwrap_or(());
    std::fs::write(root.join(".hidden.yaml"), "domain: c\n").unwrap();
    std::fs::write(root.join("notes.txt"), "x").unwrap();
    // A second link to a file read already: read once, under its first name.
    std::os::unix::fs::symlink("sub/more.yml", root.join("z-link.yaml")).unwrap();
    let files = read_config_path(root).unwrap();
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    // `sub2 -> .` is a loop: not entered again.
    assert_eq!(names, ["rules.yaml", "sub/more.yml"]);
    let one = read_config_path(&root.join("rules.yaml")).unwrap();
    assert_eq!(one[0].name, "rules.yaml");
    let err = read_config_path(&root.join("missing")).unwrap_err();
    assert!(err.to_string().contains("missing"));
}

#[test]
fn rules_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Rules>();
}

#[test]
fn yaml_bomb_is_refused() {
    let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..9 {
        let prev = if level == 1 {
            "a".to_owned()
        } else {
            format!("a{}", level - 1)
        };
        text.push_str(&format!(
            "a{level}: &a{level} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
    }
    let e = errors(&text);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("t.yaml: error loading config file: "),
        "{e:?}"
    );
}

#[test]
fn merged_domains_still_reject_duplicate_keys() {
    let file = |name: &str, text: &str| ConfigFile {
        name: name.into(),
        text: text.into(),
    };
    let files = [
        file("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
        file("b.yaml", "domain: d\ndescriptors:\n  - key: k\n"),
    ];
    let merge = LoadOptions {
        merge_domains: true,
        regions: None,
    };
    let e = Rules::compile(&files, &merge).unwrap_err();
    assert_eq!(
        e[0].to_string(),
        "b.yaml: duplicate descriptor composite key 'd.k'"
    );
    let e = Rules::compile(&files, &LoadOptions::default()).unwrap_err();
    assert_eq!(
        e[0].to_string(),
        "b.yaml: duplicate domain 'd' in config file"
    );
}

#[test]
fn lease_compiles_and_is_validated() {
    let rules = compile(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, lease: 10, lease_ttl: 100ms}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 100, lease: auto}\n",
    )
    .unwrap();
    let lease_of = |key: &str| match rules.lookup("d", &entries(&[(key, "v")]), None) {
        Lookup::Matched(m) => m.rule.limits[0].lease,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        lease_of("a"),
        Lease {
            mode: LeaseMode::Units(10),
            ttl: 100_000
        }
    );
    assert_eq!(lease_of("b").mode, LeaseMode::Auto);
    assert_eq!(lease_of("b").ttl, DEFAULT_LEASE_TTL_MICROS);
    assert!(rules
        .dump_lines()
        .iter()
        .any(|l| l.contains("lease=10 lease_ttl=100ms")));
    // The default lease_ttl is not repeated.
    assert!(rules.dump_lines().iter().any(|l| l.contains("lease=auto]")));

    let cases = [
        (
            "{unit: second, requests_per_unit: 5, lease: 0}",
            "lease must be off, auto or a number of units ≥ 1, got '0'",
        ),
        (
            "{unit: second, requests_per_unit: 5, lease: many}",
            "got 'many'",
        ),
        (
            "{unit: second, requests_per_unit: 5, lease: 6}",
            "a lease of 6 units can never be granted by a limit of 5",
        ),
        (
            "{unit: second, requests_per_unit: 5, algorithm: sliding_log, lease: 2}",
            "sliding_log cannot lease",
        ),
        (
            "{unit: second, requests_per_unit: 5, lease: 2, lease_ttl: 2m}",
            "lease_ttl must be a duration from 1ms to 60s",
        ),
        (
            "{unit: second, requests_per_unit: 5, lease_ttl: 20ms}",
            "lease_ttl needs lease",
        ),
    ];
    assert_limit_errors(&cases, "descriptors[0].rate_limit.lease");
    let several = errors(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 5, lease: 2}\n",
    );
    assert!(
        several
            .iter()
            .any(|e| e.contains("lease is only supported on a single rate_limit")),
        "{several:?}"
    );
}

/// Zero-prefixed numbers read as yaml.v2 (the reference) reads them: `0123` is an octal
/// integer, so a value loads as its text and a limit as its octal number; `0800` is
/// no octal integer but a float there, which its key check refuses.
#[test]
fn zero_prefixed_numbers_load_as_in_the_reference() {
    let rules = compile("domain: d\ndescriptors:\n  - key: zip\n    value: 0123\n    rate_limit: {unit: hour, requests_per_unit: 010}\n").unwrap();
    let Lookup::Matched(matched) = rules.lookup("d", &entries(&[("zip", "0123")]), None) else {
        panic!("the value is the text 0123");
    };
    assert_eq!(matched.rule.limits[0].requests_per_unit, 8);
    for value in ["0800", "08"] {
        let text = format!("domain: d\ndescriptors:\n  - key: zip\n    value: {value}\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n");
        assert_eq!(
            errors(&text),
            vec!["t.yaml: error checking config"],
            "{value}"
        );
    }
}

#[test]
fn on_over_limit_compiles_shows_and_is_validated() {
    let rules = compile(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket, on_over_limit: charge}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 100, on_over_limit: refuse}\n",
    )
    .expect("compiles");
    let mode_of = |key: &str| match rules.lookup("d", &entries(&[(key, "v")]), None) {
        Lookup::Matched(m) => m.rule.limits[0].quota().on_over_limit,
        _ => panic!("no match"),
    };
    assert_eq!(mode_of("a"), crate::algorithm::OnOverLimit::Charge);
    assert_eq!(mode_of("b"), crate::algorithm::OnOverLimit::Refuse);
    let lines = rules.dump_lines();
    assert!(
        lines.iter().any(|l| l.contains("on_over_limit=charge")),
        "{lines:?}"
    );
    // The default is not shown: a reference rule's line stays the reference's.
    assert!(!lines.iter().any(|l| l.contains("on_over_limit=refuse")));
    let cases = [
        (
            "{unit: second, requests_per_unit: 5, on_over_limit: always}",
            "unknown on_over_limit 'always' (expected refuse or charge)",
        ),
        (
            "{unit: second, requests_per_unit: 5, algorithm: sliding_log, on_over_limit: charge}",
            "not supported by sliding_log",
        ),
        (
            "{unit: second, requests_per_unit: 5, lease: 2, on_over_limit: charge}",
            "on_over_limit: charge cannot be leased",
        ),
    ];
    assert_limit_errors(&cases, "descriptors[0].rate_limit.on_over_limit");
}

#[test]
fn ledger_needs_a_fixed_window_and_no_lease() {
    let rules = compile(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: month, requests_per_unit: 100, ledger: true}\n",
    )
    .unwrap();
    assert!(
        rules.dump_lines().iter().any(|l| l.contains(" ledger")),
        "{:?}",
        rules.dump_lines()
    );
    let cases = [
        (
            "{unit: day, requests_per_unit: 5, algorithm: token_bucket, ledger: true}",
            "ledger needs algorithm fixed_window",
        ),
        (
            "{unit: day, requests_per_unit: 5, lease: 2, ledger: true}",
            "ledger cannot be combined with lease",
        ),
    ];
    assert_limit_errors(&cases, "descriptors[0].rate_limit.ledger");
}

/// Each `rate_limit` of `cases` fails to load with an error holding its expected text
/// and naming the YAML `path`.
fn assert_limit_errors(cases: &[(&str, &str)], path: &str) {
    for (limit, expected) in cases {
        let text = format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {limit}\n");
        let found = errors(&text);
        assert!(
            found
                .iter()
                .any(|e| e.contains(expected) && e.contains(path)),
            "{limit}: {found:?}"
        );
    }
}

#[test]
fn concurrency_limits_need_a_slot_and_refuse_rate_fields() {
    let text = "domain: d\ndescriptors:\n  - key: user\n    descriptors:\n      - key: id\n        slot: true\n        rate_limit: {algorithm: concurrency, max_in_flight: 3, max_hold: 30s}\n";
    let rules = compile(text).expect("compiles");
    let lines = rules.dump_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("unit=IN_FLIGHT requests_per_unit=3")
                && l.contains("3 in flight concurrency max_hold=30000ms")),
        "{lines:?}"
    );
    let slot = |descriptor: &str| {
        errors(&format!(
            "domain: d\ndescriptors:\n  - key: a\n{descriptor}"
        ))
        .join("\n")
    };
    let cases = [
        (
            "    rate_limit: {algorithm: concurrency, max_in_flight: 3}\n",
            "descriptors[0].slot: algorithm: concurrency needs slot: true",
        ),
        (
            "    slot: true\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
            "descriptors[0].slot: slot: true needs algorithm: concurrency",
        ),
        (
            "    slot: true\n",
            "descriptors[0].slot: slot: true needs a rate_limit with algorithm: concurrency",
        ),
        (
            "    value: x\n    slot: true\n    rate_limit: {algorithm: concurrency, max_in_flight: 3}\n",
            "descriptors[0].value: a slot descriptor takes no value",
        ),
        (
            "    slot: true\n    detailed_metric: true\n    rate_limit: {algorithm: concurrency, max_in_flight: 3}\n",
            "detailed_metric cannot be used with slot: true",
        ),
        (
            "    slot: true\n    rate_limit: {algorithm: concurrency}\n",
            "rate_limit.max_in_flight: algorithm: concurrency needs max_in_flight",
        ),
        (
            "    slot: true\n    rate_limit: {algorithm: concurrency, max_in_flight: 0}\n",
            "max_in_flight must be from 1 to 10000, got 0",
        ),
        (
            "    slot: true\n    rate_limit: {algorithm: concurrency, max_in_flight: 2, unit: second}\n",
            "rate_limit.unit: unit does not apply to algorithm: concurrency",
        ),
        (
            "    slot: true\n    rate_limit: {algorithm: concurrency, max_in_flight: 2, max_hold: 10ms}\n",
            "max_hold must be a duration from 1s to 24h (like 60s), got '10ms'",
        ),
        (
            "    slot: true\n    rate_limits: [{algorithm: concurrency, max_in_flight: 2}]\n",
            "rate_limits[0].algorithm: algorithm: concurrency is only supported on a single rate_limit",
        ),
        (
            "    rate_limit: {unit: second, requests_per_unit: 3, max_in_flight: 2}\n",
            "max_in_flight is only valid with algorithm: concurrency",
        ),
    ];
    for (descriptor, expected) in cases {
        let found = slot(descriptor);
        assert!(found.contains(expected), "{descriptor}: {found}");
    }
}

#[test]
fn max_delay_is_for_algorithms_that_know_when_a_request_passes() {
    let rules = compile(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: gcra, burst: 1, max_delay: 2s}\n",
    )
    .expect("compiles");
    assert!(
        rules
            .dump_lines()
            .iter()
            .any(|l| l.contains("max_delay=2000ms")),
        "{:?}",
        rules.dump_lines()
    );
    let cases = [
        (
            "{unit: second, requests_per_unit: 5, max_delay: 1s}",
            "max_delay is only valid with algorithm token_bucket, gcra or sliding_log",
        ),
        (
            "{unit: second, requests_per_unit: 5, algorithm: gcra, max_delay: 2m}",
            "max_delay must be a duration from 1ms to 60s (like 2s), got '2m'",
        ),
        (
            "{unit: second, requests_per_unit: 5, algorithm: gcra, lease: 2, max_delay: 1s}",
            "max_delay cannot be combined with lease",
        ),
        (
            "{unit: second, requests_per_unit: 5, algorithm: gcra, on_over_limit: charge, max_delay: 1s}",
            "max_delay cannot be combined with on_over_limit: charge",
        ),
    ];
    assert_limit_errors(&cases, "descriptors[0].rate_limit.max_delay");
    let shadow = errors(
        "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra, max_delay: 1s}\n",
    );
    assert!(
        shadow
            .iter()
            .any(|e| e.contains("shadow_mode cannot be combined with max_delay")),
        "{shadow:?}"
    );
    let listed = errors(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limits: [{unit: second, requests_per_unit: 5, algorithm: gcra, max_delay: 1s}]\n",
    );
    assert!(
        listed
            .iter()
            .any(|e| e.contains("max_delay is only supported on a single rate_limit")),
        "{listed:?}"
    );
}
