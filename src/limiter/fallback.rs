//! What a check gets when the store cannot answer: the rule's failure mode (DESIGN §7).
//!
//! `open` admits, `closed` refuses, `local` enforces `limit / replicas` in this
//! instance's memory, and `error` fails the whole call with the store's error so that
//! Envoy's `failure_mode_deny` decides (the reference's behaviour). A rule with several
//! limits takes the strictest mode among them: error, then closed, then local, then open.

use std::sync::Arc;

use crate::algorithm::concurrency::SlotOp;
use crate::algorithm::Decision;
use crate::clock::Clock;
use crate::rules::{FailureMode, Rule};
use crate::store::memory::MemoryStore;
use crate::store::{HoldCall, LimitCheck, Store, StoreCheck};

/// Most keys the `local` failure mode keeps.
const LOCAL_MAX_KEYS: usize = 100_000;

/// Decides checks without the shared store.
pub(crate) struct Fallback {
    /// Counters of the `local` mode.
    local: MemoryStore,
    /// Instances sharing the store (`--replicas`): local limits are divided by it.
    replicas: u32,
}

impl Fallback {
    /// A fallback for `replicas` instances, reading time from `clock`.
    pub(crate) fn new(replicas: u32, clock: Arc<dyn Clock>) -> Self {
        Self {
            local: MemoryStore::new(LOCAL_MAX_KEYS, clock),
            replicas: replicas.max(1),
        }
    }

    /// The failure mode that governs `rule`.
    pub(crate) fn mode(rule: &Rule) -> FailureMode {
        let modes = rule.limits.iter().map(|limit| limit.failure_mode);
        [FailureMode::Error, FailureMode::Closed, FailureMode::Local]
            .into_iter()
            .find(|strict| modes.clone().any(|mode| mode == *strict))
            .unwrap_or(FailureMode::Open)
    }

    /// Decides `check` under `mode` (never `Error`, which the caller handles), appending
    /// one decision per limit.
    pub(crate) async fn decide(
        &self,
        mode: FailureMode,
        check: &StoreCheck,
        decisions: &mut Vec<Decision>,
    ) {
        match mode {
            FailureMode::Local => {
                let local = StoreCheck {
                    key: check.key,
                    limits: check
                        .limits
                        .iter()
                        .map(|limit| {
                            let mut quota = limit.quota;
                            quota.limit = quota.limit.div_ceil(u64::from(self.replicas));
                            quota.burst = quota.burst.div_ceil(u64::from(self.replicas));
                            LimitCheck {
                                algorithm: limit.algorithm,
                                quota,
                                sharing: crate::regions::Sharing::Regional,
                            }
                        })
                        .collect(),
                    cost: check.cost,
                    refund: check.refund,
                    max_wait: 0,
                };
                // The memory store cannot fail.
                let _ = self
                    .local
                    .check(std::slice::from_ref(&local), decisions)
                    .await;
            }
            FailureMode::Open | FailureMode::Closed | FailureMode::Error => {
                // A refund is never refused, whoever answers it.
                let allowed = mode == FailureMode::Open || check.refund;
                decisions.extend(check.limits.iter().map(|limit| Decision {
                    allowed,
                    remaining: if allowed { limit.quota.limit } else { 0 },
                    reset_after: limit.quota.period,
                    // Not remembered by the blocked-until cache: the store may be back at once.
                    retry_after: 0,
                    used: if allowed {
                        0
                    } else {
                        limit.quota.limit.saturating_add(check.cost)
                    },
                }));
            }
        }
    }
}

impl Fallback {
    /// Decides a concurrency limit's `call` under `mode` (never `Error`): `local` holds
    /// `max_in_flight / replicas` slots in this instance's memory, `open` admits,
    /// `closed` refuses; a release is never refused.
    pub(crate) async fn hold(&self, mode: FailureMode, call: &HoldCall) -> Decision {
        if mode == FailureMode::Local {
            let mut local = *call;
            local.quota.limit = local.quota.limit.div_ceil(u64::from(self.replicas));
            // The memory store cannot fail.
            return self.local.hold(&local).await.unwrap_or_default();
        }
        let allowed = mode == FailureMode::Open || call.op == SlotOp::Release;
        Decision {
            allowed,
            remaining: if allowed { call.quota.limit } else { 0 },
            reset_after: 0,
            retry_after: 0,
            used: if allowed { 0 } else { call.quota.limit + 1 },
        }
    }
}

/// Name of a mode for metrics and logs.
pub(crate) fn mode_name(mode: FailureMode) -> &'static str {
    match mode {
        FailureMode::Open => "open",
        FailureMode::Closed => "closed",
        FailureMode::Local => "local",
        FailureMode::Error => "error",
    }
}
