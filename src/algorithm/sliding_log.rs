//! Sliding log: an exact rolling window.
//!
//! A request of `cost` at `now` is admitted iff the units admitted in `(now - period, now]`
//! plus `cost` are ≤ `limit`; only admitted requests are logged. The log is a sorted list
//! of runs `(instant, units)`, one per instant with admissions, pruned on every decision,
//! so it never holds more runs than `limit` (each holds at least one unit; limits above
//! `MAX_SLIDING_LOG_LIMIT` (1 000) are rejected at rule load).
//!
//! A clock that stepped back is treated as being at the newest run's instant (elapsed
//! clamped at zero), so the log stays sorted and nothing expires early.
//!
//! `retry_after` is the time until enough of the oldest units leave the window (a unit
//! logged at `t` leaves it at `t + period`); a `cost > limit` can never pass and reports
//! one `period`. `reset_after` is the time until the newest run leaves the window.
//!
//! **Refund** (a negative hit): the newest units of the live log leave it, as many as
//! are given back (all of them at most); units that have left the window are gone.
//!
//! Memory per key: 16 bytes per run plus a 24-byte `Vec` header (boxed in
//! [`super::State`]); at most `limit` runs, so ≤ 16 × limit + 24 bytes. Redis keeps
//! the same log as a sorted set with one member per unit (`scripts/sliding_log.lua`),
//! where a check costs O(log n) and each unit in the window takes about 30 bytes (a
//! listpack, up to 128 units) to 90 (a skiplist).

use super::{is_invalid, Algorithm, Decision, Micros, Quota};

/// Units admitted at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// When the units were admitted.
    pub(crate) at: Micros,
    /// How many units (≥ 1).
    pub(crate) units: u64,
}

/// The admissions still inside the rolling window, oldest first, one run per instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Runs sorted by strictly increasing `at`, each with `units ≥ 1`.
    pub runs: Vec<Run>,
}

/// The sliding log algorithm (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlidingLog;

/// The log's instant at `now` (the newest run's, for a clock that stepped back) and the
/// index of its first run still in the window there: a run at `t` is inside
/// `(at - period, at]` iff `t + period > at`.
fn live_runs(state: &State, now: Micros, period: Micros) -> (Micros, usize) {
    let newest = state.runs.last().map_or(0, |run| run.at);
    let at = now.max(newest);
    let live = state
        .runs
        .iter()
        .position(|run| run.at.saturating_add(period) > at)
        .unwrap_or(state.runs.len());
    (at, live)
}

impl Algorithm for SlidingLog {
    type State = State;

    fn decide(state: &State, now: Micros, cost: u64, quota: &Quota) -> (Decision, State) {
        if is_invalid(quota) {
            return (Decision::invalid_quota(cost, quota), state.clone());
        }
        let period = quota.period;
        let (at, live) = live_runs(state, now, period);
        let runs = &state.runs[live..];
        let in_window = runs
            .iter()
            .fold(0u64, |sum, run| sum.saturating_add(run.units));
        let used = in_window.saturating_add(cost);
        let allowed = used <= quota.limit;
        let retry_after = if allowed {
            0
        } else if cost > quota.limit {
            period
        } else {
            // The oldest units must leave until `used - limit` are gone.
            let excess = used - quota.limit;
            let mut freed = 0u64;
            let mut wait = period;
            for run in runs {
                freed = freed.saturating_add(run.units);
                if freed >= excess {
                    wait = run.at.saturating_add(period).saturating_sub(now);
                    break;
                }
            }
            wait
        };
        let newest_after = if allowed && cost > 0 {
            Some(at)
        } else {
            runs.last().map(|run| run.at)
        };
        let reset_after = newest_after.map_or(0, |t| t.saturating_add(period).saturating_sub(now));
        let decision = Decision {
            allowed,
            remaining: if allowed { quota.limit - used } else { 0 },
            reset_after,
            retry_after,
            used,
        };
        if !allowed || cost == 0 {
            return (decision, state.clone());
        }
        let mut next = Vec::with_capacity(runs.len() + 1);
        next.extend_from_slice(runs);
        match next.last_mut() {
            Some(last) if last.at == at => last.units = last.units.saturating_add(cost),
            _ => next.push(Run { at, units: cost }),
        }
        (decision, State { runs: next })
    }

    fn refund(state: &State, now: Micros, units: u64, quota: &Quota) -> (Decision, State) {
        if is_invalid(quota) {
            return (Decision::refund_of_invalid_quota(), state.clone());
        }
        let period = quota.period;
        let (_, live) = live_runs(state, now, period);
        let mut runs = state.runs[live..].to_vec();
        // The newest units of the live log leave first.
        let mut left = units;
        while left > 0 {
            match runs.last_mut() {
                Some(run) if run.units > left => {
                    run.units -= left;
                    left = 0;
                }
                Some(run) => {
                    left -= run.units;
                    runs.pop();
                }
                None => break,
            }
        }
        let removed = units - left;
        let in_window = runs
            .iter()
            .fold(0u64, |sum, run| sum.saturating_add(run.units));
        let reset_after = runs
            .last()
            .map_or(0, |run| run.at.saturating_add(period).saturating_sub(now));
        let decision = Decision {
            allowed: true,
            remaining: quota.limit.saturating_sub(in_window),
            reset_after,
            retry_after: 0,
            used: in_window,
        };
        if removed == 0 {
            return (decision, state.clone());
        }
        (decision, State { runs })
    }

    fn expires_at(state: &State, quota: &Quota) -> Micros {
        state
            .runs
            .last()
            .map_or(0, |run| run.at.saturating_add(quota.period))
    }
}
