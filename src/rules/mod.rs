//! Rules: YAML schema, validation, the compiled match index and lookup.
//!
//! [`read_config_path`] reads rule files, [`Rules::compile`] validates them exactly as
//! envoyproxy/ratelimit does (same whitelist, same messages, plus Sluice's extensions)
//! and builds an immutable index, and [`Rules::lookup`] turns one request descriptor into
//! the rule that applies to it. [`live`] holds the rule set in force and swaps it whole;
//! [`watch`] reloads it when files change. Nothing here touches counters, clocks or the
//! network.

mod compile;
mod error;
mod index;
mod limits;
pub mod live;
mod load;
mod model;
mod schema;
mod stats_name;
pub(crate) mod watch;

use std::collections::HashMap;
use std::sync::Arc;

pub(crate) use error::ConfigError;
pub(crate) use load::read_config_path;
pub use model::*;
pub(crate) use stats_name::stats_name;

use crate::algorithm::{AlgorithmKind, OnOverLimit};
use compile::Builder;
use index::Level;

/// One rule file's text and the name errors use for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFile {
    /// How errors name the file (its path relative to the config directory).
    pub name: String,
    /// The YAML text.
    pub text: String,
}

/// How files are combined, and what `scope: global` limits are shared between.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Several files may add descriptors to one domain (the reference's
    /// `MERGE_DOMAIN_CONFIG`); otherwise a second file of a domain is an error.
    pub merge_domains: bool,
    /// The regions this instance knows (`--region`, `--peer-region`); none: the one
    /// region is the whole world, and a `scope: global` limit is enforced whole.
    pub regions: Option<Arc<crate::regions::RegionPlan>>,
}

/// A compiled, immutable rule set. Shared as `Arc<Rules>` and swapped whole on reload.
#[derive(Debug, Default)]
pub struct Rules {
    /// Domain → root level of its tree.
    domains: HashMap<Arc<str>, Level>,
    /// Every rule, domains in load order, each tree in config (pre-)order.
    rules: Vec<Arc<Rule>>,
    /// The regions the rules were compiled for (names the weights of global limits).
    regions: Option<Arc<crate::regions::RegionPlan>>,
}

// === impl Rules ===

impl Rules {
    /// Validates and compiles `files`, in order. Returns every error found (in file
    /// order); the first one is the error the reference would have reported.
    pub fn compile(files: &[ConfigFile], options: &LoadOptions) -> Result<Rules, Vec<ConfigError>> {
        let mut builder = Builder::default();
        builder.regions = options.regions.clone();
        for file in files {
            match schema::parse_file(&file.name, &file.text) {
                Ok(root) => builder.add_file(&file.name, root, options.merge_domains),
                Err(err) => builder.errors.push(err),
            }
        }
        if !builder.errors.is_empty() {
            return Err(builder.errors);
        }
        Ok(Rules {
            domains: builder
                .domains
                .into_iter()
                .map(|(name, level)| (name, level.freeze()))
                .collect(),
            rules: builder.rules,
            regions: builder.regions,
        })
    }

    /// The rule that applies to one descriptor of a request to `domain`.
    ///
    /// A `limit_override` (Envoy's per-descriptor `limit`) replaces any configured rule,
    /// but only in a known domain. Does not allocate unless the stats key depends on
    /// request values (`detailed_metric`, `value_to_metric`, `share_threshold`) or an
    /// override is given.
    pub fn lookup<'r>(
        &'r self,
        domain: &str,
        entries: &[Entry<'_>],
        limit_override: Option<LimitOverride>,
    ) -> Lookup<'r> {
        let Some((domain_name, root)) = self.domains.get_key_value(domain) else {
            return Lookup::UnknownDomain;
        };
        if let Some(limit) = limit_override {
            return Lookup::Matched(override_match(domain_name, entries, limit));
        }
        match root.lookup(domain, entries) {
            Some(matched) => Lookup::Matched(matched),
            None => Lookup::NoMatch,
        }
    }

    /// How each entry of a descriptor matched the config tree of `domain`, level by
    /// level; `None` for an unknown domain. For humans (`explain`), not the hot path.
    pub(crate) fn trace(&self, domain: &str, entries: &[Entry<'_>]) -> Option<Vec<MatchStep>> {
        self.domains.get(domain).map(|root| root.trace(entries))
    }

    /// Number of rules: descriptors with a limit or `unlimited`.
    pub(crate) fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Every compiled rule, domains in load order, descriptors in config order.
    pub(crate) fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().map(|rule| &**rule)
    }

    /// The regions the rules were compiled for (none: one region, the whole world).
    pub(crate) fn regions(&self) -> Option<&crate::regions::RegionPlan> {
        self.regions.as_deref()
    }

    /// One line per rule, in the reference's `/rlconfig` format
    /// (`foo.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false`).
    /// Rules using Sluice's extensions get a `, limits: [...]` suffix listing all limits.
    pub fn dump_lines(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|rule| dump_line(rule, self.regions()))
            .collect()
    }
}

/// A global limit's weights by region name (`ap=1,eu=1,us=1`); `None` without a plan.
pub(crate) fn named_weights(
    weights: &crate::regions::RegionWeights,
    regions: Option<&crate::regions::RegionPlan>,
) -> Option<Vec<(Arc<str>, u16)>> {
    regions.map(|plan| plan.names().iter().cloned().zip(weights.0).collect())
}

/// How a global limit is shared, for `/rlconfig` (` global split of 100 (weights
/// ap=1,eu=1,us=1)`); empty for a regional limit.
fn dump_scope(scope: &Scope, regions: Option<&crate::regions::RegionPlan>) -> String {
    let (mut text, weights) = match scope {
        Scope::Regional => return String::new(),
        Scope::Split {
            global_limit,
            global_burst,
            weights,
        } => {
            let mut text = format!(" global split of {global_limit}");
            if let Some(burst) = global_burst {
                text.push_str(&format!(" burst={burst}"));
            }
            (text, weights)
        }
        Scope::Aggregate { weights } => (" global aggregate".to_owned(), weights),
    };
    if let Some(named) = named_weights(weights, regions) {
        let named: Vec<String> = named
            .iter()
            .map(|(name, weight)| format!("{name}={weight}"))
            .collect();
        text.push_str(&format!(" (weights {})", named.join(",")));
    }
    text
}

fn dump_line(rule: &Rule, regions: Option<&crate::regions::RegionPlan>) -> String {
    let (unit, requests) = match rule.limits.first() {
        Some(limit) if limit.algorithm == AlgorithmKind::Concurrency => {
            ("IN_FLIGHT", limit.requests_per_unit)
        }
        Some(limit) if !rule.unlimited => (limit.unit.as_upper_str(), limit.requests_per_unit),
        _ => ("UNKNOWN", 0),
    };
    let mut line = format!(
        "{}: unit={unit} requests_per_unit={requests}, shadow_mode: {}, quota_mode: {}",
        rule.stats_key, rule.shadow_mode, rule.quota_mode
    );
    let extended = rule.limits.len() > 1
        || rule.limits.iter().any(|limit| {
            limit.algorithm != AlgorithmKind::FixedWindow
                || limit.burst.is_some()
                || limit.failure_mode != FailureMode::Open
                || limit.lease.mode != LeaseMode::Off
                || limit.ledger
                || limit.on_over_limit != OnOverLimit::Refuse
                || limit.scope != Scope::Regional
        });
    if extended {
        let limits: Vec<String> = rule
            .limits
            .iter()
            .map(|limit| {
                let mut text = if limit.algorithm == AlgorithmKind::Concurrency {
                    format!(
                        "{} in flight concurrency max_hold={}ms",
                        limit.requests_per_unit,
                        limit.max_hold / 1_000
                    )
                } else {
                    format!(
                        "{}/{} {}",
                        limit.requests_per_unit,
                        limit.unit.as_upper_str(),
                        limit.algorithm.as_str()
                    )
                };
                if let Some(burst) = limit.burst {
                    text.push_str(&format!(" burst={burst}"));
                }
                text.push_str(&format!(" failure_mode={:?}", limit.failure_mode).to_lowercase());
                match limit.lease.mode {
                    LeaseMode::Off => {}
                    LeaseMode::Auto => text.push_str(" lease=auto"),
                    LeaseMode::Units(n) => text.push_str(&format!(" lease={n}")),
                }
                if limit.lease.mode != LeaseMode::Off && limit.lease.ttl != DEFAULT_LEASE_TTL_MICROS
                {
                    text.push_str(&format!(" lease_ttl={}ms", limit.lease.ttl / 1_000));
                }
                if limit.ledger {
                    text.push_str(" ledger");
                }
                if limit.on_over_limit != OnOverLimit::Refuse {
                    text.push_str(" on_over_limit=");
                    text.push_str(limit.on_over_limit.as_str());
                }
                if limit.max_delay > 0 {
                    text.push_str(&format!(" max_delay={}ms", limit.max_delay / 1_000));
                }
                text.push_str(&dump_scope(&limit.scope, regions));
                text
            })
            .collect();
        line.push_str(&format!(", limits: [{}]", limits.join(", ")));
    }
    line
}

/// The rule for a request's limit override: the override's numbers under the
/// reference's override stats key (`domain.key_value.key2`), no name, never shadow.
fn override_match<'r>(
    domain: &Arc<str>,
    entries: &[Entry<'_>],
    limit: LimitOverride,
) -> Matched<'r> {
    let mut key = String::from(&**domain);
    key.push('.');
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        key.push_str(entry.key);
        if !entry.value.is_empty() {
            key.push('_');
            key.push_str(entry.value);
        }
    }
    let stats_key: Arc<str> = key.as_str().into();
    let rule = Rule {
        domain: domain.clone(),
        // The request's values: the limiter labels its metrics through the capped
        // `Metrics::rule_label`, never with this.
        stats_label: stats_key.clone(),
        stats_key,
        config_path: "limit override from the request".into(),
        name: None,
        limits: vec![Limit {
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit,
            algorithm: AlgorithmKind::FixedWindow,
            burst: None,
            failure_mode: FailureMode::Open,
            lease: Lease::default(),
            ledger: false,
            on_over_limit: OnOverLimit::Refuse,
            max_hold: 0,
            max_delay: 0,
            scope: Scope::Regional,
        }],
        unlimited: false,
        shadow_mode: false,
        quota_mode: false,
        replaces: Vec::new(),
        detailed_metric: false,
        metadata: None,
        // A fixed window: no slot, no delay.
        needs: Needs::default(),
    };
    Matched {
        rule: RuleRef::Owned(Box::new(rule)),
        stats_key: std::borrow::Cow::Owned(key),
        share_patterns: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_regions;
