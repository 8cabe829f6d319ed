//! Token leasing (DESIGN §6, layer 3): for a rule with `lease: N` (or `lease: auto` and
//! a key this instance sees often), one store call decides the request and takes `N`
//! more units all-or-nothing; the instance then admits locally until they are spent or
//! the lease expires, and gives back what is unused with its next lease call or, once
//! expired, from the background return loop ([`Leases::expired`], run by the server
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
//!   (see `scripts/lease.lua`).
//! - **May refuse early** by at most the units sitting unused in other instances'
//!   leases: `(R − 1) × N`, plus `R × L × limit / period` of reserve for token bucket
//!   and GCRA, for at most `L` + [`RETURN_INTERVAL`] after a lease stops being used.
//!   Exported per rule as `sluice_lease_early_refusal_bound_units`; the units held now
//!   as `sluice_lease_outstanding_units`.
//! - A lease evicted from the bounded table ([`DEFAULT_CAPACITY`] keys) before it is
//!   returned keeps its units charged until its window ends or the bucket refills.
//!
//! `auto`: a key is leased once this instance has seen [`AUTO_MIN_RATE`] checks of it
//! within one second (the current or the previous); the lease size is
//! `capacity / (16 × R)` (at least 1, at most [`MAX_AUTO_UNITS`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use moka::sync::Cache;

use super::blocked::fingerprint;
use crate::algorithm::{AlgorithmKind, Decision, Micros, MICROS_PER_SECOND};
use crate::rules::{Lease, LeaseMode};
use crate::store::{CounterKey, LeaseGrant, LeaseRequest, LimitCheck, StoreCheck};

/// Most keys with a lease (or an `auto` rate meter) kept per instance.
pub const DEFAULT_CAPACITY: u64 = 10_000;

/// Checks per second from which `auto` leases a key.
pub const AUTO_MIN_RATE: u64 = 50;

/// Largest lease `auto` takes.
pub const MAX_AUTO_UNITS: u64 = 1_000;

/// How often the server returns the unused units of expired leases.
pub const RETURN_INTERVAL: Duration = Duration::from_millis(50);

/// One key's lease in this instance.
#[derive(Debug, Default)]
pub struct Slot {
    /// The check to return units with (cost 0).
    check: Option<StoreCheck>,
    /// Rule label for the gauges.
    rule: Option<Arc<str>>,
    /// Lease lifetime asked for.
    lifetime: Micros,
    /// Units not used yet.
    pub units: u64,
    /// Store time of the grant (the return script's reference).
    granted_at: Micros,
    /// Local instant the lease stops admitting.
    expires: Micros,
    /// Units the store had left after the grant (for `remaining` in answers).
    remaining_after: u64,
    /// Local instant the limit is whole again, as of the grant.
    reset_at: Micros,
    /// The limit (for `used` in answers).
    limit: u64,
}

impl Slot {
    /// Takes `cost` from a live lease; the decision to answer, if it had enough.
    pub fn take(&mut self, cost: u64, now: Micros) -> Option<Decision> {
        if cost == 0 || now >= self.expires || self.units < cost {
            return None;
        }
        self.units -= cost;
        let remaining = self.remaining_after.saturating_add(self.units);
        Some(Decision {
            allowed: true,
            remaining,
            reset_after: self.reset_at.saturating_sub(now),
            retry_after: 0,
            used: self.limit.saturating_sub(remaining),
        })
    }

    /// The unused units to give back with the next call, and the grant's store time.
    pub fn give_back(&self) -> Option<(u64, Micros)> {
        (self.units > 0).then_some((self.units, self.granted_at))
    }

    /// Whether this slot holds units that can no longer be used at `now`.
    pub fn is_expired(&self, now: Micros) -> bool {
        self.units > 0 && now >= self.expires
    }

    /// The call returning this slot's unused units, if any.
    pub fn return_request(&self) -> Option<LeaseRequest> {
        let mut check = self.check.clone()?;
        check.cost = 0;
        Some(LeaseRequest {
            check,
            units: 0,
            lifetime: self.lifetime,
            give_back: self.give_back(),
        })
    }

    /// The rule label of this slot.
    pub fn rule(&self) -> Option<&Arc<str>> {
        self.rule.as_ref()
    }

    /// Replaces the lease after a lease call sent at `sent` answered `grant`.
    pub fn renew(
        &mut self,
        request: &LeaseRequest,
        rule: &Arc<str>,
        grant: &LeaseGrant,
        sent: Micros,
    ) {
        let life = match grant.window_left {
            0 => request.lifetime,
            left => request.lifetime.min(left),
        };
        let limit = request.check.limits.first().map_or(0, |l| l.quota.limit);
        *self = Self {
            check: Some(request.check.clone()),
            rule: Some(rule.clone()),
            lifetime: request.lifetime,
            units: grant.units,
            granted_at: grant.store_now,
            expires: sent.saturating_add(life),
            remaining_after: grant.decision.remaining.saturating_sub(grant.units),
            reset_at: sent.saturating_add(grant.decision.reset_after),
            limit,
        };
    }
}

/// Checks of one key this instance saw, per second (for `auto`).
#[derive(Debug, Default)]
struct Meter {
    second: u64,
    count: u64,
    previous: u64,
}

/// The leases of this instance.
pub struct Leases {
    /// One slot per leased key (counter and limits fingerprint); async lock, held
    /// across the lease call so one instance renews a key once at a time.
    slots: Cache<(CounterKey, u64), Arc<tokio::sync::Mutex<Slot>>>,
    /// Rate meters of `auto` keys.
    meters: Cache<(CounterKey, u64), Arc<Mutex<Meter>>>,
    /// Instances sharing the store.
    replicas: u64,
}

impl Leases {
    /// Leases for an instance among `replicas`.
    pub fn new(capacity: u64, replicas: u32) -> Self {
        Self {
            slots: Cache::new(capacity),
            meters: Cache::new(capacity),
            replicas: u64::from(replicas.max(1)),
        }
    }

    /// Units to lease for this check at `now`, or `None` to go to the store unleased.
    pub fn size(&self, lease: &Lease, check: &StoreCheck, now: Micros) -> Option<u64> {
        let [limit] = check.limits.as_slice() else {
            return None;
        };
        if check.cost == 0 || limit.algorithm == AlgorithmKind::SlidingLog {
            return None;
        }
        match lease.mode {
            LeaseMode::Off => None,
            LeaseMode::Units(units) => Some(u64::from(units)),
            LeaseMode::Auto => {
                let meter = self
                    .meters
                    .get_with((check.key, fingerprint(&check.limits)), Default::default);
                let mut meter = meter.lock().unwrap_or_else(PoisonError::into_inner);
                let second = now / MICROS_PER_SECOND;
                if second != meter.second {
                    meter.previous = if second == meter.second + 1 {
                        meter.count
                    } else {
                        0
                    };
                    (meter.second, meter.count) = (second, 0);
                }
                meter.count += 1;
                (meter.count.max(meter.previous) >= AUTO_MIN_RATE)
                    .then(|| (capacity(limit) / (16 * self.replicas)).clamp(1, MAX_AUTO_UNITS))
            }
        }
    }

    /// The slot of a check's key.
    pub fn slot(&self, check: &StoreCheck) -> Arc<tokio::sync::Mutex<Slot>> {
        self.slots
            .get_with((check.key, fingerprint(&check.limits)), Default::default)
    }

    /// Every slot, for the return loop.
    pub fn slots(&self) -> Vec<Arc<tokio::sync::Mutex<Slot>>> {
        self.slots.iter().map(|(_, slot)| slot).collect()
    }

    /// The documented bound of early refusal for a lease of `units` (see the module
    /// documentation).
    pub fn bound(&self, limit: &LimitCheck, units: u64, lifetime: Micros) -> i64 {
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

/// Units a limit can hold at once.
fn capacity(limit: &LimitCheck) -> u64 {
    match limit.algorithm {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => limit.quota.burst,
        _ => limit.quota.limit,
    }
}
