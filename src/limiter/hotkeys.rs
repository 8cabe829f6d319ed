//! The hot-key layers of the [`Limiter`] that need the store's kind: which layer takes
//! a descriptor (lease or pre-check, shared stores only), and the leased path: answer
//! from this instance's lease, renew it with one lease call, return unused units (see
//! [`super::lease`] for the bounds).

use std::sync::Arc;

use tokio::time::Instant;

use super::fallback::{self, Fallback};
use super::precheck::Before;
use super::{lease, DecidedBy, Limiter, LimiterError, Pending, Verdict};
use crate::algorithm::{Decision, Micros};
use crate::rules::FailureMode;
use crate::store::{LeaseRequest, Store, StoreCheck, StoreError};
use crate::telemetry::RuleLabel;

/// How the leased path ended.
pub(super) enum Leased<'r> {
    /// Answered: the descriptor's index and verdict.
    Answered(usize, Verdict<'r>),
    /// The store does not lease: the normal path decides.
    Unleased(Pending<'r>),
    /// The store failed and the rule's failure mode is `error`.
    Failed(LimiterError),
}

/// What a hot-key layer decided for one descriptor before the store.
pub(super) enum HotKeyLayer {
    /// The rule leases: decide from (or renew) this instance's lease.
    Lease {
        /// Units to lease.
        units: u64,
        /// The rule's `lease_ttl`.
        ttl: Micros,
    },
    /// The pre-check refused.
    Refused {
        /// The refusing limit.
        limit_index: usize,
        /// The refusal.
        decision: Decision,
    },
}

// === impl Limiter ===

impl<S: Store> Limiter<S> {
    /// Which hot-key layer of a shared store answers `item`, if any: its lease (the
    /// units to lease), or a pre-check refusal. Marks `item` for a pre-check charge when
    /// its key is hot and the store is to decide it.
    pub(super) fn hot_key_layer(
        &self,
        item: &mut Pending<'_>,
        check: &StoreCheck,
        now: Micros,
    ) -> Option<HotKeyLayer> {
        if self.store.is_shared()
            && !self.settings.stop_increment_when_over_limit
            && item.rule.limits.len() == 1
        {
            let lease = item.rule.limits[0].lease;
            if let Some(units) = self.leases.size(&lease, check, now) {
                return Some(HotKeyLayer::Lease {
                    units,
                    ttl: lease.ttl,
                });
            }
        }
        if !self.precheck_on || item.rule.shadow_mode {
            return None;
        }
        match self
            .precheck
            .before(check.key, &check.limits, check.cost, now)
        {
            Before::Cold => None,
            Before::Hot => {
                item.precheck_charge = true;
                None
            }
            Before::Refused(limit_index, decision) => Some(HotKeyLayer::Refused {
                limit_index,
                decision,
            }),
        }
    }

    /// Decides a check of a leased rule: from this instance's lease if it has the
    /// units, else with one lease call (return the unused, decide, lease `units` more).
    /// A store that failed is answered by the rule's failure mode at once (one
    /// deadline, not two); a store that does not lease gives the item back.
    pub(super) async fn leased<'r>(
        &self,
        item: Pending<'r>,
        check: &StoreCheck,
        units: u64,
        lifetime: Micros,
        deadline: Option<Instant>,
    ) -> Leased<'r> {
        let cell = self.leases.cell(check);
        let label = item.stats_label.clone();
        let limit = check.limits.first().map_or(0, |l| l.quota.limit);
        let taken = cell.slot().take(check.cost, self.clock.now());
        let (renewing, taken) = match taken {
            Some(decision) => (None, Some(decision)),
            None => {
                // Wait for a renewal in flight, then look again before renewing.
                let renewing = cell.renewing.lock().await;
                let taken = cell.slot().take(check.cost, self.clock.now());
                (Some(renewing), taken)
            }
        };
        if let Some(decision) = taken {
            self.leases.decisions.inc();
            let index = item.index;
            return Leased::Answered(index, self.record(item, 0, decision, limit));
        }
        let now = self.clock.now();
        let lifetime = check
            .limits
            .first()
            .map_or(lifetime, |limit| lease::lifetime(limit, units, lifetime));
        let give_back = cell.slot().give_back();
        let request = LeaseRequest {
            check: check.clone(),
            units,
            lifetime,
            give_back,
        };
        let call = self.store.lease(&request);
        let answer = match deadline {
            None => call.await,
            // The caller's own deadline (`grpc-timeout`): past it, the failure mode.
            Some(deadline) => tokio::time::timeout_at(deadline, call)
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::Timeout(
                        deadline.saturating_duration_since(Instant::now()),
                    ))
                }),
        };
        let grant = match answer {
            Ok(grant) => grant,
            Err(error) => {
                // A call that may have run never gets its units back (see `restore`);
                // the lease stays open until the return loop closes it.
                if never_sent(&error) {
                    cell.slot().restore(give_back);
                }
                return match error {
                    StoreError::Protocol(_) => Leased::Unleased(item),
                    error => self.lease_failed(item, check, error, now).await,
                };
            }
        };
        if let Some(limit) = check.limits.first() {
            self.metrics
                .lease_bound
                .get_or_create(&RuleLabel {
                    rule: label.clone(),
                })
                .set(self.leases.bound(limit, units, lifetime));
        }
        let closed = cell.slot().renew(&request, &label, &grant, now);
        self.lease_gauge(&label, gauge(grant.units) - gauge(closed));
        drop(renewing);
        let index = item.index;
        Leased::Answered(
            index,
            self.verdict(item, check, &[grant.decision], now, DecidedBy::Store),
        )
    }

    /// The rule's failure mode answers a lease call that failed.
    async fn lease_failed<'r>(
        &self,
        item: Pending<'r>,
        check: &StoreCheck,
        error: StoreError,
        now: Micros,
    ) -> Leased<'r> {
        let mode = Fallback::mode(&item.rule);
        self.metrics
            .store_fallback(&item.stats_label, fallback::mode_name(mode));
        if mode == FailureMode::Error {
            return Leased::Failed(LimiterError::Store(error));
        }
        let mut decisions = Vec::with_capacity(1);
        self.fallback.decide(mode, check, &mut decisions).await;
        let index = item.index;
        Leased::Answered(
            index,
            self.verdict(item, check, &decisions, now, DecidedBy::FailureMode),
        )
    }

    /// Gives back the unused units of expired leases, or of every lease when
    /// `all` (at shutdown). The server runs it every [`super::lease::RETURN_INTERVAL`]; a
    /// failed return is retried on the next run.
    pub(crate) async fn return_leases(&self, all: bool) {
        if !self.leases.any_held() {
            return;
        }
        for cell in self.leases.cells() {
            let Ok(_renewing) = cell.renewing.try_lock() else {
                continue;
            };
            let (request, rule, open) = {
                let mut slot = cell.slot();
                if !(all && slot.open > 0 || slot.is_expired(self.clock.now())) {
                    continue;
                }
                (slot.return_request(), slot.rule().cloned(), slot.open)
            };
            if let Some(request) = request {
                if let Err(error) = self.store.lease(&request).await {
                    if never_sent(&error) {
                        // Kept for the next run; anything else is gone either way.
                        cell.slot().restore(request.give_back);
                        continue;
                    }
                }
            }
            cell.slot().open = 0;
            if let Some(rule) = rule {
                self.lease_gauge(&rule, -gauge(open));
            }
        }
    }

    /// Moves a rule's outstanding-units gauge by `delta`.
    fn lease_gauge(&self, rule: &Arc<str>, delta: i64) {
        self.leases.add_held(delta);
        self.metrics
            .lease_outstanding
            .get_or_create(&RuleLabel { rule: rule.clone() })
            .inc_by(delta);
    }
}

/// Whether a failed lease call certainly did not reach the store.
fn never_sent(error: &StoreError) -> bool {
    matches!(error, StoreError::BreakerOpen(_))
}

/// Units as a gauge delta.
fn gauge(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}
