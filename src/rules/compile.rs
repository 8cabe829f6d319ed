//! Validation and compilation of parsed files into the match index.
//!
//! Checks happen in the reference's order, with its messages; Sluice's own checks (the
//! extensions inside `rate_limit`, `rate_limits`, the caps against hostile config) name
//! the YAML path. Errors are collected, not returned at the first one, so that `sluice
//! check` can print them all; a descriptor with an error is left out of the index.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::index::{KeyNodes, Level, Node};
use super::limits::rule_limits;
use super::schema::{RawDescriptor, RawRoot};
use super::{ConfigError, Needs, Rule};
use crate::regions::RegionPlan;

/// Deepest descriptor nesting accepted (levels below the domain).
pub(crate) const MAX_DEPTH: usize = 32;

/// Most descriptors (and so rules) accepted in one rule set, over all files.
pub(crate) const MAX_DESCRIPTORS: usize = 1_000_000;

/// A rule set being built: domains in load order, each a tree of [`Draft`]s.
#[derive(Default)]
pub(crate) struct Builder {
    pub(crate) domains: Vec<(Arc<str>, DraftLevel)>,
    domain_index: HashMap<Arc<str>, usize>,
    pub(crate) rules: Vec<Arc<Rule>>,
    pub(crate) errors: Vec<ConfigError>,
    descriptors: usize,
    /// The regions `scope: global` limits are shared between (none: one region).
    pub(crate) regions: Option<Arc<RegionPlan>>,
}

/// One level of a domain being built.
#[derive(Default)]
pub(crate) struct DraftLevel {
    /// Composite keys (`key` or `key_value`) seen at this level: the reference's
    /// duplicate check, which also catches `a_b` + `c` against `a` + `b_c`.
    seen: HashSet<String>,
    nodes: Vec<Draft>,
}

/// One descriptor node being built.
struct Draft {
    key: String,
    value: String,
    rule: Option<Arc<Rule>>,
    children: DraftLevel,
    value_to_metric: bool,
    share_threshold: bool,
}

/// Where a descriptor list sits: file, stats key prefix, YAML path prefix, depth.
struct Place<'a> {
    file: &'a str,
    domain: &'a Arc<str>,
    parent_key: &'a str,
    path: &'a str,
    depth: usize,
}

// === impl Builder ===

impl Builder {
    /// Adds one parsed file.
    pub(crate) fn add_file(&mut self, file: &str, root: RawRoot, merge_domains: bool) {
        let domain = root.domain.unwrap_or_default();
        if domain.is_empty() {
            self.errors.push(ConfigError::reference(
                file,
                "config file cannot have empty domain",
            ));
            return;
        }
        let index = match self.domain_index.get(domain.as_str()) {
            Some(&index) if merge_domains => index,
            Some(_) => {
                self.errors.push(ConfigError::reference(
                    file,
                    format!("duplicate domain '{domain}' in config file"),
                ));
                return;
            }
            None => {
                let name: Arc<str> = domain.as_str().into();
                self.domains.push((name.clone(), DraftLevel::default()));
                self.domain_index.insert(name, self.domains.len() - 1);
                self.domains.len() - 1
            }
        };
        let (name, mut level) = std::mem::take(&mut self.domains[index]);
        let place = Place {
            file,
            domain: &name,
            parent_key: &name,
            path: "",
            depth: 1,
        };
        self.load_level(&place, root.descriptors.unwrap_or_default(), &mut level);
        self.domains[index] = (name, level);
    }

    /// The reference's `loadDescriptors`.
    fn load_level(
        &mut self,
        place: &Place<'_>,
        descriptors: Vec<RawDescriptor>,
        level: &mut DraftLevel,
    ) {
        for (i, raw) in descriptors.into_iter().enumerate() {
            let path = format!("{}descriptors[{i}]", place.path);
            let key = raw.key.clone().unwrap_or_default();
            if key.is_empty() {
                self.errors.push(ConfigError::reference(
                    place.file,
                    "descriptor has empty key",
                ));
                continue;
            }
            let value = raw.value.clone().unwrap_or_default();
            let final_key = if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            };
            let stats_key = format!("{}.{final_key}", place.parent_key);
            if level.seen.contains(&final_key) {
                self.errors.push(ConfigError::reference(
                    place.file,
                    format!("duplicate descriptor composite key '{stats_key}'"),
                ));
                continue;
            }
            if place.depth > MAX_DEPTH {
                self.errors.push(ConfigError::sluice(
                    place.file,
                    &path,
                    format!("descriptors are nested deeper than {MAX_DEPTH} levels"),
                ));
                continue;
            }
            self.descriptors += 1;
            if self.descriptors == MAX_DESCRIPTORS + 1 {
                self.errors.push(ConfigError::sluice(
                    place.file,
                    &path,
                    format!("more than {MAX_DESCRIPTORS} descriptors in the rule set"),
                ));
            }
            if self.descriptors > MAX_DESCRIPTORS {
                return;
            }
            let rule = self.build_rule(place, &path, &stats_key, &raw);
            let share_threshold = raw.share_threshold.unwrap_or(false);
            if share_threshold && !value.contains('*') {
                self.errors.push(ConfigError::reference(
                    place.file,
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), \
                         but found key '{final_key}'"
                    ),
                ));
            }
            let mut children = DraftLevel::default();
            let child_place = Place {
                path: &format!("{path}."),
                parent_key: &stats_key,
                depth: place.depth + 1,
                ..*place
            };
            self.load_level(
                &child_place,
                raw.descriptors.unwrap_or_default(),
                &mut children,
            );
            level.seen.insert(final_key);
            level.nodes.push(Draft {
                key,
                value,
                rule,
                children,
                value_to_metric: raw.value_to_metric.unwrap_or(false),
                share_threshold,
            });
        }
    }

    /// The rule at one descriptor, if it has `rate_limit` or `rate_limits`.
    fn build_rule(
        &mut self,
        place: &Place<'_>,
        path: &str,
        stats_key: &str,
        raw: &RawDescriptor,
    ) -> Option<Arc<Rule>> {
        let spec = rule_limits(
            place.file,
            path,
            raw,
            self.regions.as_deref(),
            &mut self.errors,
        )?;
        let stats_key: Arc<str> = stats_key.into();
        let stats_label = match super::stats_name(&stats_key) {
            std::borrow::Cow::Borrowed(_) => stats_key.clone(),
            std::borrow::Cow::Owned(name) => name.into(),
        };
        let rule = Arc::new(Rule {
            domain: place.domain.clone(),
            stats_key,
            stats_label,
            config_path: format!("{}: {path}", place.file).into(),
            name: spec.name,
            needs: Needs::of(&spec.limits),
            limits: spec.limits,
            unlimited: spec.unlimited,
            shadow_mode: raw.shadow_mode.unwrap_or(false),
            quota_mode: raw.quota_mode.unwrap_or(false),
            replaces: spec.replaces,
            detailed_metric: raw.detailed_metric.unwrap_or(false),
            metadata: raw.metadata.clone().map(Arc::new),
        });
        self.rules.push(rule.clone());
        Some(rule)
    }
}

// === impl DraftLevel ===

impl DraftLevel {
    /// Freezes a built level into the lookup index.
    pub(crate) fn freeze(self) -> Level {
        let mut level = Level::default();
        for draft in self.nodes {
            let nodes: &mut KeyNodes = level.keys.entry(draft.key.into()).or_default();
            let index = nodes.nodes.len();
            if draft.value.is_empty() {
                nodes.key_only = Some(index);
            } else {
                if draft.value.contains('*') {
                    nodes.wildcards.push(index);
                }
                nodes.exact.insert(draft.value.as_str().into(), index);
            }
            nodes.nodes.push(Node {
                value: draft.value.into(),
                rule: draft.rule,
                children: draft.children.freeze(),
                value_to_metric: draft.value_to_metric,
                share_threshold: draft.share_threshold,
            });
        }
        level
    }
}
