//! Bodies of the command-line tools that are not the server (`sluice check`).

use std::io::Write;
use std::path::PathBuf;

use crate::rules::{read_config_path, LoadOptions, Rule, Rules};

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
pub fn describe(rule: &Rule) -> String {
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
