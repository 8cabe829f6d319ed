//! Property tests of the algorithm invariants, for every algorithm, through the public
//! dispatch API (`algorithm::decide`), on generated quotas and (time step, cost) sequences.

use proptest::prelude::*;
use sluice::algorithm::{
    decide, expires_at, refund, AlgorithmKind, Decision, Micros, OnOverLimit, Quota, State,
};

const T0: Micros = 1_800_000_000_000_000;
const KINDS: [AlgorithmKind; 5] = AlgorithmKind::ALL;

/// One decision of a simulated sequence.
#[derive(Clone, Debug)]
struct Event {
    now: Micros,
    cost: u64,
    decision: Decision,
    before: State,
    after: State,
}

fn kind() -> impl Strategy<Value = AlgorithmKind> {
    prop::sample::select(KINDS.to_vec())
}

fn quota() -> impl Strategy<Value = Quota> {
    let period = prop_oneof![
        1..=10u64,
        10..=10_000u64,
        Just(1_000_000u64),
        Just(3_000_000)
    ];
    (1..=20u64, period, 1..=30u64).prop_map(|(limit, period, burst)| Quota {
        limit,
        period,
        burst,
        on_over_limit: Default::default(),
    })
}

/// (time step in per-mille of the period, possibly negative, cost).
fn steps(back: bool) -> impl Strategy<Value = Vec<(i64, u64)>> {
    let lo = if back { -1500 } else { 0 };
    let step = prop_oneof![Just(0i64), Just(1000), 0..100i64, lo..2500i64];
    let cost = prop_oneof![Just(1u64), Just(0), 0..=35u64];
    prop::collection::vec((step, cost), 1..80)
}

/// Runs the steps from a fresh state at `T0 + offset`.
fn simulate(kind: AlgorithmKind, quota: &Quota, offset: u64, steps: &[(i64, u64)]) -> Vec<Event> {
    let mut state = State::fresh(kind);
    let mut now = T0 + offset;
    let mut events = Vec::new();
    for &(permille, cost) in steps {
        let dt = quota.period as i128 * permille as i128 / 1000;
        now = (now as i128 + dt).max(0) as Micros;
        let (decision, after) = decide(kind, &state, now, cost, quota);
        events.push(Event {
            now,
            cost,
            decision,
            before: state,
            after: after.clone(),
        });
        state = after;
    }
    events
}

/// Units a request can ever get at once: `limit` for windows, `burst` for buckets.
fn capacity(kind: AlgorithmKind, quota: &Quota) -> u64 {
    match kind {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => quota.burst,
        _ => quota.limit,
    }
}

fn admitted(events: &[Event], from_excl: Micros, to_incl: Micros) -> u64 {
    events
        .iter()
        .filter(|e| e.decision.allowed && e.now > from_excl && e.now <= to_incl)
        .map(|e| e.cost)
        .sum()
}

/// Brute-force exact rolling window: what a sliding log must answer.
fn log_model(quota: &Quota, steps: &[(Micros, u64)]) -> Vec<Decision> {
    let p = quota.period;
    let mut log: Vec<(Micros, u64)> = Vec::new();
    let sum_at = |log: &[(Micros, u64)], t: Micros| -> u64 {
        log.iter()
            .filter(|(at, _)| at + p > t)
            .map(|(_, c)| c)
            .sum()
    };
    let mut out = Vec::new();
    for &(now, cost) in steps {
        let used = sum_at(&log, now) + cost;
        let allowed = used <= quota.limit;
        let retry_after = if allowed {
            0
        } else if cost > quota.limit {
            p
        } else {
            let mut waits: Vec<Micros> = log
                .iter()
                .filter(|(at, _)| at + p > now)
                .map(|(at, _)| at + p - now)
                .collect();
            waits.sort();
            let fits = |d: &&Micros| sum_at(&log, now + **d) + cost <= quota.limit;
            *waits.iter().find(fits).expect("everything expires")
        };
        if allowed && cost > 0 {
            log.push((now, cost));
        }
        let live = log.iter().filter(|(at, _)| at + p > now);
        let reset_after = live.map(|(at, _)| at + p - now).max().unwrap_or(0);
        out.push(Decision {
            allowed,
            remaining: if allowed { quota.limit - used } else { 0 },
            reset_after,
            retry_after,
            used,
        });
    }
    out
}

proptest! {
    /// Admitted units never exceed what each algorithm promises over its windows.
    #[test]
    fn admitted_within_promised_windows(
        kind in kind(), quota in quota(), offset in 0..10_000u64, steps in steps(false),
    ) {
        let events = simulate(kind, &quota, offset, &steps);
        let (limit, p, burst) = (quota.limit, quota.period, quota.burst);
        for (i, e) in events.iter().enumerate().filter(|(_, e)| e.decision.allowed) {
            let t = e.now;
            let window = t - t % p;
            match kind {
                AlgorithmKind::FixedWindow => {
                    prop_assert!(admitted(&events, window.saturating_sub(1), window + p - 1) <= limit);
                }
                AlgorithmKind::SlidingLog => {
                    prop_assert!(admitted(&events, t.saturating_sub(p), t) <= limit);
                }
                AlgorithmKind::SlidingWindow => {
                    prop_assert!(admitted(&events, window.saturating_sub(1), t) <= limit);
                    // Rolling window (t - p, t]: ≤ limit × (1 + elapsed / period) < 2 × limit.
                    let extra = (u128::from(limit) * u128::from(t - window)).div_ceil(u128::from(p));
                    let rolling = admitted(&events, t.saturating_sub(p), t);
                    prop_assert!(u128::from(rolling) <= u128::from(limit) + extra,
                        "rolling {} limit {} extra {}", rolling, limit, extra);
                }
                AlgorithmKind::Concurrency => {
                    prop_assert!(false, "kind() yields rate algorithms only");
                }
                AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => {
                    // Over [t_j, t]: admitted ≤ burst + limit × (t - t_j) / period.
                    for earlier in events[..=i].iter().filter(|e| e.decision.allowed) {
                        let d = t - earlier.now;
                        let units: u64 = events[..=i].iter()
                            .filter(|e| e.decision.allowed && e.now >= earlier.now)
                            .map(|e| e.cost).sum();
                        let lhs = u128::from(units) * u128::from(p);
                        let rhs = u128::from(burst) * u128::from(p) + u128::from(limit) * u128::from(d);
                        prop_assert!(lhs <= rhs, "{} units in {} µs", units, d);
                    }
                }
            }
        }
    }

    /// The sliding log answers exactly what a brute-force rolling window does.
    #[test]
    fn sliding_log_matches_brute_force(
        quota in quota(), offset in 0..10_000u64, steps in steps(false),
    ) {
        let events = simulate(AlgorithmKind::SlidingLog, &quota, offset, &steps);
        let timed: Vec<_> = events.iter().map(|e| (e.now, e.cost)).collect();
        let model = log_model(&quota, &timed);
        for (e, m) in events.iter().zip(&model) {
            prop_assert_eq!(&e.decision, m, "at {} cost {}", e.now, e.cost);
            if let State::SlidingLog(log) = &e.after {
                prop_assert!(log.runs.len() as u64 <= quota.limit);
            }
        }
    }

    /// Refused: the same request at `now + retry_after` passes, and a microsecond
    /// earlier it does not (the wait is exact), when it can pass at all.
    #[test]
    fn retry_after_is_exact(
        kind in kind(), quota in quota(), offset in 0..10_000u64, steps in steps(false),
    ) {
        for e in simulate(kind, &quota, offset, &steps) {
            let d = e.decision;
            prop_assert_eq!(d.allowed, d.retry_after == 0, "{:?}", d);
            if d.allowed || e.cost > capacity(kind, &quota) {
                continue;
            }
            let later = decide(kind, &e.after, e.now + d.retry_after, e.cost, &quota).0;
            prop_assert!(later.allowed, "retry_after {} too short", d.retry_after);
            let early = decide(kind, &e.after, e.now + d.retry_after - 1, e.cost, &quota).0;
            prop_assert!(!early.allowed, "retry_after {} too long", d.retry_after);
        }
    }

    /// A refused request, except under fixed window's reference counting, and a
    /// zero-cost probe leave the state exactly as it was; a probe passes whenever a
    /// one-unit request would.
    #[test]
    fn refusals_and_probes_charge_nothing(
        kind in kind(), quota in quota(), offset in 0..10_000u64, steps in steps(true),
    ) {
        for e in simulate(kind, &quota, offset, &steps) {
            let counts_refused = kind == AlgorithmKind::FixedWindow;
            if e.cost == 0 || (!e.decision.allowed && !counts_refused) {
                prop_assert_eq!(&e.after, &e.before);
            }
            let probe = decide(kind, &e.before, e.now, 0, &quota);
            prop_assert_eq!(&probe.1, &e.before);
            if decide(kind, &e.before, e.now, 1, &quota).0.allowed {
                prop_assert!(probe.0.allowed);
            }
        }
    }

    /// A clock that stepped back never admits what the latest instant seen would refuse.
    #[test]
    fn clock_stepping_back_mints_nothing(
        kind in kind(), quota in quota(), offset in 0..10_000u64, steps in steps(true),
        cost in 0..=35u64,
    ) {
        let mut high = 0;
        for e in simulate(kind, &quota, offset, &steps) {
            high = high.max(e.now);
            let at_now = decide(kind, &e.after, e.now, cost, &quota).0;
            let at_high = decide(kind, &e.after, high, cost, &quota).0;
            prop_assert!(!at_now.allowed || at_high.allowed);
        }
    }

    /// From `expires_at` on, a state answers as a fresh one: the store may drop it.
    #[test]
    fn expired_state_answers_as_fresh(
        kind in kind(), quota in quota(), offset in 0..10_000u64, steps in steps(false),
        later in 0..3_000_000u64, cost in 0..=35u64,
    ) {
        let events = simulate(kind, &quota, offset, &steps);
        let last = events.last().expect("non-empty");
        let at = expires_at(&last.after, &quota).max(last.now) + later;
        let stored = decide(kind, &last.after, at, cost, &quota).0;
        let fresh = decide(kind, &State::fresh(kind), at, cost, &quota).0;
        prop_assert_eq!(stored, fresh);
    }

    /// A client retrying at `retry_after` gets the configured rate: exactly
    /// `burst + floor(d × limit / period)` units in `[0, d]` for GCRA (within one unit
    /// for the floating point token bucket). Requires `(burst - 1) × T ≥ 1 µs`: arrivals
    /// are whole microseconds, and without that much tolerance each one lands up to
    /// 1 µs after its ideal instant and the lateness accumulates (the bucket is full, or
    /// the TAT restarts from `now`), so the rate can only err on the low side.
    #[test]
    fn long_run_rate_is_configured_rate(
        gcra in any::<bool>(), quota in quota(), periods in 1..=20u64,
    ) {
        prop_assume!((quota.burst - 1) * quota.period >= quota.limit);
        let kind = if gcra { AlgorithmKind::Gcra } else { AlgorithmKind::TokenBucket };
        let end = T0 + periods * quota.period;
        let (mut state, mut now, mut units) = (State::fresh(kind), T0, 0u64);
        for _ in 0..10_000 {
            if now > end { break; }
            let (d, next) = decide(kind, &state, now, 1, &quota);
            state = next;
            units += u64::from(d.allowed);
            now += d.retry_after;
        }
        prop_assert!(now > end, "did not finish");
        let expected = quota.burst + periods * quota.limit;
        let slack = if gcra { 0 } else { 1 };
        prop_assert!(units.abs_diff(expected) <= slack, "{} vs {}", units, expected);
    }

    /// Any input at all, including zero and maximal values: no panic.
    #[test]
    fn never_panics(
        kind in kind(), limit in any::<u64>(), period in any::<u64>(), burst in any::<u64>(),
        debt in any::<bool>(),
        times in prop::collection::vec((any::<u64>(), any::<u64>(), any::<bool>()), 1..8),
    ) {
        let on_over_limit = if debt { OnOverLimit::Charge } else { OnOverLimit::Refuse };
        let quota = Quota { limit, period, burst, on_over_limit };
        let mut state = State::fresh(kind);
        for (now, cost, give_back) in times {
            let apply = if give_back { refund } else { decide };
            state = apply(kind, &state, now, cost, &quota).1;
            let _ = expires_at(&state, &quota);
        }
    }
}
