//! Fixed window: one counter per epoch-aligned window, envoyproxy/ratelimit's semantics.
//!
//! The window containing `now` starts at `now - now % period`. A request of `cost` takes the
//! counter to `count + cost` and is admitted iff that is ≤ `limit`. As in the reference,
//! the counter keeps the hits of refused requests too (so a client hammering an exhausted
//! limit stays `OVER_LIMIT` for the whole window). The reference's
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is the limiter's: it decides before it
//! charges (see [`crate::limiter`]).
//!
//! A request with `cost > limit` can never pass; it is refused and, like any refusal,
//! reports `retry_after = reset_after` (the end of the current window), the reference's
//! answer. Guarantee: at most `limit` units are admitted per aligned window, so at most
//! `2 × limit` over a rolling window straddling a boundary.
//!
//! **`on_over_limit: charge`** (debt): the count keeps growing past the limit, and a
//! window carries into the next what the count holds beyond `limit` (each window pays
//! `limit` back), so a debt of `n × limit` refuses the next `n` windows. `retry_after`
//! and `reset_after` are the starts of the windows where it is paid.
//!
//! **Refund** (a negative hit): the current window's count goes down by the units given
//! back, never below zero; a window that has ended gives nothing back.
//!
//! Memory per key: two integers (window start, count), 16 bytes.

use super::{Algorithm, Decision, Micros, Quota};

/// Fixed window counter for the current epoch-aligned window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Start of the window `count` belongs to (a multiple of the period).
    pub(crate) window_start: Micros,
    /// Units counted in that window, refused hits included (reference semantics).
    pub(crate) count: u64,
}

/// The fixed window algorithm (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FixedWindow;

impl Algorithm for FixedWindow {
    type State = State;

    fn decide(state: &State, now: Micros, cost: u64, quota: &Quota) -> (Decision, State) {
        // A limit of 0 is decided as any other (every hit refused and counted, reset at
        // the window's end), as in the reference; only a window of no length cannot be.
        if quota.period == 0 {
            return (Decision::invalid_quota(cost, quota), *state);
        }
        // Lua: window_start = now - now % period; a clock that stepped back stays in the
        // stored window (never reopens an earlier, emptier one).
        let window_start = (now - now % quota.period).max(state.window_start);
        let count = carried(state, window_start, quota);
        let count_after = count.saturating_add(cost);
        let allowed = count_after <= quota.limit;
        // Lua: until the window in which the count is paid back (1: this one's end).
        let until_window = |windows: u64| {
            window_start
                .saturating_add(quota.period.saturating_mul(windows))
                .saturating_sub(now)
        };
        let reset_after = until_window(windows_to_pay(count_after, quota));
        let retry_after = if allowed {
            0
        } else if quota.charges_always() && cost <= quota.limit {
            // The count (this charge included) must fall to `limit - cost`.
            until_window(windows_to_pay(
                count_after.saturating_add(cost) - quota.limit,
                quota,
            ))
        } else {
            until_window(1)
        };
        let decision = Decision {
            allowed,
            remaining: if allowed {
                quota.limit - count_after
            } else {
                0
            },
            reset_after,
            retry_after,
            used: count_after,
        };
        let counts = cost > 0;
        let next = if counts {
            State {
                window_start,
                count: count_after,
            }
        } else {
            *state
        };
        (decision, next)
    }

    fn refund(state: &State, now: Micros, units: u64, quota: &Quota) -> (Decision, State) {
        if quota.period == 0 {
            return (Decision::refund_of_invalid_quota(), *state);
        }
        // Lua: the same roll as `decide`; only the current window's count gives back.
        let window_start = (now - now % quota.period).max(state.window_start);
        let count = carried(state, window_start, quota);
        let count_after = count.saturating_sub(units);
        let windows = windows_to_pay(count_after, quota);
        let decision = Decision {
            allowed: true,
            remaining: quota.limit.saturating_sub(count_after),
            reset_after: window_start
                .saturating_add(quota.period.saturating_mul(windows))
                .saturating_sub(now),
            retry_after: 0,
            used: count_after,
        };
        let next = if count_after != count {
            State {
                window_start,
                count: count_after,
            }
        } else {
            *state
        };
        (decision, next)
    }

    fn expires_at(state: &State, quota: &Quota) -> Micros {
        let windows = windows_to_pay(state.count, quota);
        state
            .window_start
            .saturating_add(quota.period.saturating_mul(windows))
    }
}

/// The count of `state` in the window starting at `window_start` (≥ the state's): the
/// same window's count; in a later one 0, or under `on_over_limit: charge` what is left
/// of a debt once each window since has paid `limit` back.
fn carried(state: &State, window_start: Micros, quota: &Quota) -> u64 {
    if window_start == state.window_start {
        return state.count;
    }
    if !quota.charges_always() || quota.limit == 0 {
        return 0;
    }
    // Lua: math.floor((window_start - state.window_start) / period), exact below 2^53.
    let windows = (window_start - state.window_start) / quota.period;
    state
        .count
        .saturating_sub(quota.limit.saturating_mul(windows))
}

/// How many window ends (counting the current one's) a count of `count` needs to be
/// paid back: 1, except under `on_over_limit: charge`, where each window pays `limit`.
fn windows_to_pay(count: u64, quota: &Quota) -> u64 {
    if !quota.charges_always() || quota.limit == 0 {
        return 1;
    }
    count.div_ceil(quota.limit).max(1)
}
