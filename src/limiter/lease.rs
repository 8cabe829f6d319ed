//! Token leasing (DESIGN §6, layer 3): for a rule with `lease: N` (or `lease: auto` and
//! a key this instance sees often), one store call decides the request and takes `N`
//! more units all-or-nothing; the instance then admits locally until they are spent or
//! the lease expires, and gives back what is unused with its next lease call or, once
//! expired, from the background return loop ([`super::Limiter::return_leases`], run by the server
//! every [`RETURN_INTERVAL`]).
//!
//! Bounds (per leased key, `R` instances, lease size `N`, lifetime `L` = `lease_ttl`,
//! capped at the window end for window algorithms):
//! - **Never admits beyond the limit.** Leased units are charged in the store before
//!   any is admitted. Window algorithms: the lease lives inside the window it was
//!   charged in (its local end is `sent + min(L, window_left)`, no later than the
//!   store's window end). Token bucket and GCRA: a leased unit may be used up to `L`
//!   after it was charged, which a bucket would count as refill it had not earned, so a
//!   lease also charges the refill of its lifetime (`L × limit / period` units, the
//!   *reserve*); a return gives back only what a never-charged bucket would still miss
//!   (see `scripts/lease.lua`). Their lease lives at most the time the bucket takes to
//!   refill `N` ([`lifetime`]), so the reserve never exceeds `N`.
//! - **May refuse early** by at most the units sitting unused in other instances'
//!   leases: `(R − 1) × N`, plus `R × L × limit / period` (≤ `R × N`) of reserve for
//!   token bucket and GCRA, for at most `L` + [`RETURN_INTERVAL`] after a lease stops being used.
//!   Exported per rule as `sluice_lease_early_refusal_bound_units`; the units of the
//!   leases an instance holds open (used or not) as `sluice_lease_outstanding_units`.
//! - A lease evicted from the bounded table ([`DEFAULT_CAPACITY`] keys) before it is
//!   returned keeps its units charged until its window ends or the bucket refills.
//!
//! `auto`: a key is leased once this instance has seen [`AUTO_MIN_RATE`] checks of it
//! within one second (the current or the previous; counted on a fixed array of
//! meters, see [`Meters`]); the lease size is
//! `capacity / (16 × R)` (at least 1, at most [`MAX_AUTO_UNITS`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use moka::sync::Cache;
use prometheus_client::metrics::counter::Counter;

use super::blocked::fingerprint;
use super::meter::Meters;
use crate::algorithm::{AlgorithmKind, Decision, Micros};
use crate::rules::{Lease, LeaseMode};
use crate::store::{CounterKey, LeaseGrant, LeaseRequest, LimitCheck, StoreCheck};

/// Most keys with a lease (or an `auto` rate meter) kept per instance.
pub(crate) const DEFAULT_CAPACITY: u64 = 10_000;

/// Checks per second from which `auto` leases a key.
pub(crate) const AUTO_MIN_RATE: u64 = 50;

/// Largest lease `auto` takes.
pub(crate) const MAX_AUTO_UNITS: u64 = 1_000;

/// How often the server returns the unused units of expired leases.
pub(crate) const RETURN_INTERVAL: Duration = Duration::from_millis(50);

/// One key's lease in this instance.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// The check to return units with (cost 0).
    check: Option<StoreCheck>,
    /// Rule label for the gauges.
    rule: Option<Arc<str>>,
    /// Lease lifetime asked for.
    lifetime: Micros,
    /// Units not used yet.
    pub(crate) units: u64,
    /// Units of the lease while it is open (granted, not yet closed by a renewal or the
    /// return loop); 0 when closed. Feeds `sluice_lease_outstanding_units`.
    pub(crate) open: u64,
    /// Store time of the grant (the return script's reference).
    granted_at: Micros,
    /// Local instant the lease stops admitting.
    expires: Micros,
    /// Units the store had left after the grant (for `remaining` in answers).
    remaining_after: u64,
    /// Local instant the limit is whole again, as of the grant's request (before the
    /// leased units).
    reset_at: Micros,
    /// Units granted by the lease.
    granted: u64,
    /// How much later a unit taken from the lease makes the limit whole again: one
    /// unit's refill for a token bucket or GCRA, 0 for windows (whole at the window's
    /// end whatever is used).
    per_unit: Micros,
    /// The limit (for `used` in answers).
    limit: u64,
}

impl Slot {
    /// Takes `cost` from a live lease; the decision to answer, if it had enough.
    pub(crate) fn take(&mut self, cost: u64, now: Micros) -> Option<Decision> {
        if cost == 0 || now >= self.expires || self.units < cost {
            return None;
        }
        self.units -= cost;
        let remaining = self.remaining_after.saturating_add(self.units);
        // As the store would say had each unit taken so far been charged alone.
        let taken = self.granted.saturating_sub(self.units);
        let reset_at = self
            .reset_at
            .saturating_add(taken.saturating_mul(self.per_unit));
        Some(Decision {
            allowed: true,
            remaining,
            reset_after: reset_at.saturating_sub(now),
            retry_after: 0,
            used: self.limit.saturating_sub(remaining),
        })
    }

    /// Takes the unused units out (so nothing admits from them while they travel
    /// back), with the grant's store time and the lease's lifetime; [`Slot::restore`]
    /// puts them back if the call was never sent.
    pub(crate) fn give_back(&mut self) -> Option<(u64, Micros, Micros)> {
        let units = std::mem::take(&mut self.units);
        (units > 0).then_some((units, self.granted_at, self.lifetime))
    }

    /// Puts back units taken by [`Slot::give_back`] for a call that was never sent (an
    /// open breaker). A call that failed after it may have run is never restored: its
    /// script may have taken the units back, and using them again could admit beyond
    /// the limit; losing them can only refuse early.
    pub(crate) fn restore(&mut self, give_back: Option<(u64, Micros, Micros)>) {
        if let Some((units, granted_at, _)) = give_back {
            if granted_at == self.granted_at {
                self.units = self.units.saturating_add(units);
            }
        }
    }

    /// Whether this slot's lease is open but can no longer be used at `now`.
    pub(crate) fn is_expired(&self, now: Micros) -> bool {
        self.open > 0 && now >= self.expires
    }

    /// The call returning this slot's unused units (taken out, see
    /// [`Slot::give_back`]), if any.
    pub(crate) fn return_request(&mut self) -> Option<LeaseRequest> {
        let mut check = self.check.clone()?;
        check.cost = 0;
        let give_back = self.give_back()?;
        Some(LeaseRequest {
            check,
            units: 0,
            lifetime: self.lifetime,
            give_back: Some(give_back),
        })
    }

    /// The rule label of this slot.
    pub(crate) fn rule(&self) -> Option<&Arc<str>> {
        self.rule.as_ref()
    }

    /// Replaces the lease after a lease call sent at `sent` answered `grant`; the
    /// units of the lease it closes.
    pub(crate) fn renew(
        &mut self,
        request: &LeaseRequest,
        rule: &Arc<str>,
        grant: &LeaseGrant,
        sent: Micros,
    ) -> u64 {
        let closed = self.open;
        let life = match grant.window_left {
            0 => request.lifetime,
            left => request.lifetime.min(left),
        };
        // A leased rule has one limit.
        let (limit, per_unit) = request.check.limits.first().map_or((0, 0), |l| {
            let per_unit = match l.algorithm {
                AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => {
                    l.quota.period / l.quota.limit.max(1)
                }
                _ => 0,
            };
            (l.quota.limit, per_unit)
        });
        *self = Self {
            check: Some(request.check.clone()),
            rule: Some(rule.clone()),
            lifetime: request.lifetime,
            units: grant.units,
            open: grant.units,
            granted_at: grant.store_now,
            expires: sent.saturating_add(life),
            remaining_after: grant.decision.remaining.saturating_sub(grant.units),
            reset_at: sent.saturating_add(grant.decision.reset_after),
            granted: grant.units,
            per_unit,
            limit,
        };
        closed
    }
}

/// One leased key: its slot, and the lock one renewal at a time holds.
#[derive(Debug, Default)]
pub(crate) struct Cell {
    /// The lease; a short synchronous lock (taking units never waits on the store).
    slot: Mutex<Slot>,
    /// Held across a lease call, so that an instance renews a key once at a time and
    /// callers that find the lease empty wait for the renewal instead of racing it.
    pub(crate) renewing: tokio::sync::Mutex<()>,
}

impl Cell {
    /// The slot, locked.
    pub(crate) fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The leases of this instance.
pub(crate) struct Leases {
    /// One cell per leased key (counter and limits fingerprint).
    slots: Cache<(CounterKey, u64), Arc<Cell>>,
    /// Rate meters of `auto` keys.
    meters: Meters,
    /// Instances sharing the store.
    replicas: u64,
    /// Units of all open leases (the return loop has nothing to do at zero).
    held: AtomicI64,
    /// `sluice_local_decisions_total{layer="lease"}`, looked up once.
    pub(crate) decisions: Counter,
}

impl Leases {
    /// Leases for an instance among `replicas`.
    pub(crate) fn new(capacity: u64, replicas: u32, decisions: Counter) -> Self {
        Self {
            slots: Cache::new(capacity),
            meters: Meters::new(AUTO_MIN_RATE),
            replicas: u64::from(replicas.max(1)),
            held: AtomicI64::new(0),
            decisions,
        }
    }

    /// Units to lease for this check at `now`, or `None` to go to the store unleased.
    pub(crate) fn size(&self, lease: &Lease, check: &StoreCheck, now: Micros) -> Option<u64> {
        let [limit] = &check.limits[..] else {
            return None;
        };
        if check.cost == 0 || limit.algorithm == AlgorithmKind::SlidingLog {
            return None;
        }
        match lease.mode {
            LeaseMode::Off => None,
            LeaseMode::Units(units) => Some(u64::from(units)),
            LeaseMode::Auto => self
                .meters
                .hot(check.key, now)
                .then(|| (capacity(limit) / (16 * self.replicas)).clamp(1, MAX_AUTO_UNITS)),
        }
    }

    /// The cell of a check's key.
    pub(crate) fn cell(&self, check: &StoreCheck) -> Arc<Cell> {
        self.slots
            .get_with((check.key, fingerprint(&check.limits)), Default::default)
    }

    /// Moves the count of units held by `delta`.
    pub(crate) fn add_held(&self, delta: i64) {
        self.held.fetch_add(delta, Ordering::Relaxed);
    }

    /// Whether any lease holds units.
    pub(crate) fn any_held(&self) -> bool {
        self.held.load(Ordering::Relaxed) > 0
    }

    /// Every cell, for the return loop.
    pub(crate) fn cells(&self) -> Vec<Arc<Cell>> {
        self.slots.iter().map(|(_, slot)| slot).collect()
    }

    /// The documented bound of early refusal for a lease of `units` (see the module
    /// documentation).
    /// `lifetime` is the lease's own (see [`lifetime`]).
    pub(crate) fn bound(&self, limit: &LimitCheck, units: u64, lifetime: Micros) -> i64 {
        let others = (self.replicas - 1).saturating_mul(units);
        let reserve = match limit.algorithm {
            AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => {
                let per_lease =
                    lifetime as f64 * limit.quota.limit as f64 / limit.quota.period.max(1) as f64;
                (per_lease * self.replicas as f64).ceil() as u64
            }
            _ => 0,
        };
        i64::try_from(others.saturating_add(reserve)).unwrap_or(i64::MAX)
    }
}

/// Lifetime of a lease of `units` under `limit` with `lease_ttl` = `ttl`. Token bucket
/// and GCRA: at most the time the bucket takes to refill `units`, so that the refill
/// reserve never exceeds the lease itself (a fast bucket would otherwise pay
/// `rate × ttl` per lease). Window algorithms: `ttl` (the window end caps it later).
pub(crate) fn lifetime(limit: &LimitCheck, units: u64, ttl: Micros) -> Micros {
    match limit.algorithm {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra if limit.quota.limit > 0 => {
            let refill =
                u128::from(units) * u128::from(limit.quota.period) / u128::from(limit.quota.limit);
            ttl.min(u64::try_from(refill).unwrap_or(u64::MAX)).max(1)
        }
        _ => ttl,
    }
}

/// Units a limit can hold at once.
fn capacity(limit: &LimitCheck) -> u64 {
    match limit.algorithm {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => limit.quota.burst,
        _ => limit.quota.limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Quota;

    fn check(cost: u64) -> StoreCheck {
        StoreCheck {
            key: CounterKey(9),
            limits: vec![LimitCheck {
                algorithm: AlgorithmKind::FixedWindow,
                quota: Quota {
                    limit: 100,
                    period: 60_000_000,
                    burst: 100,
                    on_over_limit: Default::default(),
                },
                sharing: crate::regions::Sharing::Regional,
            }]
            .into(),
            cost,
            refund: false,
            max_wait: 0,
        }
    }

    fn grant(units: u64, window_left: Micros) -> LeaseGrant {
        LeaseGrant {
            decision: Decision {
                allowed: true,
                remaining: 89,
                reset_after: window_left,
                retry_after: 0,
                used: 11,
            },
            units,
            store_now: 5_000,
            window_left,
        }
    }

    #[test]
    fn a_lease_admits_until_spent_or_expired_and_never_past_the_window() {
        let request = LeaseRequest {
            check: check(1),
            units: 10,
            lifetime: 250_000,
            give_back: None,
        };
        let rule: Arc<str> = Arc::from("d.k");
        let mut slot = Slot::default();
        // The window ends 100 ms after the grant: the lease ends there, not at 250 ms.
        slot.renew(&request, &rule, &grant(10, 100_000), 1_000);
        assert_eq!(slot.take(4, 2_000).map(|d| d.remaining), Some(79 + 6));
        assert!(slot.take(7, 2_000).is_none(), "only 6 left");
        assert!(slot.take(1, 101_000).is_none(), "expired at the window end");
        assert!(slot.is_expired(101_000));
        assert_eq!(slot.give_back(), Some((6, 5_000, 250_000)));
        assert_eq!(slot.units, 0, "given-back units cannot be used");
        slot.restore(Some((6, 5_000, 250_000)));
        assert_eq!(slot.units, 6, "a return never sent restores them");
        let back = slot.return_request().expect("units to return");
        assert_eq!(back.check.cost, 0);
        assert_eq!(back.give_back, Some((6, 5_000, 250_000)));
    }

    /// A token bucket's reset grows by one unit's refill for each unit taken from the
    /// lease, as the store's would had each been charged alone; a window's stays.
    #[test]
    fn a_buckets_reset_grows_with_each_leased_unit_taken() {
        let rule: Arc<str> = Arc::from("d.k");
        for (algorithm, per_unit) in [
            (AlgorithmKind::TokenBucket, 600_000),
            (AlgorithmKind::Gcra, 600_000),
            (AlgorithmKind::FixedWindow, 0),
        ] {
            let mut request = LeaseRequest {
                check: check(1),
                units: 10,
                lifetime: 250_000,
                give_back: None,
            };
            request.check.limits = vec![LimitCheck {
                algorithm,
                ..request.check.limits[0]
            }]
            .into();
            let mut slot = Slot::default();
            // Granted at 1 000 with the request's reset 6.6 s away (11 units used).
            slot.renew(&request, &rule, &grant(10, 6_600_000), 1_000);
            let resets: Vec<Micros> = (0..3)
                .filter_map(|_| slot.take(1, 2_000).map(|d| d.reset_after))
                .collect();
            let base = 1_000 + 6_600_000 - 2_000;
            assert_eq!(
                resets,
                [base + per_unit, base + 2 * per_unit, base + 3 * per_unit],
                "{algorithm:?}"
            );
        }
    }

    #[test]
    fn auto_leases_keys_above_the_rate_threshold() {
        let leases = Leases::new(10, 4, Counter::default());
        let lease = Lease {
            mode: LeaseMode::Auto,
            ttl: 250_000,
        };
        let sizes: Vec<Option<u64>> = (0..AUTO_MIN_RATE)
            .map(|_| leases.size(&lease, &check(1), 3_000_000))
            .collect();
        assert_eq!(sizes[0], None);
        // 100 / (16 × 4) = 1.
        assert_eq!(sizes[(AUTO_MIN_RATE - 1) as usize], Some(1));
        assert_eq!(leases.bound(&check(1).limits[0], 10, 250_000), 30);
    }
}
