//! Property tests of delayed admissions (`max_delay`, `algorithm::decide_delayed`) on
//! the algorithms that delay (sliding log, token bucket, GCRA): a delayed admission is exactly the admission the request
//! would get at `now + wait`, the wait is the refusal's exact `retry_after` and never
//! above `max_wait`, and counting every admitted request at the instant it is answered,
//! each algorithm keeps its promise (a reservation is never a way past the limit).

use proptest::prelude::*;
use sluice::algorithm::{decide, decide_delayed, AlgorithmKind, Decision, Micros, Quota, State};

const T0: Micros = 1_800_000_000_000_000;

fn kind() -> impl Strategy<Value = AlgorithmKind> {
    prop::sample::select(vec![
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::SlidingLog,
    ])
}

fn quota() -> impl Strategy<Value = Quota> {
    crate::quotas::quota(sluice::algorithm::OnOverLimit::Refuse, false)
}

/// (time step in per-mille of the period, cost, max_wait in per-mille of the period).
fn steps() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    let step = prop_oneof![Just(0u64), 0..100u64, 0..1500u64];
    let cost = prop_oneof![Just(1u64), 0..=6u64];
    let wait = prop_oneof![Just(0u64), 0..3000u64];
    prop::collection::vec((step, cost, wait), 1..60)
}

/// One admitted request: when it is answered (after its wait) and its cost.
struct Admitted {
    at: Micros,
    cost: u64,
}

proptest! {
    #[test]
    fn a_delayed_admission_is_the_admission_at_its_instant(
        kind in kind(), quota in quota(), steps in steps(),
    ) {
        let mut state = State::fresh(kind);
        let mut now = T0;
        let mut admitted: Vec<Admitted> = Vec::new();
        for (permille, cost, wait_permille) in steps {
            now += quota.period * permille / 1000;
            let max_wait = quota.period * wait_permille / 1000;
            let (plain, plain_next) = decide(kind, &state, now, cost, &quota);
            let (decision, next) = decide_delayed(kind, &state, now, cost, &quota, max_wait);
            if plain.allowed && decision != plain {
                // A sliding log behind a reservation: the admission is dated with it,
                // and answered then, or refused when that is past max_wait.
                prop_assert_eq!(kind, AlgorithmKind::SlidingLog);
                let wait = decision.retry_after;
                prop_assert!(wait > 0);
                if decision.allowed {
                    prop_assert!(wait <= max_wait);
                    prop_assert_eq!(&next, &plain_next);
                } else {
                    prop_assert!(wait > max_wait);
                    prop_assert_eq!(&next, &state);
                }
            } else if plain.allowed || decision == plain {
                // Nothing to delay, or a wait too long: exactly the plain answer.
                prop_assert_eq!(decision, plain);
                prop_assert_eq!(&next, &plain_next);
            } else {
                let wait = plain.retry_after;
                prop_assert!(decision.allowed && wait > 0 && wait <= max_wait);
                prop_assert_eq!(decision.retry_after, wait);
                let (later, later_next) = decide(kind, &state, now + wait, cost, &quota);
                prop_assert!(later.allowed, "the wait is the exact earliest instant");
                prop_assert_eq!(&next, &later_next);
                prop_assert_eq!(decision.remaining, later.remaining);
                prop_assert_eq!(decision.reset_after, later.reset_after + wait);
                // One microsecond sooner it would not pass.
                let (sooner, _) = decide(kind, &state, now + wait - 1, cost, &quota);
                prop_assert!(!sooner.allowed);
            }
            if decision.allowed && cost > 0 {
                admitted.push(Admitted { at: now + decision.retry_after, cost });
            }
            state = next;
        }
        if kind == AlgorithmKind::SlidingLog {
            // Any rolling window of answers: at most the limit.
            for end in admitted.iter().map(|a| a.at) {
                let units: u64 = admitted
                    .iter()
                    .filter(|a| a.at + quota.period > end && a.at <= end)
                    .map(|a| a.cost)
                    .sum();
                prop_assert!(units <= quota.limit, "{} units in the window to {}", units, end);
            }
        } else {
            promise_kept(&quota, &admitted)?;
        }
    }
}

/// The buckets' promise over the instants requests are answered at.
fn promise_kept(quota: &Quota, admitted: &[Admitted]) -> Result<(), TestCaseError> {
    let units = |from_excl: Micros, to_incl: Micros| -> u64 {
        admitted
            .iter()
            .filter(|a| a.at > from_excl && a.at <= to_incl)
            .map(|a| a.cost)
            .sum()
    };
    for end in admitted.iter().map(|a| a.at) {
        // Buckets: over [start, end], at most burst + limit × (end - start) / period.
        for start in admitted.iter().map(|a| a.at).filter(|at| *at <= end) {
            let n = u128::from(units(start.saturating_sub(1), end));
            let bound = u128::from(quota.burst) * u128::from(quota.period)
                + u128::from(quota.limit) * u128::from(end - start);
            prop_assert!(
                n * u128::from(quota.period) <= bound,
                "{} units in [{}, {}]",
                n,
                start,
                end
            );
        }
    }
    Ok(())
}

#[test]
fn the_algorithms_that_delay_are_the_ones_a_rule_may_give_max_delay() {
    let delaying: Vec<AlgorithmKind> = AlgorithmKind::ALL
        .into_iter()
        .filter(|kind| kind.delays())
        .collect();
    assert_eq!(
        delaying,
        [
            AlgorithmKind::SlidingLog,
            AlgorithmKind::TokenBucket,
            AlgorithmKind::Gcra
        ]
    );
    // A window counter answers as without a delay.
    let quota = Quota {
        limit: 1,
        period: 1_000_000,
        burst: 1,
        on_over_limit: Default::default(),
    };
    let kind = AlgorithmKind::FixedWindow;
    let (_, state) = decide(kind, &State::fresh(kind), T0, 1, &quota);
    let plain: Decision = decide(kind, &state, T0, 1, &quota).0;
    assert_eq!(
        decide_delayed(kind, &state, T0, 1, &quota, 5_000_000).0,
        plain
    );
}
