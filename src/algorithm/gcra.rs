//! GCRA: the generic cell rate algorithm (the leaky bucket as a meter), as in governor.
//!
//! One timestamp, the theoretical arrival time (TAT) of the next unit; emission interval
//! `T = period / limit`; tolerance `τ = burst × T`. A request of `cost` at `now`:
//!
//! ```text
//! new_tat = max(tat, now) + cost × T
//! allowed = new_tat - now <= τ
//! ```
//!
//! so a fresh key admits `burst` units at once, then one per `T`. Only admitted requests
//! move the TAT. Over any interval of length `d`, admitted units ≤ `burst + d / T`.
//!
//! **Exact arithmetic.** `T` is rarely a whole number of microseconds, and rounding it would
//! skew the long-run rate, so instants are kept in mixed radix: `us + frac / limit` with
//! `0 ≤ frac < limit`. With `q = floor(period / limit)` and `r = period % limit`,
//! `n × T = n×q + floor(n×r / limit)` µs `+ (n×r % limit) / limit`. Every intermediate is
//! an integer below 2^53 as long as `burst × limit < 2^53` and TATs are realistic, so Lua
//! computes the same bits (`math.floor(x / limit)` is exact for integers below 2^53).
//! Only the informational `remaining`/`used` use `f64`:
//! `units_ahead = ((new_tat_us - now) * limit + new_tat_frac) / period` (that order).
//!
//! `retry_after = ceil(new_tat - now - τ)`, the exact earliest wait; a `cost > burst`
//! can never pass and reports `ceil(τ)` (the time to drain a full bucket, at least 1 µs).
//! `reset_after = ceil(tat - now)` after the decision (until the bucket is empty).
//!
//! **`on_over_limit: charge`** (debt): a refused charge moves the TAT too (even past
//! `now + τ`), and the TAT only comes back with time, so a debt is paid back at exactly
//! one unit per `T`; `retry_after` counts the refused request's own charge.
//!
//! **Refund** (a negative hit): the TAT moves back by `units × T`, never before now
//! (a bucket cannot hold more than `burst`).
//!
//! Memory per key: one mixed-radix timestamp (µs and fraction), 16 bytes.

use super::{is_invalid, to_u64, Algorithm, Decision, Micros, Quota};

/// The theoretical arrival time `tat + frac / limit` (µs since the epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Whole microseconds of the TAT.
    pub(crate) tat: Micros,
    /// Fraction of a microsecond, in units of `1 / limit` (normally `< limit`).
    pub(crate) frac: u64,
}

/// The GCRA algorithm (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Gcra;

/// A duration or instant in mixed radix: `us + frac / limit`, `frac < limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Mixed {
    us: u64,
    frac: u64,
}

impl Mixed {
    /// `n × T` for `T = period / limit`.
    fn intervals(n: u64, quota: &Quota) -> Self {
        let (q, r) = (quota.period / quota.limit, quota.period % quota.limit);
        let nr = n.saturating_mul(r);
        Self {
            us: n.saturating_mul(q).saturating_add(nr / quota.limit),
            frac: nr % quota.limit,
        }
    }

    fn add(self, other: Self, quota: &Quota) -> Self {
        let frac = self.frac.saturating_add(other.frac);
        let (carry, frac) = if frac >= quota.limit {
            (1, frac - quota.limit)
        } else {
            (0, frac)
        };
        Self {
            us: self.us.saturating_add(other.us).saturating_add(carry),
            frac,
        }
    }

    /// `self - other`, saturating at zero.
    fn sub(self, other: Self, quota: &Quota) -> Self {
        if self <= other {
            return Self { us: 0, frac: 0 };
        }
        if self.frac >= other.frac {
            Self {
                us: self.us - other.us,
                frac: self.frac - other.frac,
            }
        } else {
            Self {
                us: self.us - other.us - 1,
                frac: self.frac.saturating_add(quota.limit - other.frac),
            }
        }
    }

    /// Rounded up to whole microseconds.
    fn ceil(self) -> Micros {
        self.us.saturating_add(u64::from(self.frac > 0))
    }

    /// This duration in units of `T` (`f64`, for `remaining`/`used` only).
    fn in_intervals(self, quota: &Quota) -> f64 {
        (self.us as f64 * quota.limit as f64 + self.frac as f64) / quota.period as f64
    }
}

/// The stored TAT, normalized in case the limit changed since it was written.
fn tat_of(state: &State, quota: &Quota) -> Mixed {
    Mixed {
        us: state.tat.saturating_add(state.frac / quota.limit),
        frac: state.frac % quota.limit,
    }
}

/// The state to store and the TAT it keeps: `new_tat` when the cost is `charged`, else
/// `state` unchanged (its TAT read as `base`, at least now).
fn charged_or_not(state: &State, base: Mixed, new_tat: Mixed, charged: bool) -> (State, Mixed) {
    if charged {
        let next = State {
            tat: new_tat.us,
            frac: new_tat.frac,
        };
        (next, new_tat)
    } else {
        (*state, base)
    }
}

impl Algorithm for Gcra {
    type State = State;

    fn decide(state: &State, now: Micros, cost: u64, quota: &Quota) -> (Decision, State) {
        if is_invalid(quota) {
            return (Decision::invalid_quota(cost, quota), *state);
        }
        let now_m = Mixed { us: now, frac: 0 };
        let tat = tat_of(state, quota);
        let base = tat.max(now_m);
        let tau = Mixed::intervals(quota.burst, quota);
        let new_tat = base.add(Mixed::intervals(cost, quota), quota);
        if cost > quota.burst {
            let ahead = base.sub(now_m, quota).in_intervals(quota);
            // Debt (`on_over_limit: charge`): even a cost that can never pass is taken.
            let (next, kept) = charged_or_not(state, base, new_tat, quota.charges_always());
            let decision = Decision {
                allowed: false,
                remaining: 0,
                reset_after: kept.sub(now_m, quota).ceil(),
                retry_after: tau.ceil().max(1),
                used: to_u64((ahead + cost as f64).ceil()),
            };
            return (decision, next);
        }
        let ahead = new_tat.sub(now_m, quota);
        let allowed = ahead <= tau;
        let units_ahead = ahead.in_intervals(quota);
        let charged = (allowed || quota.charges_always()) && cost > 0;
        let (next, kept) = charged_or_not(state, base, new_tat, charged);
        let decision = Decision {
            allowed,
            // Lua: math.floor(burst - units_ahead)
            remaining: if allowed {
                to_u64((quota.burst as f64 - units_ahead).floor())
            } else {
                0
            },
            reset_after: kept.sub(now_m, quota).ceil(),
            retry_after: if allowed {
                0
            } else if charged {
                // The same request again, after this one's charge.
                ahead
                    .add(Mixed::intervals(cost, quota), quota)
                    .sub(tau, quota)
                    .ceil()
            } else {
                ahead.sub(tau, quota).ceil()
            },
            // Lua: math.ceil(units_ahead)
            used: to_u64(units_ahead.ceil()),
        };
        (decision, next)
    }

    fn refund(state: &State, now: Micros, units: u64, quota: &Quota) -> (Decision, State) {
        if is_invalid(quota) {
            return (Decision::refund_of_invalid_quota(), *state);
        }
        let now_m = Mixed { us: now, frac: 0 };
        let tat = tat_of(state, quota);
        // The TAT moves back by `units × T`, never before now.
        let back = tat.sub(Mixed::intervals(units, quota), quota).max(now_m);
        let (next, kept) = if back < tat {
            let next = State {
                tat: back.us,
                frac: back.frac,
            };
            (next, back)
        } else {
            (*state, tat.max(now_m))
        };
        let ahead = kept.sub(now_m, quota);
        let units_ahead = ahead.in_intervals(quota);
        let decision = Decision {
            allowed: true,
            remaining: to_u64((quota.burst as f64 - units_ahead).floor()),
            reset_after: ahead.ceil(),
            retry_after: 0,
            used: to_u64(units_ahead.ceil()),
        };
        (decision, next)
    }

    fn expires_at(state: &State, quota: &Quota) -> Micros {
        if is_invalid(quota) {
            return state.tat;
        }
        tat_of(state, quota).ceil()
    }
}
