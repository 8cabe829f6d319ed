//! Property tests of refunds (negative hits, Envoy's `is_negative_hits`) for every
//! algorithm, through the public dispatch API (`algorithm::decide` and
//! `algorithm::refund`), on generated quotas and sequences of charges and refunds.

use proptest::prelude::*;
use sluice::algorithm::{decide, refund, AlgorithmKind, Decision, Micros, Quota, State};

const T0: Micros = 1_800_000_000_000_000;

fn kind() -> impl Strategy<Value = AlgorithmKind> {
    prop::sample::select(AlgorithmKind::ALL.to_vec())
}

fn quota() -> impl Strategy<Value = Quota> {
    crate::quotas::quota(sluice::algorithm::OnOverLimit::Refuse, true)
}

/// (time step in per-mille of the period, cost, whether it is a refund).
fn steps() -> impl Strategy<Value = Vec<(i64, u64, bool)>> {
    let step = prop_oneof![Just(0i64), Just(1000), 0..100i64, 0..2500i64];
    let cost = prop_oneof![Just(1u64), Just(0), 0..=35u64];
    prop::collection::vec((step, cost, prop::bool::weighted(0.3)), 1..80)
}

/// One call of a simulated sequence.
#[derive(Clone, Debug)]
struct Event {
    now: Micros,
    cost: u64,
    refund: bool,
    decision: Decision,
    after: State,
}

fn simulate(
    kind: AlgorithmKind,
    quota: &Quota,
    offset: u64,
    steps: &[(i64, u64, bool)],
) -> Vec<Event> {
    let mut state = State::fresh(kind);
    let mut now = T0 + offset;
    let mut events = Vec::new();
    for &(permille, cost, is_refund) in steps {
        now += (quota.period as i128 * permille as i128 / 1000) as Micros;
        let (decision, after) = if is_refund {
            refund(kind, &state, now, cost, quota)
        } else {
            decide(kind, &state, now, cost, quota)
        };
        events.push(Event {
            now,
            cost,
            refund: is_refund,
            decision,
            after: after.clone(),
        });
        state = after;
    }
    events
}

/// Units admitted minus units given back, at instants in `(from_excl, to_incl]`.
fn net(events: &[Event], from_excl: Micros, to_incl: Micros) -> i128 {
    events
        .iter()
        .filter(|e| e.now > from_excl && e.now <= to_incl)
        .map(|e| match (e.refund, e.decision.allowed) {
            (true, _) => -i128::from(e.cost),
            (false, true) => i128::from(e.cost),
            (false, false) => 0,
        })
        .sum()
}

/// The token bucket's deficit of `state` at `at` (the algorithm's own formula).
fn deficit_at(state: &State, at: Micros, quota: &Quota) -> f64 {
    let State::TokenBucket(s) = state else {
        return 0.0;
    };
    let refill = at.saturating_sub(s.last) as f64 * quota.limit as f64 / quota.period as f64;
    (s.deficit - refill).max(0.0)
}

proptest! {
    /// A refund is never refused, and never gives more than was charged: units
    /// admitted minus units given back stay within each algorithm's promise, over the
    /// same windows as without refunds; and no state, whatever was given back, admits
    /// what a fresh key would refuse (never above the burst, never below zero).
    #[test]
    fn refunds_never_let_through_more_than_was_charged(
        kind in kind(), quota in quota(), offset in 0..10_000u64, steps in steps(),
        probe in 0..=35u64,
    ) {
        let events = simulate(kind, &quota, offset, &steps);
        let (limit, p, burst) = (i128::from(quota.limit), quota.period, i128::from(quota.burst));
        for (i, e) in events.iter().enumerate() {
            if e.refund {
                prop_assert!(e.decision.allowed && e.decision.retry_after == 0, "{:?}", e);
            }
            let on_state = decide(kind, &e.after, e.now, probe, &quota).0;
            let on_fresh = decide(kind, &State::fresh(kind), e.now, probe, &quota).0;
            prop_assert!(!on_state.allowed || on_fresh.allowed, "{:?} after {:?}", on_state, e);
            if e.refund || !e.decision.allowed {
                continue;
            }
            let t = e.now;
            let window = t - t % p;
            match kind {
                AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow => {
                    prop_assert!(net(&events, window.saturating_sub(1), window + p - 1) <= limit);
                }
                AlgorithmKind::SlidingLog => {
                    prop_assert!(net(&events, t.saturating_sub(p), t) <= limit);
                }
                AlgorithmKind::Concurrency => {
                    prop_assert!(false, "kind() yields rate algorithms only");
                }
                AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => {
                    for earlier in events[..=i].iter().filter(|e| !e.refund && e.decision.allowed) {
                        let d = t - earlier.now;
                        let units = net(&events[..=i], earlier.now.saturating_sub(1), t);
                        let lhs = units * i128::from(p);
                        let rhs = burst * i128::from(p) + limit * i128::from(d);
                        prop_assert!(lhs <= rhs, "{} net units in {} µs", units, d);
                    }
                }
            }
        }
    }

    /// Charging `n` and then giving `n` back within one window leaves the state as if
    /// nothing had been charged: from then on it answers every request as the state
    /// before the charge does (the token bucket to within floating point rounding of
    /// its deficit).
    #[test]
    fn charge_then_refund_in_one_window_is_no_charge(
        kind in kind(), quota in quota(), offset in 0..10_000u64, steps in steps(),
        n in 0..=35u64, delay in 0..1000u64, probes in prop::collection::vec((0..3000u64, 0..=35u64), 1..8),
    ) {
        let events = simulate(kind, &quota, offset, &steps);
        let before = events.last().map_or_else(|| State::fresh(kind), |e| e.after.clone());
        let at = events.last().map_or(T0 + offset, |e| e.now);
        let p = quota.period;
        // The refund comes later in the same aligned window (so in the same rolling one).
        let window_end = at - at % p + p;
        let refund_at = at + (window_end - 1 - at) * delay / 1000;
        let (charge, charged) = decide(kind, &before, at, n, &quota);
        // Refused charges leave nothing to give back (except the fixed window's, which count).
        prop_assume!(charge.allowed || kind == AlgorithmKind::FixedWindow);
        let (_, after) = refund(kind, &charged, refund_at, n, &quota);
        for (later, cost) in probes {
            let probe_at = refund_at + p * later / 1000;
            let expected = decide(kind, &before, probe_at, cost, &quota).0;
            let actual = decide(kind, &after, probe_at, cost, &quota).0;
            if kind == AlgorithmKind::TokenBucket {
                let (a, b) = (deficit_at(&before, probe_at, &quota), deficit_at(&after, probe_at, &quota));
                prop_assert!((a - b).abs() <= 1e-9 * (1.0 + a.abs()), "deficit {} vs {}", b, a);
            } else {
                prop_assert_eq!(actual, expected, "probe at +{} cost {}", probe_at - refund_at, cost);
            }
        }
    }
}

/// A refund, algorithm by algorithm, as each module documents it.
#[test]
fn each_algorithm_gives_back_as_documented() {
    let q = Quota {
        limit: 10,
        period: 1_000_000,
        burst: 10,
        on_over_limit: Default::default(),
    };
    let t = T0;
    let run = |kind, ops: &[(Micros, u64, bool)]| {
        let mut state = State::fresh(kind);
        let mut last = Decision::default();
        for &(at, cost, is_refund) in ops {
            let op = if is_refund { refund } else { decide };
            (last, state) = op(kind, &state, at, cost, &q);
        }
        last
    };
    // Windows: subtract from the current window, never below zero; a past window's hits
    // are not given back.
    for kind in [AlgorithmKind::FixedWindow, AlgorithmKind::SlidingWindow] {
        let d = run(kind, &[(t, 6, false), (t + 1, 4, true)]);
        assert_eq!((d.allowed, d.used, d.remaining), (true, 2, 8), "{kind:?}");
        let d = run(kind, &[(t, 6, false), (t + 1, 9, true)]);
        assert_eq!(d.used, 0, "{kind:?} never below zero");
    }
    let d = run(
        AlgorithmKind::FixedWindow,
        &[
            (t, 6, false),
            (t + 1_000_000, 5, true),
            (t + 1_000_001, 0, false),
        ],
    );
    assert_eq!(d.used, 0, "a new window had nothing to give back");
    // Sliding log: the newest units leave.
    let d = run(
        AlgorithmKind::SlidingLog,
        &[
            (t, 4, false),
            (t + 500_000, 4, false),
            (t + 600_000, 6, true),
        ],
    );
    assert_eq!(
        (d.used, d.reset_after),
        (2, 400_000),
        "two oldest units stay"
    );
    // Token bucket: tokens back, never above the burst.
    let d = run(AlgorithmKind::TokenBucket, &[(t, 6, false), (t, 4, true)]);
    assert_eq!(d.remaining, 8);
    let d = run(AlgorithmKind::TokenBucket, &[(t, 6, false), (t, 60, true)]);
    assert_eq!((d.remaining, d.reset_after), (10, 0), "full, not fuller");
    // GCRA: the arrival time moves back, never before now.
    let d = run(AlgorithmKind::Gcra, &[(t, 6, false), (t, 4, true)]);
    assert_eq!((d.remaining, d.reset_after), (8, 200_000));
    let d = run(AlgorithmKind::Gcra, &[(t, 6, false), (t, 60, true)]);
    assert_eq!((d.remaining, d.reset_after), (10, 0));
}
