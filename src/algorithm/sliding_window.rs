//! Sliding window counter: Cloudflare's two-counter estimate of a rolling window.
//!
//! Counters for the previous and the current epoch-aligned window; the units in the
//! rolling window ending now are estimated as if the previous window's hits were spread
//! evenly over it:
//!
//! ```text
//! weight   = (period - elapsed) / period      -- f64 division of two exact integers
//! estimate = prev * weight + curr             -- (prev * weight) first, then + curr
//! needed   = estimate + cost
//! allowed  = needed <= limit
//! ```
//!
//! `elapsed` is the time since the current window started. Only admitted requests are
//! charged (to `curr`).
//!
//! **Error bound against the exact rolling window** (sliding log), property tested:
//! 1. in any aligned window, admitted units ≤ `limit` (since `estimate ≥ curr`);
//! 2. over a rolling window `(t - period, t]` with `t` at `elapsed` into its aligned
//!    window, admitted units ≤ `limit × (1 + elapsed / period)`, so always `< 2 × limit`.
//!    The worst case is real: `limit` units at the very end of one window are weighed as
//!    if spread over it, so `limit × elapsed / period` more pass early in the next.
//!    With evenly spread traffic the estimate is exact.
//!
//! It errs the other way too: hits early in the previous window still weigh on the
//! current one, so it can refuse what the exact log would admit.
//!
//! `retry_after` is the exact earliest wait given the decay (searched with
//! [`earliest`] on the same predicate); a `cost > limit` can never pass and reports one
//! `period`. `reset_after` is the time until the estimate decays to 0.
//!
//! **`on_over_limit: charge`** (debt): a refused charge counts too, so `curr` can pass
//! the limit; each window then passes at most `limit` on to be the next one's previous
//! count and carries the rest, so the estimate pays a debt back at `limit` per window
//! (the plain roll when the count is within the limit).
//!
//! **Refund** (a negative hit): the current window's counter goes down by the units
//! given back, never below zero; the previous window's is never touched (what it let
//! through has been used).
//!
//! Memory per key: three integers (window start, previous and current count), 24 bytes.

use super::{earliest, is_invalid, to_u64, Algorithm, Decision, Micros, Quota};

/// Counters of the current and the previous epoch-aligned windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Start of the current window (a multiple of the period).
    pub(crate) window_start: Micros,
    /// Units admitted in the window before `window_start`.
    pub(crate) prev: u64,
    /// Units admitted since `window_start`.
    pub(crate) curr: u64,
}

/// The sliding window counter algorithm (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlidingWindow;

/// The state rolled forward to the window of `at`, and the estimate there.
struct Assessment {
    window_start: Micros,
    prev: u64,
    curr: u64,
    elapsed: Micros,
    needed: f64,
    allowed: bool,
}

/// Rolls `state` to the window containing `at` (`at ≥ state.window_start`) and evaluates
/// a request of `cost`. Lua mirrors this function exactly.
fn assess(state: &State, at: Micros, cost: u64, quota: &Quota) -> Assessment {
    let period = quota.period;
    let window_start = at - at % period;
    let (prev, curr) = if window_start <= state.window_start {
        // Same window (or a period change made the alignment move back): keep counts.
        (state.prev, state.curr)
    } else if quota.charges_always() {
        // Debt: each window passes `limit` of the count on to be the previous window's,
        // and carries the rest (the plain roll when the count is within the limit).
        // Lua: math.floor((window_start - state.window_start) / period), at least 1
        // (a period changed since the state was written can misalign them).
        let windows = ((window_start - state.window_start) / period).max(1);
        let limit = quota.limit;
        let passed = state
            .curr
            .saturating_sub(limit.saturating_mul(windows - 1))
            .min(limit);
        (
            passed,
            state.curr.saturating_sub(limit.saturating_mul(windows)),
        )
    } else if window_start == state.window_start.saturating_add(period) {
        (state.curr, 0)
    } else {
        (0, 0)
    };
    let elapsed = at - window_start;
    let weight = (period - elapsed) as f64 / period as f64;
    let estimate = prev as f64 * weight + curr as f64;
    let needed = estimate + cost as f64;
    Assessment {
        window_start,
        prev,
        curr,
        elapsed,
        needed,
        allowed: needed <= quota.limit as f64,
    }
}

impl Algorithm for SlidingWindow {
    type State = State;

    fn decide(state: &State, now: Micros, cost: u64, quota: &Quota) -> (Decision, State) {
        if is_invalid(quota) {
            return (Decision::invalid_quota(cost, quota), *state);
        }
        let period = quota.period;
        // A clock that stepped back is treated as being at the stored window's start;
        // waits are then reported from the real `now` (`skew` added).
        let at = now.max(state.window_start);
        let skew = at - now;
        let a = assess(state, at, cost, quota);
        let left = period - a.elapsed;
        let charged = a.allowed || quota.charges_always();
        let curr_after = if charged {
            a.curr.saturating_add(cost)
        } else {
            a.curr
        };
        let next = if charged && cost > 0 {
            State {
                window_start: a.window_start,
                prev: a.prev,
                curr: curr_after,
            }
        } else {
            *state
        };
        let reset_after = reset_after(skew, left, a.prev, curr_after, quota);
        let retry_after = if a.allowed {
            0
        } else if cost > quota.limit {
            period
        } else {
            // Against the state the decision leaves (a refused charge counts in debt).
            let guess = skew.saturating_add(guess_wait(&a, left, cost, quota));
            earliest(guess, |d| {
                let later = now.saturating_add(d).max(next.window_start);
                assess(&next, later, cost, quota).allowed
            })
        };
        let decision = Decision {
            allowed: a.allowed,
            // Lua: math.floor(limit - needed)
            remaining: if a.allowed {
                to_u64((quota.limit as f64 - a.needed).floor())
            } else {
                0
            },
            reset_after,
            retry_after,
            // Lua: math.ceil(needed)
            used: to_u64(a.needed.ceil()),
        };
        (decision, next)
    }

    fn refund(state: &State, now: Micros, units: u64, quota: &Quota) -> (Decision, State) {
        if is_invalid(quota) {
            return (Decision::refund_of_invalid_quota(), *state);
        }
        let period = quota.period;
        let at = now.max(state.window_start);
        let skew = at - now;
        let a = assess(state, at, 0, quota);
        let curr_after = a.curr.saturating_sub(units);
        let next = if curr_after != a.curr {
            State {
                window_start: a.window_start,
                prev: a.prev,
                curr: curr_after,
            }
        } else {
            *state
        };
        // The estimate after the refund, as `assess` computes it (Lua: the same call).
        let after = assess(&next, at, 0, quota);
        let left = period - after.elapsed;
        let reset_after = reset_after(skew, left, after.prev, after.curr, quota);
        let decision = Decision {
            allowed: true,
            remaining: to_u64((quota.limit as f64 - after.needed).floor()),
            reset_after,
            retry_after: 0,
            used: to_u64(after.needed.ceil()),
        };
        (decision, next)
    }

    fn expires_at(state: &State, quota: &Quota) -> Micros {
        let windows = if state.curr > 0 {
            windows_to_pass(state.curr, quota).saturating_add(1)
        } else if state.prev > 0 {
            1
        } else {
            0
        };
        state
            .window_start
            .saturating_add(quota.period.saturating_mul(windows))
    }
}

/// Until the estimate decays to zero, from a window with `left` to go (plus `skew`):
/// the current window's hits weigh on the window after the one that passes them on (the
/// next, or under debt the one where the count is within the limit); the previous
/// window's only until this one ends.
fn reset_after(skew: Micros, left: Micros, prev: u64, curr: u64, quota: &Quota) -> Micros {
    if curr > 0 {
        let windows = windows_to_pass(curr, quota);
        skew.saturating_add(left)
            .saturating_add(quota.period.saturating_mul(windows))
    } else if prev > 0 {
        skew.saturating_add(left)
    } else {
        0
    }
}

/// Window ends a current count of `curr` needs to be all passed on to a previous
/// window: 1, except in debt, where each passes `limit` on.
fn windows_to_pass(curr: u64, quota: &Quota) -> u64 {
    if !quota.charges_always() {
        return 1;
    }
    curr.div_ceil(quota.limit).max(1)
}

/// Closed-form estimate of the wait (only a starting point for [`earliest`], so its
/// rounding does not matter and Lua may use any formula): within the current window if
/// `curr + cost` fits, else in the next one, where `curr` becomes the decaying part.
fn guess_wait(a: &Assessment, left: Micros, cost: u64, quota: &Quota) -> Micros {
    let period = quota.period as f64;
    let limit = quota.limit as f64;
    let cost = cost as f64;
    let fits_now = a.curr as f64 + cost <= limit;
    if fits_now && a.prev > 0 {
        let room = limit - a.curr as f64 - cost;
        to_u64((left as f64 - room * period / a.prev as f64).ceil())
    } else if a.curr > 0 {
        let room = limit - cost;
        let within_next = (period - room * period / a.curr as f64).ceil();
        left.saturating_add(to_u64(within_next))
    } else {
        left
    }
}
