//! The compiled match index and the lookup of one descriptor.
//!
//! Per domain a tree. Each level maps an entry key to the nodes configured for that key:
//! an exact `value → node` map, the wildcard patterns in config order and the key-only
//! node. A request entry is matched, per level, exactly first, then against the
//! wildcards of its key in config order, then key-only; there is no backtracking, and a
//! rule applies only at the node matched by the last request entry (the reference's
//! semantics). Lookup cost grows with the number of request entries, not with the
//! number of rules: the only scan is over the wildcard patterns of one key at one level.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::{Entry, MatchStep, Matched, Rule, RuleRef};

/// One level of a domain's tree.
#[derive(Debug, Default)]
pub(crate) struct Level {
    /// Entry key → the nodes configured for that key at this level.
    pub(crate) keys: HashMap<Box<str>, KeyNodes>,
}

/// The nodes of one key at one level.
#[derive(Debug, Default)]
pub(crate) struct KeyNodes {
    /// Every node of the key, in config order; the fields below index into it.
    pub(crate) nodes: Vec<Node>,
    /// Configured value → node, for every non-empty value (patterns included: a request
    /// value equal to a pattern matches it exactly, as in the reference).
    pub(crate) exact: HashMap<Box<str>, usize>,
    /// Values containing `*`, in config order.
    pub(crate) wildcards: Vec<usize>,
    /// The node without a value.
    pub(crate) key_only: Option<usize>,
}

/// One descriptor node of the config.
#[derive(Debug)]
pub(crate) struct Node {
    /// The configured value (`""` for key-only; the pattern for wildcards).
    pub(crate) value: Box<str>,
    /// The rule at this node, if it has `rate_limit`/`rate_limits`.
    pub(crate) rule: Option<Arc<Rule>>,
    /// The next level.
    pub(crate) children: Level,
    /// `value_to_metric`: the stats key uses the request's value at this level.
    pub(crate) value_to_metric: bool,
    /// `share_threshold`: every value matching the pattern shares one counter.
    pub(crate) share_threshold: bool,
}

/// How an entry matched a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    Exact,
    Wildcard,
    KeyOnly,
}

// === impl Level ===

impl Level {
    /// The node one request entry selects at this level.
    fn find(&self, entry: &Entry<'_>) -> Option<(&Node, How)> {
        let nodes = self.keys.get(entry.key)?;
        if let Some(&i) = nodes.exact.get(entry.value) {
            return Some((&nodes.nodes[i], How::Exact));
        }
        for &i in &nodes.wildcards {
            let node = &nodes.nodes[i];
            if wildcard_match(&node.value, entry.value) {
                return Some((node, How::Wildcard));
            }
        }
        nodes.key_only.map(|i| (&nodes.nodes[i], How::KeyOnly))
    }

    /// Walks the tree with the request entries, calling `step` for each matched level.
    /// Returns the rule of the node matched by the last entry, if any.
    fn walk<'r>(
        &'r self,
        entries: &[Entry<'_>],
        mut step: impl FnMut(&'r Node, How),
    ) -> Option<&'r Arc<Rule>> {
        let mut level = self;
        let last = entries.len().checked_sub(1)?;
        for (i, entry) in entries.iter().enumerate() {
            let (node, how) = level.find(entry)?;
            step(node, how);
            if i == last {
                return node.rule.as_ref();
            }
            if node.children.keys.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }

    /// How each request entry matched, level by level (`NoMatch` from where the walk
    /// stopped on).
    pub(crate) fn trace(&self, entries: &[Entry<'_>]) -> Vec<MatchStep> {
        let mut steps = Vec::with_capacity(entries.len());
        let mut level = Some(self);
        for entry in entries {
            let found = level.and_then(|level| level.find(entry));
            steps.push(match found {
                Some((_, How::Exact)) => MatchStep::Exact,
                Some((node, How::Wildcard)) => MatchStep::Wildcard(node.value.to_string()),
                Some((_, How::KeyOnly)) => MatchStep::KeyOnly,
                None => MatchStep::NoMatch,
            });
            level = found
                .map(|(node, _)| &node.children)
                .filter(|children| !children.keys.is_empty());
        }
        steps
    }

    /// Matches a descriptor against this (root) level of `domain`.
    pub(crate) fn lookup<'r>(&'r self, domain: &str, entries: &[Entry<'_>]) -> Option<Matched<'r>> {
        let mut dynamic = false;
        let rule = self.walk(entries, |node, how| {
            dynamic |= match how {
                How::Wildcard => node.share_threshold || node.value_to_metric,
                How::KeyOnly => node.value_to_metric,
                How::Exact => false,
            };
        })?;
        if !dynamic && !rule.detailed_metric {
            return Some(Matched {
                rule: RuleRef::Borrowed(rule),
                stats_key: Cow::Borrowed(&rule.stats_key),
                share_patterns: Vec::new(),
            });
        }
        let mut steps = Vec::with_capacity(entries.len());
        self.walk(entries, |node, how| steps.push((node, how)));
        let mut share_patterns: Vec<Option<&'r str>> = steps
            .iter()
            .map(|&(node, how)| {
                (how == How::Wildcard && node.share_threshold).then_some(&*node.value)
            })
            .collect();
        let shared = share_patterns.iter().any(Option::is_some);
        let mut key = String::from(domain);
        for (i, (entry, &(node, how))) in entries.iter().zip(&steps).enumerate() {
            key.push('.');
            key.push_str(entry.key);
            let value = if let Some(pattern) = share_patterns[i] {
                Some(pattern)
            } else if rule.detailed_metric {
                // The reference's detailed key always joins with '_', but not when
                // some entry shares a threshold.
                (!shared || !entry.value.is_empty()).then_some(entry.value)
            } else {
                match how {
                    How::Exact => Some(entry.value),
                    How::Wildcard if !node.value_to_metric => Some(&*node.value),
                    How::Wildcard | How::KeyOnly if node.value_to_metric => {
                        (!entry.value.is_empty()).then_some(entry.value)
                    }
                    How::Wildcard | How::KeyOnly => None,
                }
            };
            if let Some(value) = value {
                key.push('_');
                key.push_str(value);
            }
        }
        if !shared {
            share_patterns.clear();
        }
        Some(Matched {
            rule: RuleRef::Borrowed(rule),
            stats_key: Cow::Owned(key),
            share_patterns,
        })
    }
}

/// Whether `value` matches `pattern`, where each `*` stands for any run of characters
/// (possibly empty): `foo*`, `/api*v1`, `svc*ep*rpc`.
pub(crate) fn wildcard_match(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return pattern == value;
    };
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let mut parts = parts.peekable();
    if parts.peek().is_none() {
        // No '*' at all.
        return rest.is_empty();
    }
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            // The last literal must end the value.
            return rest.len() >= part.len() && rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}
