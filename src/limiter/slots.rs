//! Concurrency limits in the pipeline: a descriptor whose rule holds slots
//! (`algorithm: concurrency`) is decided by one [`Store::hold`] call with the request's
//! slot, never by the local layers (a slot is freed by a release the blocked-until
//! cache and the pre-check never see), and by its failure mode when the store fails.

use tokio::time::Instant;

use super::fallback::{self, Fallback};
use super::within::within;
use super::{DecidedBy, LimiterError, Pending, Verdict};
use crate::algorithm::concurrency::{SlotId, SlotOp, RETRY_CAP};
use crate::algorithm::{Decision, Micros};
use crate::rules::{Entry, FailureMode, Rule};
use crate::store::{HoldCall, Store, StoreCheck, StoreError};

/// The slot a request names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The `slot: true` entry's value, by id.
    Named(SlotId),
    /// An empty value: no slot is held without a name (else every request without one
    /// would share one slot, admitted again and again), so it is refused.
    Unnamed,
}

/// The slot `entries` name for `rule`, when its limit is a concurrency limit: the last
/// entry's value (the `slot: true` descriptor, where the rule is).
pub(crate) fn slot_of(rule: &Rule, entries: &[Entry<'_>]) -> Option<Slot> {
    if !rule.holds_slots() {
        return None;
    }
    entries.last().map(|entry| match entry.value {
        "" => Slot::Unnamed,
        name => Slot::Named(crate::algorithm::concurrency::slot_id(name)),
    })
}

/// The answer to a request that names no slot: an acquire or a probe is refused, a
/// release frees nothing.
pub(crate) fn unnamed(op: SlotOp) -> Decision {
    let refused = op != SlotOp::Release;
    Decision {
        allowed: !refused,
        remaining: 0,
        reset_after: 0,
        retry_after: if refused { RETRY_CAP } else { 0 },
        used: u64::from(refused),
    }
}

/// What `check` does with its slot: a refund releases it, a hit of 0 probes, any other
/// hit takes one slot (whatever its size: a request holds one slot).
fn op_of(check: &StoreCheck) -> SlotOp {
    if check.refund {
        SlotOp::Release
    } else if check.cost == 0 {
        SlotOp::Probe
    } else {
        SlotOp::Acquire
    }
}

impl<S: Store> super::Limiter<S> {
    /// Decides `item` (a concurrency limit's check) for `slot`: its index in the
    /// request and its verdict.
    pub(super) async fn held<'r>(
        &self,
        item: Pending<'r>,
        check: &StoreCheck,
        slot: Slot,
        now: Micros,
        deadline: Option<Instant>,
    ) -> Result<(usize, Verdict<'r>), LimiterError> {
        let Some(limit) = check.limits.first() else {
            return Ok((item.index, Verdict::NoLimit));
        };
        let Slot::Named(slot) = slot else {
            let index = item.index;
            let decision = unnamed(op_of(check));
            // Not the store's answer: nothing of it feeds the local layers.
            let verdict = self.verdict(item, check, &[decision], now, DecidedBy::FailureMode);
            return Ok((index, verdict));
        };
        let call = HoldCall {
            key: check.key,
            quota: limit.quota,
            slot,
            op: op_of(check),
        };
        let mut answered = None;
        let asked = within(deadline, &self.metrics, async {
            answered = Some(self.store.hold(&call).await?);
            Ok(())
        })
        .await
        .and_then(|()| answered.ok_or_else(|| StoreError::Protocol("no hold answer".into())));
        let (decision, decided_by) = match asked {
            Ok(decision) => (decision, DecidedBy::Store),
            Err(error) => {
                let mode = Fallback::mode(&item.rule);
                self.metrics
                    .store_fallback(&item.stats_label, fallback::mode_name(mode));
                if mode == FailureMode::Error {
                    return Err(LimiterError::Store(error));
                }
                (
                    self.fallback.hold(mode, &call).await,
                    DecidedBy::FailureMode,
                )
            }
        };
        let index = item.index;
        Ok((
            index,
            self.verdict(item, check, &[decision], now, decided_by),
        ))
    }
}
