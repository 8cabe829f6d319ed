//! A limit shared between regions by aggregation (`scope: global`, `sharing:
//! aggregate`): each region keeps its own count in its own store, publishes it to the
//! others (`crate::exchange`), and decides a charge against what is left of the
//! limit once the other regions' last known usage is taken out. `scripts/main.lua`
//! mirrors [`decide_shared`]; a test runs the same sequences through both.
//!
//! Only the window algorithms aggregate: their usage is a count per epoch-aligned window,
//! the same windows in every region, so another region's count of this window adds to
//! this one's. The others' states are a time (token bucket, GCRA) or a log of instants
//! (sliding log): their usage is not a count another region's can be added to.
//!
//! Another region's usage is read from its last published state, as of `now`:
//! - fixed window: its count, when its state is of the window containing `now`, else 0;
//! - sliding window: its estimate over the rolling window ending `now` (the same
//!   weighting as this region's, from its state rolled forward to `now`), rounded up.
//!
//! A region whose link is cut is taken to use at least its fallback share
//! (`crate::regions::RegionWeights::fallback_share`): the last state it published may be
//! far behind what it admits now.

use super::{decide, refund, to_u64, AlgorithmKind, Decision, Micros, Quota, State};

/// What this region knows of another region's usage of one limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Remote<'a> {
    /// Its last published state, if one arrived and has not expired.
    pub state: Option<&'a State>,
    /// Units it is taken to use whatever its state says (its fallback share while its
    /// link is cut; 0 while it is up).
    pub floor: u64,
}

/// Units another region used of the limit at `now`, by its published state `remote`
/// (see the module documentation; a state of another algorithm counts 0).
pub fn remote_used(remote: &State, now: Micros, quota: &Quota) -> u64 {
    let period = quota.period;
    if period == 0 {
        return 0;
    }
    let window_start = now - now % period;
    match remote {
        State::FixedWindow(s) if s.window_start == window_start => s.count,
        State::SlidingWindow(s) => {
            let (prev, curr) = if s.window_start == window_start {
                (s.prev, s.curr)
            } else if s.window_start.saturating_add(period) == window_start {
                (s.curr, 0)
            } else {
                (0, 0)
            };
            let weight = (period - (now - window_start)) as f64 / period as f64;
            // Lua: to_u64(ceil(prev * weight + curr)).
            to_u64((prev as f64 * weight + curr as f64).ceil())
        }
        _ => 0,
    }
}

/// Units the other regions take of the limit: each one's known usage, or its floor when
/// that is more (saturating).
pub fn taken_by_others(remotes: &[Remote<'_>], now: Micros, quota: &Quota) -> u64 {
    remotes.iter().fold(0u64, |taken, remote| {
        let used = remote
            .state
            .map_or(0, |state| remote_used(state, now, quota));
        taken.saturating_add(used.max(remote.floor))
    })
}

/// Decides a charge of `cost` (or, with `give_back`, a refund) on this region's
/// `state` of a limit shared by aggregation: against `limit` less what the other regions
/// take ([`taken_by_others`]), as [`decide`] (or [`refund`]) would with that limit. The
/// decision's `used` counts every region's units; the state returned is this region's
/// alone (only its own units are ever written).
pub fn decide_shared(
    kind: AlgorithmKind,
    state: &State,
    remotes: &[Remote<'_>],
    now: Micros,
    cost: u64,
    quota: &Quota,
    give_back: bool,
) -> (Decision, State) {
    let taken = taken_by_others(remotes, now, quota);
    let left = Quota {
        limit: quota.limit.saturating_sub(taken),
        ..*quota
    };
    let (mut decision, next) = if give_back {
        refund(kind, state, now, cost, &left)
    } else {
        decide(kind, state, now, cost, &left)
    };
    decision.used = decision.used.saturating_add(taken);
    (decision, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{fixed_window, sliding_window};

    const SECOND: Micros = 1_000_000;

    fn quota(limit: u64) -> Quota {
        Quota {
            limit,
            period: SECOND,
            burst: limit,
            on_over_limit: Default::default(),
        }
    }

    fn fixed(window_start: Micros, count: u64) -> State {
        State::FixedWindow(fixed_window::State {
            window_start,
            count,
        })
    }

    #[test]
    fn another_regions_count_of_this_window_leaves_the_rest() {
        let q = quota(100);
        let theirs = fixed(10 * SECOND, 70);
        let remotes = [Remote {
            state: Some(&theirs),
            floor: 0,
        }];
        let mut state = State::fresh(AlgorithmKind::FixedWindow);
        let now = 10 * SECOND + 5;
        let mut admitted = 0;
        for _ in 0..50 {
            let (decision, next) = decide_shared(
                AlgorithmKind::FixedWindow,
                &state,
                &remotes,
                now,
                1,
                &q,
                false,
            );
            admitted += u64::from(decision.allowed);
            state = next;
        }
        assert_eq!(admitted, 30);
        // A count of the window before counts nothing in this one.
        let (decision, _) = decide_shared(
            AlgorithmKind::FixedWindow,
            &State::fresh(AlgorithmKind::FixedWindow),
            &remotes,
            11 * SECOND,
            1,
            &q,
            false,
        );
        assert!(decision.allowed);
        assert_eq!(decision.remaining, 99);
    }

    #[test]
    fn a_cut_region_takes_its_fallback_share_or_what_it_used_if_more() {
        let q = quota(100);
        let little = fixed(0, 5);
        let much = fixed(0, 60);
        let floor = |state: &State| {
            let remotes = [Remote {
                state: Some(state),
                floor: 34,
            }];
            taken_by_others(&remotes, 10, &q)
        };
        assert_eq!(floor(&little), 34);
        assert_eq!(floor(&much), 60);
    }

    #[test]
    fn a_sliding_window_estimate_decays_with_the_previous_window() {
        let q = quota(100);
        let theirs = State::SlidingWindow(sliding_window::State {
            window_start: 0,
            prev: 0,
            curr: 40,
        });
        // A quarter into the next window, three quarters of their 40 still weigh.
        assert_eq!(remote_used(&theirs, SECOND + SECOND / 4, &q), 30);
        assert_eq!(remote_used(&theirs, SECOND / 2, &q), 40);
        assert_eq!(remote_used(&theirs, 3 * SECOND, &q), 0);
    }

    #[test]
    fn with_nothing_left_a_sliding_window_refuses() {
        let q = quota(10);
        let theirs = fixed(0, 0);
        let full = State::SlidingWindow(sliding_window::State {
            window_start: 0,
            prev: 0,
            curr: 12,
        });
        let remotes = [
            Remote {
                state: Some(&full),
                floor: 0,
            },
            Remote {
                state: Some(&theirs),
                floor: 0,
            },
        ];
        let (decision, _) = decide_shared(
            AlgorithmKind::SlidingWindow,
            &State::fresh(AlgorithmKind::SlidingWindow),
            &remotes,
            5,
            1,
            &q,
            false,
        );
        assert!(!decision.allowed);
        assert_eq!(decision.used, 13);
    }
}
