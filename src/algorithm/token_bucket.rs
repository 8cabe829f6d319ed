//! Token bucket: capacity `burst`, refilled lazily at `limit` tokens per `period`.
//!
//! The state stores the bucket's *deficit* (tokens missing from full) rather than its
//! tokens, so the all-zero default is a full bucket whatever the clock says. On every
//! decision (Lua mirrors the order exactly):
//!
//! ```text
//! elapsed = max(now - last, 0)                   -- integer µs; a clock stepping back
//!                                                --   refills nothing
//! refill  = elapsed * limit / period             -- f64: (elapsed * limit) / period
//! deficit = max(deficit - refill, 0)             -- f64
//! allowed = deficit + cost <= burst              -- f64: (deficit + cost) <= burst
//! charged: deficit = deficit + cost; last = max(now, last)
//! ```
//!
//! Only admitted requests are charged. `remaining = floor(burst - deficit)` after the
//! charge. `retry_after` is the exact earliest wait until `cost` tokens are there
//! ([`earliest`] over the same predicate). A `cost > burst` can never pass: it reports
//! the time to refill an empty bucket, `ceil(burst * period / limit)` (at least 1 µs), as
//! a finite "not within a full cycle" hint. `reset_after` is the time until full.
//!
//! Over any interval of length `d`, admitted units ≤ `burst + limit × d / period`.
//!
//! **`on_over_limit: charge`** (debt): a refused charge is taken too, so the deficit can
//! pass `burst`; it refills at the same rate, so a debt is paid back at exactly
//! `limit / period`.
//!
//! **Refund** (a negative hit): the tokens given back go into the bucket at once,
//! never above `burst` (the deficit goes down, never below zero).
//!
//! Memory per key: one `f64` deficit and one timestamp, 16 bytes.

use super::{earliest, is_invalid, to_u64, Algorithm, Decision, Micros, Quota};

/// A bucket's level as of `last`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct State {
    /// Tokens missing from a full bucket at `last` (0 = full), in `[0, burst]` for the
    /// quota that produced it. Fractional: refill is continuous.
    pub deficit: f64,
    /// Instant up to which refill is accounted for (never moves back).
    pub last: Micros,
}

/// The token bucket algorithm (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenBucket;

/// The deficit of `state` refilled up to `now`.
fn deficit_at(state: &State, now: Micros, quota: &Quota) -> f64 {
    let elapsed = now.saturating_sub(state.last);
    let refill = elapsed as f64 * quota.limit as f64 / quota.period as f64;
    (state.deficit - refill).max(0.0)
}

/// Whether a request of `cost` passes against `deficit`.
fn fits(deficit: f64, cost: u64, quota: &Quota) -> bool {
    deficit + cost as f64 <= quota.burst as f64
}

/// Closed form of the time for `state` to refill `tokens` past what it has at `now`
/// (a starting point for [`earliest`]; its rounding does not matter).
fn guess(state: &State, now: Micros, tokens: f64, quota: &Quota) -> Micros {
    let skew = state.last.saturating_sub(now);
    let wait = (tokens * quota.period as f64 / quota.limit as f64).ceil();
    skew.saturating_add(to_u64(wait))
}

impl Algorithm for TokenBucket {
    type State = State;

    fn decide(state: &State, now: Micros, cost: u64, quota: &Quota) -> (Decision, State) {
        if is_invalid(quota) {
            return (Decision::invalid_quota(cost, quota), *state);
        }
        let deficit = deficit_at(state, now, quota);
        let allowed = fits(deficit, cost, quota);
        // Debt (`on_over_limit: charge`): a refused charge is taken too.
        let charged = (allowed || quota.charges_always()) && cost > 0;
        let next = if charged {
            State {
                deficit: deficit + cost as f64,
                last: now.max(state.last),
            }
        } else {
            *state
        };
        let retry_after = if allowed {
            0
        } else if cost > quota.burst {
            let fill = quota.burst as f64 * quota.period as f64 / quota.limit as f64;
            to_u64(fill.ceil()).max(1)
        } else {
            // Against the state the decision leaves (its deficit at `now` is exact).
            let (basis, basis_deficit) = if charged {
                (&next, next.deficit)
            } else {
                (state, deficit)
            };
            let missing = basis_deficit + cost as f64 - quota.burst as f64;
            earliest(guess(basis, now, missing, quota), |d| {
                fits(deficit_at(basis, now.saturating_add(d), quota), cost, quota)
            })
        };
        let deficit_after = if charged { next.deficit } else { deficit };
        let reset_after = earliest(guess(&next, now, deficit_after, quota), |d| {
            deficit_at(&next, now.saturating_add(d), quota) <= 0.0
        });
        let decision = Decision {
            allowed,
            // Lua: math.floor(burst - deficit_after)
            remaining: if allowed {
                to_u64((quota.burst as f64 - deficit_after).floor())
            } else {
                0
            },
            reset_after,
            retry_after,
            // Lua: math.ceil(deficit + cost)
            used: to_u64((deficit + cost as f64).ceil()),
        };
        (decision, next)
    }

    fn refund(state: &State, now: Micros, units: u64, quota: &Quota) -> (Decision, State) {
        if is_invalid(quota) {
            return (Decision::refund_of_invalid_quota(), *state);
        }
        let deficit = deficit_at(state, now, quota);
        // Lua: deficit - units, then clamped at 0 (a full bucket holds `burst`).
        let deficit_after = (deficit - units as f64).max(0.0);
        let next = if units > 0 && deficit > 0.0 {
            State {
                deficit: deficit_after,
                last: now.max(state.last),
            }
        } else {
            *state
        };
        let reset_after = earliest(guess(&next, now, deficit_after, quota), |d| {
            deficit_at(&next, now.saturating_add(d), quota) <= 0.0
        });
        let decision = Decision {
            allowed: true,
            // Lua: math.floor(burst - deficit_after), math.ceil(deficit_after)
            remaining: to_u64((quota.burst as f64 - deficit_after).floor()),
            reset_after,
            retry_after: 0,
            used: to_u64(deficit_after.ceil()),
        };
        (decision, next)
    }

    fn expires_at(state: &State, quota: &Quota) -> Micros {
        if is_invalid(quota) || state.deficit <= 0.0 {
            return state.last;
        }
        let full = earliest(guess(state, state.last, state.deficit, quota), |d| {
            deficit_at(state, state.last.saturating_add(d), quota) <= 0.0
        });
        state.last.saturating_add(full)
    }
}
