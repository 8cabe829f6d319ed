//! `explain`: what the limiter would do with a request, and why, without charging
//! anything. Used by `sluice explain` (no store) and `POST /explain` (current state
//! read from the store with `peek`).

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use super::matching::{is_replaced, match_descriptor, Applies};
use super::slots::{slot_of, unnamed, Slot};
use super::{CheckRequest, Limiter};
use crate::algorithm::concurrency::SlotOp;
use crate::algorithm::{AlgorithmKind, Decision};
use crate::regions::RegionPlan;
use crate::rules::{named_weights, Limit, Matched, Rules, Scope};
use crate::store::{HoldCall, Store, StoreError};

/// What applies to one descriptor, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Explanation {
    /// The descriptor's entries as `key=value`.
    pub(crate) entries: Vec<String>,
    /// Per entry, how it matched the config tree (`exact value`, `wildcard "a*"`,
    /// `key only`, `no match`).
    pub(crate) matched_by: Vec<String>,
    /// `unknown_domain`, `no_match`, `unlimited`, `replaced` or `limited`.
    pub(crate) outcome: &'static str,
    /// The rule that applies, if any.
    pub(crate) rule: Option<RuleView>,
    /// Hex digest naming the descriptor's counters (`sluice:{<digest>}:<limit>` in Redis).
    pub(crate) counter_key: Option<String>,
    /// Units a request would cost.
    pub(crate) cost: u64,
    /// The descriptor gives `cost` back (`is_negative_hits`) rather than charging it.
    pub(crate) refund: bool,
    /// A concurrency limit's slot: the value of the descriptor's `slot: true` entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) slot: Option<String>,
    /// Per limit, what the store would decide now (only when a store was asked).
    pub(crate) would_decide: Vec<DecisionView>,
}

/// A rule, for humans.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct RuleView {
    /// The reference's stats key (`domain.key_value`).
    pub(crate) stats_key: String,
    /// Where it is configured (`file.yaml: descriptors[0]`).
    pub(crate) config_path: String,
    /// The limit's name, if any.
    pub(crate) name: Option<String>,
    /// Shadow rule: never refuses.
    pub(crate) shadow_mode: bool,
    /// Quota rule.
    pub(crate) quota_mode: bool,
    /// The limits, checked all-or-nothing.
    pub(crate) limits: Vec<LimitView>,
}

/// One limit, for humans.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct LimitView {
    /// Units per `unit` (a concurrency limit: its `max_in_flight`).
    pub(crate) requests_per_unit: u32,
    /// `second` … `year`, or `in_flight` for a concurrency limit.
    pub(crate) unit: String,
    /// Algorithm name.
    pub(crate) algorithm: &'static str,
    /// Capacity (token bucket, GCRA).
    pub(crate) burst: Option<u32>,
    /// Store failure mode.
    pub(crate) failure_mode: String,
    /// `refuse` or `charge` (every charge counts, into debt).
    pub(crate) on_over_limit: &'static str,
    /// A concurrency limit's `max_hold`, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_hold_ms: Option<u64>,
    /// The longest a refused request is delayed instead (`max_delay`), in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_delay_ms: Option<u64>,
    /// How the limit is shared between regions (no field for a regional limit).
    #[serde(flatten)]
    pub(crate) regions: RegionsView,
}

/// How one limit is shared between regions, for humans; every field is left out for a
/// regional limit, whose view stays as it was before regions.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct RegionsView {
    /// `global` for a limit shared between regions (none: regional).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) scope: Option<&'static str>,
    /// How a global limit is shared: `split` or `aggregate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sharing: Option<&'static str>,
    /// A split limit's configured limit of all regions (`requests_per_unit` is this
    /// region's share).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) global_limit: Option<u32>,
    /// A split limit's configured burst of all regions (`burst` is this region's share).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) global_burst: Option<u32>,
    /// A global limit's weight per region name (when the regions are known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) weights: Option<BTreeMap<String, u16>>,
}

/// One decision, for humans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct DecisionView {
    /// Would the request pass this limit.
    pub(crate) allowed: bool,
    /// Units left after it.
    pub(crate) remaining: u64,
    /// Milliseconds until the limit is whole again.
    pub(crate) reset_after_ms: u64,
    /// Milliseconds until a request of this cost would pass.
    pub(crate) retry_after_ms: u64,
}

impl From<Decision> for DecisionView {
    fn from(decision: Decision) -> Self {
        Self {
            allowed: decision.allowed,
            remaining: decision.remaining,
            reset_after_ms: decision.reset_after.div_ceil(1_000),
            retry_after_ms: decision.retry_after.div_ceil(1_000),
        }
    }
}

/// Explains `request` under `rules`; asks `store` what it would decide when given. The
/// descriptors are matched by the same step a check takes ([`super::matching`]).
pub(crate) async fn explain<S: Store>(
    rules: &Rules,
    request: &CheckRequest<'_>,
    store: Option<&S>,
) -> Result<Vec<Explanation>, StoreError> {
    let mut replaced = HashSet::new();
    let applies: Vec<Applies<'_>> = request
        .descriptors
        .iter()
        .map(|descriptor| match_descriptor(rules, request, descriptor, &mut replaced))
        .collect();
    let request_cost = request.hits_addend.max(1);
    let mut out = Vec::with_capacity(applies.len());
    for (descriptor, applies) in request.descriptors.iter().zip(applies) {
        let matched_by = rules
            .trace(request.domain, &descriptor.entries)
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect();
        let mut explanation = Explanation {
            entries: descriptor
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect(),
            matched_by,
            outcome: "no_match",
            rule: None,
            counter_key: None,
            cost: descriptor.hits_addend.unwrap_or(request_cost),
            refund: false,
            slot: None,
            would_decide: Vec::new(),
        };
        match applies {
            Applies::UnknownDomain => explanation.outcome = "unknown_domain",
            Applies::NoMatch => {}
            Applies::Unlimited(matched) => {
                explanation.outcome = "unlimited";
                explanation.rule = Some(rule_view(&matched, rules.regions()));
            }
            Applies::Limited { matched, check, .. } => {
                explanation.rule = Some(rule_view(&matched, rules.regions()));
                if is_replaced(&matched.rule, &replaced) {
                    explanation.outcome = "replaced";
                } else {
                    explanation.outcome = "limited";
                    explanation.counter_key = Some(check.key.hex());
                    explanation.refund = check.refund;
                    let slot = slot_of(&matched.rule, &descriptor.entries);
                    if slot.is_some() {
                        explanation.slot = descriptor.entries.last().map(|e| e.value.to_owned());
                    }
                    if let Some(store) = store {
                        explanation.would_decide = match (slot, check.limits.first()) {
                            (Some(Slot::Unnamed), Some(_)) => {
                                vec![unnamed(SlotOp::Probe).into()]
                            }
                            (Some(Slot::Named(slot)), Some(limit)) => {
                                let call = HoldCall {
                                    key: check.key,
                                    quota: limit.quota,
                                    slot,
                                    op: SlotOp::Probe,
                                };
                                vec![store.hold(&call).await?.into()]
                            }
                            _ => {
                                let mut decisions = Vec::new();
                                store.peek(&check, &mut decisions).await?;
                                decisions.into_iter().map(DecisionView::from).collect()
                            }
                        };
                    }
                }
            }
        }
        out.push(explanation);
    }
    Ok(out)
}

/// The matched rule, for humans; `regions` name a global limit's weights.
fn rule_view(matched: &Matched<'_>, regions: Option<&RegionPlan>) -> RuleView {
    let rule = &matched.rule;
    RuleView {
        stats_key: matched.stats_key.to_string(),
        config_path: rule.config_path.to_string(),
        name: rule.name.as_deref().map(str::to_owned),
        shadow_mode: rule.shadow_mode,
        quota_mode: rule.quota_mode,
        limits: rule
            .limits
            .iter()
            .map(|limit| {
                let concurrency = limit.algorithm == AlgorithmKind::Concurrency;
                LimitView {
                    requests_per_unit: limit.requests_per_unit,
                    unit: if concurrency {
                        "in_flight".to_owned()
                    } else {
                        limit.unit.as_upper_str().to_ascii_lowercase()
                    },
                    algorithm: limit.algorithm.as_str(),
                    burst: limit.burst,
                    failure_mode: format!("{:?}", limit.failure_mode).to_ascii_lowercase(),
                    on_over_limit: limit.on_over_limit.as_str(),
                    max_hold_ms: concurrency.then_some(limit.max_hold / 1_000),
                    max_delay_ms: (limit.max_delay > 0).then_some(limit.max_delay / 1_000),
                    regions: regions_view(limit, regions),
                }
            })
            .collect(),
    }
}

/// How `limit` is shared between `regions`, for humans.
fn regions_view(limit: &Limit, regions: Option<&RegionPlan>) -> RegionsView {
    let (sharing, global_limit, global_burst, weights) = match &limit.scope {
        Scope::Regional => (None, None, None, None),
        Scope::Split {
            global_limit,
            global_burst,
            weights,
        } => (
            Some("split"),
            Some(*global_limit),
            *global_burst,
            Some(weights),
        ),
        Scope::Aggregate { weights } => (Some("aggregate"), None, None, Some(weights)),
    };
    RegionsView {
        scope: sharing.map(|_| "global"),
        sharing,
        global_limit,
        global_burst,
        weights: weights
            .and_then(|weights| named_weights(weights, regions))
            .map(|named| {
                named
                    .into_iter()
                    .map(|(name, weight)| (name.to_string(), weight))
                    .collect()
            }),
    }
}

impl<S: Store> Limiter<S> {
    /// Explains `request` against this limiter's store, charging nothing.
    pub(crate) async fn explain(
        &self,
        rules: &Rules,
        request: &CheckRequest<'_>,
    ) -> Result<Vec<Explanation>, StoreError> {
        explain(rules, request, Some(&self.store)).await
    }
}
