//! Runs the `config_load` and `lookup` cases of the shared conformance data (facts taken
//! from envoyproxy/ratelimit's test suite) through the public rules API.
//!
//! The data lives in `$SLUICE_CONFORMANCE_DIR`, by default `../shared/conformance`
//! next to the crate. Cases listed in `tests/properties/conformance_exclusions.yaml` (id → reason)
//! are skipped. Every failing case is reported, then the test fails.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use serde_json::Value;
use sluice::rules::{ConfigFile, Entry, LimitOverride, LoadOptions, Lookup, Rules, Unit};

#[test]
fn conformance_config_load_and_lookup() {
    let Some(dir) = support::conformance_dir() else {
        return;
    };
    let exclusions = support::exclusions();
    let cases = support::load_cases(&dir);
    let cases = &cases;

    let mut failures = Vec::new();
    let mut run = 0;
    for case in cases {
        let id = case["id"].as_str().unwrap();
        let kind = case["kind"].as_str().unwrap();
        if !matches!(kind, "config_load" | "lookup") || exclusions.contains_key(id) {
            continue;
        }
        run += 1;
        let result = match kind {
            "config_load" => config_load(&dir, case),
            _ => lookup(&dir, case),
        };
        if let Err(why) = result {
            failures.push(format!("{id}: {why}"));
        }
    }
    for id in exclusions.keys() {
        if !cases.iter().any(|case| case["id"] == id.as_str()) {
            failures.push(format!("{id}: excluded but no such case"));
        }
    }
    println!(
        "conformance: {run} config_load/lookup cases run, {} excluded",
        exclusions.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {run} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn compile(dir: &Path, case: &Value) -> Result<Rules, Vec<String>> {
    let files: Vec<ConfigFile> = case["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| {
            let name = name.as_str().unwrap();
            ConfigFile {
                name: name.to_owned(),
                text: std::fs::read_to_string(dir.join("configs").join(name)).unwrap(),
            }
        })
        .collect();
    let options = LoadOptions {
        merge_domains: case["merge_domains"].as_bool().unwrap_or(false),
        regions: None,
    };
    Rules::compile(&files, &options)
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

fn config_load(dir: &Path, case: &Value) -> Result<(), String> {
    let expect = &case["expect"];
    match (compile(dir, case), expect["ok"].as_bool().unwrap()) {
        (Ok(rules), true) => {
            if let Some(lines) = expect["dump_lines_unordered"].as_array() {
                let mut want: Vec<&str> = lines.iter().map(|l| l.as_str().unwrap()).collect();
                let mut got = rules.dump_lines();
                want.sort_unstable();
                got.sort_unstable();
                if got != want {
                    return Err(format!("dump lines {got:?}, want {want:?}"));
                }
            }
            Ok(())
        }
        (Ok(_), false) => Err("loaded, want an error".into()),
        (Err(errors), true) => Err(format!("errors {errors:?}")),
        (Err(errors), false) => {
            let first = &errors[0];
            if let Some(part) = expect["error_contains"].as_str() {
                if !first.contains(part) {
                    return Err(format!("error {first:?} lacks {part:?}"));
                }
            }
            // The YAML parser's own text differs from Go's; everything else is exact.
            if let Some(full) = expect["reference_error"].as_str() {
                if !full.contains("error loading config file") && first != full {
                    return Err(format!("error {first:?}, reference {full:?}"));
                }
            }
            Ok(())
        }
    }
}

fn lookup(dir: &Path, case: &Value) -> Result<(), String> {
    let rules = compile(dir, case).map_err(|e| format!("config errors {e:?}"))?;
    // Scalars may read as numbers or booleans; the request carries their text.
    let texts: Vec<(String, String)> = case["descriptor"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (scalar_text(&e["key"]), scalar_text(&e["value"])))
        .collect();
    let entries: Vec<Entry<'_>> = texts
        .iter()
        .map(|(key, value)| Entry { key, value })
        .collect();
    let limit_override = case.get("limit_override").map(|o| LimitOverride {
        requests_per_unit: u32::try_from(o["requests_per_unit"].as_u64().unwrap()).unwrap(),
        unit: Unit::parse(o["unit"].as_str().unwrap()).unwrap(),
    });
    let expect = &case["expect"];
    let found = rules.lookup(case["domain"].as_str().unwrap(), &entries, limit_override);
    if let Some(increment) = expect["domain_not_found_increment"].as_u64() {
        let got = u64::from(found == Lookup::UnknownDomain);
        if got != increment {
            return Err(format!(
                "domain_not_found_increment {got}, want {increment}"
            ));
        }
    }
    let matched = match found {
        Lookup::Matched(matched) => matched,
        other if expect["matched"] == false => {
            let _ = other;
            return Ok(());
        }
        other => return Err(format!("got {other:?}, want a match")),
    };
    if expect["matched"] == false {
        return Err(format!("matched {}, want no match", matched.stats_key));
    }
    let rule = &matched.rule;
    let mut problems = Vec::new();
    if let Some(limit) = expect.get("limit") {
        match rule.limits.first() {
            None => problems.push("no limit".to_owned()),
            Some(got) => {
                if limit["requests_per_unit"].as_u64() != Some(u64::from(got.requests_per_unit)) {
                    problems.push(format!("requests_per_unit {}", got.requests_per_unit));
                }
                if let Some(unit) = limit["unit"].as_str() {
                    if unit != got.unit.as_upper_str() {
                        problems.push(format!("unit {}", got.unit.as_upper_str()));
                    }
                }
            }
        }
    }
    let flag = |field: &str, got: bool, problems: &mut Vec<String>| {
        if let Some(want) = expect[field].as_bool() {
            if want != got {
                problems.push(format!("{field} {got}"));
            }
        }
    };
    flag("unlimited", rule.unlimited, &mut problems);
    flag("shadow_mode", rule.shadow_mode, &mut problems);
    flag("detailed_metric", rule.detailed_metric, &mut problems);
    if let Some(name) = expect["name"].as_str() {
        if rule.name.as_deref().unwrap_or_default() != name {
            problems.push(format!("name {:?}", rule.name));
        }
    }
    if let Some(key) = expect["stats_key"].as_str() {
        if matched.stats_key != key {
            problems.push(format!("stats_key {:?}, want {key:?}", matched.stats_key));
        }
    }
    if let Some(metadata) = expect.get("metadata") {
        if rule.metadata.as_deref() != Some(metadata) {
            problems.push(format!("metadata {:?}", rule.metadata));
        }
    }
    let want_patterns: Vec<Option<&str>> = expect["share_threshold_patterns"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|p| p.as_str().filter(|p| !p.is_empty()))
                .collect()
        })
        .unwrap_or_default();
    if expect.get("share_threshold_patterns").is_some() && matched.share_patterns != want_patterns {
        problems.push(format!("share_patterns {:?}", matched.share_patterns));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}
