//! The decision pipeline: turns matched descriptors into store checks, applies the
//! reference's request semantics (unlimited, `replaces`, hits addends, shadow rules) and
//! records per-rule statistics. It knows rules and stores, never the wire format.
//!
//! Hot-key layers (blocked-until cache, pre-check, leases) and store failure modes plug
//! in here, between the rules and the store call.

pub mod stats;

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use crate::algorithm::{Decision, MICROS_PER_SECOND};
use crate::rules::{Entry, LimitOverride, Lookup, Rule, Rules};
use crate::store::{CounterKey, LimitCheck, Store, StoreCheck, StoreError};
use crate::telemetry::Metrics;

/// One descriptor of a request, borrowed from the wire message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// Entries in request order.
    pub entries: Vec<Entry<'a>>,
    /// Envoy's per-descriptor limit override.
    pub limit_override: Option<LimitOverride>,
    /// Descriptor-level hits addend; `Some(0)` checks without charging.
    pub hits_addend: Option<u64>,
}

/// A request as the limiter sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckRequest<'a> {
    /// Rule domain.
    pub domain: &'a str,
    /// Descriptors in request order.
    pub descriptors: Vec<Descriptor<'a>>,
    /// Request-level hits addend; 0 means 1.
    pub hits_addend: u64,
}

/// What applies to one descriptor.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict<'r> {
    /// No limit applies: unknown domain, no match, or replaced by another rule.
    NoLimit,
    /// The rule says `unlimited`.
    Unlimited,
    /// A limit was decided.
    Limited(Limited<'r>),
}

/// A decided descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct Limited<'r> {
    /// The rule that applied.
    pub rule: Cow<'r, Rule>,
    /// Which of the rule's limits describes the answer: the first that refused, else
    /// the one with the least remaining.
    pub limit_index: usize,
    /// That limit's decision.
    pub decision: Decision,
    /// Whether the answer is OVER_LIMIT (false for shadow rules, whatever the store said).
    pub over_limit: bool,
}

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    /// The store failed and a rule's failure mode is `error`.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Knobs of the reference's request semantics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimiterSettings {
    /// Near-limit threshold as a fraction of the limit (`NEAR_LIMIT_RATIO`, 0.8).
    pub near_limit_ratio: f32,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: refused fixed-window hits do not count.
    pub stop_increment_when_over_limit: bool,
}

impl Default for LimiterSettings {
    fn default() -> Self {
        Self {
            near_limit_ratio: 0.8,
            stop_increment_when_over_limit: false,
        }
    }
}

/// Decides requests against a store.
pub struct Limiter<S> {
    /// Where counters live.
    store: S,
    /// Request semantics.
    settings: LimiterSettings,
    /// Statistics sink.
    metrics: Arc<Metrics>,
}

/// A descriptor waiting for its store decision.
struct Pending<'r> {
    /// Index of the descriptor in the request.
    index: usize,
    /// The rule that matched.
    rule: Cow<'r, Rule>,
    /// Label under which its statistics are counted.
    stats_label: Arc<str>,
    /// Units charged.
    cost: u64,
}

// === impl Limiter ===

impl<S: Store> Limiter<S> {
    /// A limiter over `store`.
    pub fn new(store: S, settings: LimiterSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            settings,
            metrics,
        }
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides every descriptor of `request` under `rules`; one verdict per descriptor,
    /// in request order.
    pub async fn check<'r>(
        &self,
        rules: &'r Rules,
        request: &CheckRequest<'_>,
    ) -> Result<Vec<Verdict<'r>>, LimiterError> {
        let mut verdicts = Vec::with_capacity(request.descriptors.len());
        let mut pending = Vec::new();
        let mut checks = Vec::new();
        let mut replaced: HashSet<&str> = HashSet::new();
        let request_cost = request.hits_addend.max(1);

        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let matched = match rules.lookup(
                request.domain,
                &descriptor.entries,
                descriptor.limit_override,
            ) {
                Lookup::UnknownDomain => {
                    self.metrics.domain_not_found.inc();
                    verdicts.push(Verdict::NoLimit);
                    continue;
                }
                Lookup::NoMatch => {
                    verdicts.push(Verdict::NoLimit);
                    continue;
                }
                Lookup::Matched(matched) => matched,
            };
            let cost = descriptor.hits_addend.unwrap_or(request_cost);
            let stats_label = match &matched.stats_key {
                Cow::Borrowed(key) if *key == &*matched.rule.stats_key => {
                    matched.rule.stats_key.clone()
                }
                key => self.metrics.rule_label(key),
            };
            if matched.rule.unlimited {
                verdicts.push(Verdict::Unlimited);
                continue;
            }
            if let Cow::Borrowed(rule) = &matched.rule {
                replaced.extend(rule.replaces.iter().map(|name| &**name));
            }
            let key = CounterKey::new(request.domain, &descriptor.entries, &matched.share_patterns);
            let limits = matched
                .rule
                .limits
                .iter()
                .map(|limit| LimitCheck {
                    algorithm: limit.algorithm,
                    quota: limit.quota(self.settings.stop_increment_when_over_limit),
                })
                .collect();
            checks.push(StoreCheck { key, limits, cost });
            pending.push(Pending {
                index,
                rule: matched.rule,
                stats_label,
                cost,
            });
            verdicts.push(Verdict::NoLimit);
        }

        // A named limit listed in another matched rule's `replaces` is not applied.
        if !replaced.is_empty() {
            let mut kept = 0;
            for position in 0..pending.len() {
                let is_replaced = pending[position]
                    .rule
                    .name
                    .as_deref()
                    .is_some_and(|name| replaced.contains(name));
                if !is_replaced {
                    pending.swap(kept, position);
                    checks.swap(kept, position);
                    kept += 1;
                }
            }
            pending.truncate(kept);
            checks.truncate(kept);
        }
        if checks.is_empty() {
            return Ok(verdicts);
        }

        let mut decisions = Vec::with_capacity(checks.iter().map(|c| c.limits.len()).sum());
        self.store.check(&checks, &mut decisions).await?;

        let mut offset = 0;
        for (item, check) in pending.into_iter().zip(&checks) {
            let limit_decisions = &decisions[offset..offset + check.limits.len()];
            offset += check.limits.len();
            let index = item.index;
            verdicts[index] = self.verdict(item, check, limit_decisions);
        }
        Ok(verdicts)
    }

    /// Builds one descriptor's verdict and records its statistics.
    fn verdict<'r>(
        &self,
        item: Pending<'r>,
        check: &StoreCheck,
        decisions: &[Decision],
    ) -> Verdict<'r> {
        let limit_index = decisions
            .iter()
            .position(|d| !d.allowed)
            .or_else(|| {
                decisions
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, d)| d.remaining)
                    .map(|(index, _)| index)
            })
            .unwrap_or(0);
        let Some(decision) = decisions.get(limit_index).copied() else {
            return Verdict::NoLimit;
        };
        let limit = check.limits.get(limit_index).map_or(0, |l| l.quota.limit);
        let split = stats::split_hits(&decision, limit, item.cost, self.settings.near_limit_ratio);
        let label = &item.stats_label;
        self.metrics.add_rule_hits(label, "total_hits", item.cost);
        self.metrics
            .add_rule_hits(label, "within_limit", split.within_limit);
        self.metrics
            .add_rule_hits(label, "near_limit", split.near_limit);
        self.metrics
            .add_rule_hits(label, "over_limit", split.over_limit);
        let shadow = item.rule.shadow_mode;
        if shadow && !decision.allowed {
            self.metrics.add_rule_hits(label, "shadow_mode", item.cost);
        }
        Verdict::Limited(Limited {
            rule: item.rule,
            limit_index,
            decision,
            over_limit: !decision.allowed && !shadow,
        })
    }
}

/// Whole seconds until `micros` have passed, rounded up (the reference's
/// `duration_until_reset` granularity).
pub fn ceil_seconds(micros: u64) -> u64 {
    micros.div_ceil(MICROS_PER_SECOND)
}
