//! Bodies of the command-line tools that are not the server (`sluice check`,
//! `sluice explain`).

use std::io::Write;
use std::path::PathBuf;

use crate::algorithm::OnOverLimit;
use crate::limiter::explain::{explain as explain_request, Explanation};
use crate::limiter::{CheckRequest, Descriptor};
use crate::rules::{read_config_path, Entry, LoadOptions, Rule, Rules};
use crate::settings::ExplainArgs;
use crate::store::memory::MemoryStore;

/// Validates the rules at `paths` exactly as `serve` loads them. Prints one line per
/// compiled rule to `out`, or every error to `err`; returns whether all were valid.
pub fn check(
    paths: &[PathBuf],
    options: &LoadOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<bool> {
    let mut files = Vec::new();
    let mut ok = true;
    for path in paths {
        match read_config_path(path) {
            Ok(found) => files.extend(found),
            Err(error) => {
                writeln!(err, "{error}")?;
                ok = false;
            }
        }
    }
    if !ok {
        return Ok(false);
    }
    match Rules::compile(&files, options) {
        Ok(rules) => {
            for rule in rules.rules() {
                writeln!(out, "{}", describe(rule))?;
            }
            writeln!(
                out,
                "ok: {} rules from {} files",
                rules.rule_count(),
                files.len()
            )?;
            Ok(true)
        }
        Err(errors) => {
            for error in &errors {
                writeln!(err, "{error}")?;
            }
            writeln!(err, "{} errors", errors.len())?;
            Ok(false)
        }
    }
}

/// One line describing a compiled rule.
pub(crate) fn describe(rule: &Rule) -> String {
    let mut line = format!("{} ({})", rule.stats_key, rule.config_path);
    if rule.unlimited {
        line.push_str(" unlimited");
    }
    for limit in &rule.limits {
        line.push_str(&format!(
            " [{}/{} {}",
            limit.requests_per_unit,
            limit.unit.as_upper_str().to_ascii_lowercase(),
            limit.algorithm.as_str()
        ));
        if let Some(burst) = limit.burst {
            line.push_str(&format!(" burst={burst}"));
        }
        if limit.on_over_limit != OnOverLimit::Refuse {
            line.push_str(" on_over_limit=");
            line.push_str(limit.on_over_limit.as_str());
        }
        line.push_str(&format!(" failure_mode={:?}]", limit.failure_mode).to_ascii_lowercase());
    }
    if let Some(name) = &rule.name {
        line.push_str(&format!(" name={name}"));
    }
    for flag in [
        (rule.shadow_mode, " shadow_mode"),
        (rule.quota_mode, " quota_mode"),
        (rule.detailed_metric, " detailed_metric"),
    ] {
        if flag.0 {
            line.push_str(flag.1);
        }
    }
    line
}

/// `sluice explain`: loads the rules (combined as `options` say) and prints, per descriptor, the rule that applies
/// and why. Returns false (after printing the errors) when the rules do not load or a
/// descriptor cannot be parsed.
pub fn explain(
    args: &ExplainArgs,
    options: &LoadOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<bool> {
    let rules = match read_config_path(&args.config)
        .map_err(|error| vec![error])
        .and_then(|files| Rules::compile(&files, options))
    {
        Ok(rules) => rules,
        Err(errors) => {
            for error in &errors {
                writeln!(err, "{error}")?;
            }
            return Ok(false);
        }
    };
    let mut parsed = Vec::with_capacity(args.descriptors.len());
    for text in &args.descriptors {
        match parse_descriptor(text) {
            Ok(entries) => parsed.push(entries),
            Err(reason) => {
                writeln!(err, "descriptor {text:?}: {reason}")?;
                return Ok(false);
            }
        }
    }
    let request = CheckRequest {
        domain: &args.domain,
        descriptors: parsed
            .iter()
            .map(|entries| Descriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry { key, value })
                    .collect(),
                limit_override: None,
                hits_addend: None,
                refund: false,
            })
            .collect(),
        hits_addend: u64::from(args.hits_addend),
    };
    let explanations =
        futures::executor::block_on(explain_request::<MemoryStore>(&rules, &request, None))
            .unwrap_or_default();
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&explanations).unwrap_or_default()
        )?;
    } else {
        for explanation in &explanations {
            write_explanation(out, &args.domain, explanation)?;
        }
    }
    Ok(true)
}

/// Parses `key=value,key2=value2`.
fn parse_descriptor(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => Err(format!("{pair:?} is not key=value")),
        })
        .collect()
}

fn write_explanation(
    out: &mut dyn Write,
    domain: &str,
    explanation: &Explanation,
) -> std::io::Result<()> {
    writeln!(
        out,
        "descriptor {} (domain {domain}):",
        explanation.entries.join(", ")
    )?;
    for (entry, how) in explanation.entries.iter().zip(&explanation.matched_by) {
        writeln!(out, "  {entry}: {how}")?;
    }
    match &explanation.rule {
        None => writeln!(out, "  => {}: no limit applies", explanation.outcome)?,
        Some(rule) => {
            writeln!(
                out,
                "  => {} by {} ({})",
                explanation.outcome, rule.stats_key, rule.config_path
            )?;
            for limit in &rule.limits {
                write!(
                    out,
                    "     {}/{} {}",
                    limit.requests_per_unit, limit.unit, limit.algorithm
                )?;
                if let Some(burst) = limit.burst {
                    write!(out, " burst={burst}")?;
                }
                if limit.on_over_limit != OnOverLimit::Refuse.as_str() {
                    write!(out, " on_over_limit={}", limit.on_over_limit)?;
                }
                if let (Some(scope), Some(sharing)) = (limit.regions.scope, limit.regions.sharing) {
                    write!(out, " scope={scope} sharing={sharing}")?;
                }
                if let Some(global) = limit.regions.global_limit {
                    write!(out, " of={global}")?;
                }
                writeln!(out, " failure_mode={}", limit.failure_mode)?;
            }
            if let Some(key) = &explanation.counter_key {
                let gives = if explanation.refund {
                    " given back (is_negative_hits)"
                } else {
                    ""
                };
                writeln!(
                    out,
                    "     counter key sluice:{{{key}}}, cost {}{gives}",
                    explanation.cost
                )?;
            }
        }
    }
    Ok(())
}
