//! The local pre-check (DESIGN §6, layer 2): per hot key, the rule's limits at their full
//! global size in local memory, charged only with what the store admitted for this
//! instance. When this instance alone has used a limit up, the store would refuse too,
//! so the request is refused without a store call.
//!
//! Only for stores shared with other instances: with the memory store the store *is*
//! local memory. Which keys: a key is hot once this instance sees [`MIN_RATE`] checks
//! of it within a second (allocation-free [`Meters`], which count every check, the ones
//! the blocked-until cache answers included); the admitted units of calls sent while it
//! is hot are charged locally (starting from nothing, which is sound: a subset of the
//! store's charges), and a key that is not hot is not even looked up. Hot keys live in a
//! bounded moka cache ([`DEFAULT_CAPACITY`] keys) whose TinyLFU admission keeps the most
//! used ones when it is full.
//!
//! Why it never refuses a request the store would admit (per limit; a rule refuses when
//! any of its limits does, as the store does). Let the store's clock run at the rate of
//! the local one, at any fixed offset:
//! - *token bucket, GCRA, sliding log* (decisions depend only on time differences): the
//!   local state is the algorithm fed with a subset of the store's charges (only this
//!   instance's admitted ones), each dated at the local instant the call was *sent*,
//!   which is no later than the instant the script ran. Fewer charges and earlier dates
//!   can only leave more room. Answers arriving out of order (sent before the latest
//!   charged one) are not charged at all: skipping a charge is always safe. A charge the
//!   local algorithm would refuse resets the entry (fresh state: the most lenient).
//! - *fixed window, sliding window* (windows aligned to the store's clock): the entry
//!   counts this instance's admitted units in the store's current window and refuses
//!   only while `count + cost > limit` and before that window's end, which it estimates
//!   as `sent + reset_after` (fixed) or `sent + reset_after − period` (sliding window),
//!   a lower bound of the true end. The store counts at least these units in that
//!   window (the sliding window's estimate is at least its current-window count).
//!
//! Assumption, stated: the store's clock does not step back (a step back makes the
//! store's windows later than estimated).

use std::sync::{Arc, Mutex, PoisonError};

use moka::sync::Cache;

use super::blocked::fingerprint;
use super::meter::Meters;
use crate::algorithm::{self, AlgorithmKind, Decision, Micros, State};
use crate::store::{CounterKey, LimitCheck};

/// Default number of hot keys kept.
pub(crate) const DEFAULT_CAPACITY: u64 = 10_000;

/// Checks per second from which a key is hot.
pub(crate) const MIN_RATE: u64 = 10;

/// What one limit of a hot key looks like from this instance.
#[derive(Clone, Debug)]
enum Local {
    /// Fixed or sliding window: this instance's units in the store's current window.
    Window {
        /// Estimated end of that window (a lower bound), local clock.
        end: Micros,
        /// Units this instance got admitted in it.
        count: u64,
    },
    /// Token bucket, GCRA, sliding log: the algorithm over this instance's charges.
    Algorithm {
        /// The local state.
        state: State,
        /// Send instant of the latest charge (older answers are skipped).
        last_charge: Micros,
    },
}

/// The pre-check's word on one check, before the store call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Before {
    /// The key is not hot: nothing looked up, and the store's answer is not charged.
    Cold,
    /// The key is hot and nothing refuses: charge the store's answer ([`Precheck::charge`]).
    Hot,
    /// This instance alone has used up a limit: the refusing limit's index and the
    /// refusal to answer.
    Refused(usize, Decision),
}

/// One hot key: one local view per limit, in rule order.
type Entry = Arc<Mutex<Vec<Local>>>;

/// Bounded map of hot keys to their local views.
pub(crate) struct Precheck {
    /// Keyed by counter and limits fingerprint (an edited rule starts afresh).
    cache: Cache<(CounterKey, u64), Entry>,
    /// Which keys are hot.
    meters: Meters,
}

impl Precheck {
    /// A pre-check holding at most `capacity` keys.
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            cache: Cache::new(capacity),
            meters: Meters::new(MIN_RATE),
        }
    }

    /// Drops this instance's view of `counter` under `limits`: hits were given back
    /// at the store, which this view did not see.
    pub(crate) fn forget(&self, counter: CounterKey, limits: &[LimitCheck]) {
        self.cache.invalidate(&(counter, fingerprint(limits)));
    }

    /// Counts a check of `counter` at `now` and says whether this instance alone has
    /// used up one of its limits ([`Before::Refused`]), or else whether the store's
    /// answer is to be charged ([`Before::Hot`]).
    pub(crate) fn before(
        &self,
        counter: CounterKey,
        limits: &[LimitCheck],
        cost: u64,
        now: Micros,
    ) -> Before {
        // Only hot keys have entries worth a cache lookup (an entry of a key gone cold
        // is skipped, and not charged either: a subset of charges is always sound).
        if cost == 0 || !self.meters.hot(counter, now) {
            return Before::Cold;
        }
        // A cost no limit could ever hold is the store's to answer: only it knows when
        // the limit is whole again (this instance's view starts empty).
        if limits.iter().any(|limit| cost > capacity(limit)) {
            return Before::Hot;
        }
        let key = (counter, fingerprint(limits));
        let Some(entry) = self.cache.get(&key) else {
            let views = limits.iter().map(|limit| fresh(limit.algorithm)).collect();
            self.cache.insert(key, Arc::new(Mutex::new(views)));
            return Before::Hot;
        };
        let views = entry.lock().unwrap_or_else(PoisonError::into_inner);
        let refusals = views
            .iter()
            .zip(limits)
            .enumerate()
            .filter_map(|(index, (view, limit))| {
                let refusal = match view {
                    Local::Window { end, count } => (now < *end
                        && count.saturating_add(cost) > limit.quota.limit)
                        .then(|| Decision {
                            allowed: false,
                            remaining: 0,
                            reset_after: end - now,
                            retry_after: end - now,
                            used: count.saturating_add(cost),
                        }),
                    Local::Algorithm { state, .. } => {
                        let (decision, _) =
                            algorithm::decide(limit.algorithm, state, now, cost, &limit.quota);
                        (!decision.allowed).then_some(decision)
                    }
                };
                refusal.map(|decision| (index, decision))
            });
        // The refusal with the longest wait describes the answer, as the store's does.
        match super::longest_wait(refusals) {
            Some((index, decision)) => Before::Refused(index, decision),
            None => Before::Hot,
        }
    }

    /// Counts a check of `counter` at `now` that was answered before reaching the
    /// pre-check (by the blocked-until cache), so that a key kept refused locally stays
    /// hot and its entry in use.
    pub(crate) fn count(&self, counter: CounterKey, now: Micros) {
        self.meters.hot(counter, now);
    }

    /// Charges `cost`, which the store admitted on every limit (`decisions`, one per
    /// limit), for a call sent at `sent` of a key that [`Self::before`] called hot then
    /// (the meters are not read again: hotness as of the send, a subset of the charges
    /// a later reading would allow, is sound, and spares a cache miss per call).
    pub(crate) fn charge(
        &self,
        counter: CounterKey,
        limits: &[LimitCheck],
        cost: u64,
        sent: Micros,
        decisions: &[Decision],
    ) {
        if cost == 0 || decisions.len() != limits.len() || decisions.iter().any(|d| !d.allowed) {
            return;
        }
        let Some(entry) = self.cache.get(&(counter, fingerprint(limits))) else {
            return;
        };
        let mut views = entry.lock().unwrap_or_else(PoisonError::into_inner);
        if views.len() != limits.len() {
            *views = limits.iter().map(|limit| fresh(limit.algorithm)).collect();
        }
        for ((view, limit), decision) in views.iter_mut().zip(limits).zip(decisions) {
            charge_one(view, limit, cost, sent, decision);
        }
    }
}

/// The view of a key this instance has not charged yet.
fn fresh(kind: AlgorithmKind) -> Local {
    match kind {
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow => {
            Local::Window { end: 0, count: 0 }
        }
        _ => Local::Algorithm {
            state: State::fresh(kind),
            last_charge: 0,
        },
    }
}

/// Charges one limit's view (see the module documentation for why each step is safe).
fn charge_one(view: &mut Local, limit: &LimitCheck, cost: u64, sent: Micros, decision: &Decision) {
    let period = limit.quota.period;
    match view {
        Local::Window { end, count } => {
            let estimate = match limit.algorithm {
                AlgorithmKind::SlidingWindow => sent
                    .saturating_add(decision.reset_after)
                    .saturating_sub(period),
                _ => sent.saturating_add(decision.reset_after),
            };
            if estimate > end.saturating_add(period / 2) {
                (*end, *count) = (estimate, cost);
            } else if estimate.saturating_add(period / 2) >= *end {
                *count = count.saturating_add(cost);
                *end = (*end).min(estimate);
            }
            // Else: a late answer from an earlier window; not charged.
        }
        Local::Algorithm { state, last_charge } => {
            if sent < *last_charge {
                return;
            }
            let (local, next) = algorithm::decide(limit.algorithm, state, sent, cost, &limit.quota);
            *state = if local.allowed {
                next
            } else {
                State::fresh(limit.algorithm)
            };
            *last_charge = sent;
        }
    }
}

/// The most one request can cost and still pass `limit` some day: a bucket's or
/// GCRA's burst, a window's or log's limit.
fn capacity(limit: &LimitCheck) -> u64 {
    match limit.algorithm {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => limit.quota.burst,
        _ => limit.quota.limit,
    }
}
