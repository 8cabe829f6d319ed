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
        let count = if window_start == state.window_start {
            state.count
        } else {
            0
        };
        let window_end = window_start.saturating_add(quota.period);
        let reset_after = window_end.saturating_sub(now);
        let count_after = count.saturating_add(cost);
        let allowed = count_after <= quota.limit;
        let decision = Decision {
            allowed,
            remaining: if allowed {
                quota.limit - count_after
            } else {
                0
            },
            reset_after,
            retry_after: if allowed { 0 } else { reset_after },
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

    fn expires_at(state: &State, quota: &Quota) -> Micros {
        state.window_start.saturating_add(quota.period)
    }
}
