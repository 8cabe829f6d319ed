//! Known sequences for each algorithm and the dispatch enum; the invariants are property
//! tested in `tests/properties/algorithm_props.rs`.

use super::*;

const S: Micros = MICROS_PER_SECOND;
/// A realistic epoch instant, aligned to a day.
const T0: Micros = 1_800_000_000 * S - (1_800_000_000 * S) % (86_400 * S);

fn quota(limit: u64, period: Micros, burst: u64) -> Quota {
    Quota {
        limit,
        period,
        burst,
        on_over_limit: Default::default(),
    }
}

/// Runs `(now, cost)` steps through `A`, returning the decisions.
fn run<A: Algorithm>(quota: &Quota, steps: &[(Micros, u64)]) -> Vec<Decision> {
    let mut state = A::State::default();
    steps
        .iter()
        .map(|&(now, cost)| {
            let (decision, next) = A::decide(&state, now, cost, quota);
            state = next;
            decision
        })
        .collect()
}

#[test]
fn state_is_small() {
    assert!(
        std::mem::size_of::<State>() <= 48,
        "{}",
        std::mem::size_of::<State>()
    );
}

#[test]
fn token_bucket_burst_then_one_per_second() {
    let q = quota(1, S, 5);
    let mut steps = vec![(T0, 1); 6];
    steps.push((T0 + S, 1));
    let d = run::<token_bucket::TokenBucket>(&q, &steps);
    assert!(d[..5].iter().all(|d| d.allowed));
    assert_eq!(d[4].remaining, 0);
    assert!(!d[5].allowed);
    assert_eq!(d[5].retry_after, S);
    assert!(d[6].allowed);
    assert_eq!(d[6].reset_after, 5 * S);
}

#[test]
fn gcra_burst_then_one_per_interval() {
    let q = quota(1, S, 5);
    let mut steps = vec![(T0, 1); 6];
    steps.extend([(T0 + S, 1), (T0 + S, 1)]);
    let d = run::<gcra::Gcra>(&q, &steps);
    assert!(d[..5].iter().all(|d| d.allowed));
    assert_eq!(
        d.iter().map(|d| d.remaining).collect::<Vec<_>>(),
        [4, 3, 2, 1, 0, 0, 0, 0]
    );
    assert!(!d[5].allowed);
    assert_eq!(d[5].retry_after, S);
    assert!(d[6].allowed);
    assert!(!d[7].allowed);
}

#[test]
fn gcra_fractional_interval_is_exact() {
    // 3 per second, burst 2: T = 333 333.33 µs. A client retrying exactly at
    // `retry_after` gets the burst, then one unit at each ceil(k × T): 2 + 3000 units in
    // 1000 s. A whole-µs T would drift by a unit every 333 333 requests or so.
    let q = quota(3, S, 2);
    let (mut state, mut now, mut admitted) = (gcra::State::default(), T0, 0);
    while now <= T0 + 1000 * S {
        let (d, next) = <gcra::Gcra as Algorithm>::decide(&state, now, 1, &q);
        state = next;
        admitted += u64::from(d.allowed);
        now += d.retry_after;
    }
    assert_eq!(admitted, 3002);
}

#[test]
fn fixed_window_reference_semantics() {
    let q = quota(2, 60 * S, 2);
    let d = run::<fixed_window::FixedWindow>(
        &q,
        &[
            (T0, 1),
            (T0 + 1, 1),
            (T0 + 2, 1),
            (T0 + 3, 0),
            (T0 + 60 * S, 1),
        ],
    );
    assert_eq!(d[0].remaining, 1);
    assert!(d[1].allowed && d[1].remaining == 0);
    assert!(!d[2].allowed);
    assert_eq!(d[2].used, 3);
    assert_eq!(d[2].retry_after, 60 * S - 2);
    // The refused hit counted: a probe is over limit too.
    assert!(!d[3].allowed);
    assert!(d[4].allowed);
}

#[test]
fn sliding_window_weighs_previous_window() {
    let q = quota(10, 60 * S, 10);
    // 10 at the end of one window, then a quarter into the next: estimate 7.5.
    let d = run::<sliding_window::SlidingWindow>(
        &q,
        &[(T0 + 59 * S, 10), (T0 + 75 * S, 2), (T0 + 75 * S, 1)],
    );
    assert!(d[0].allowed);
    assert!(d[1].allowed);
    assert_eq!(d[1].remaining, 0); // floor(10 - 7.5 - 2)
    assert!(!d[2].allowed);
    // 7.5 + 2 + 1 ≤ 10 once prev weighs ≤ 7: after 18 s more (weight 0.7 at 78 s).
    assert_eq!(d[2].retry_after, 3 * S);
}

#[test]
fn sliding_log_is_exact() {
    let q = quota(2, 10 * S, 2);
    let d = run::<sliding_log::SlidingLog>(
        &q,
        &[
            (T0, 1),
            (T0 + S, 1),
            (T0 + 2 * S, 1),
            (T0 + 10 * S, 1),
            (T0 + 10 * S, 1),
        ],
    );
    assert!(d[0].allowed && d[1].allowed && !d[2].allowed);
    assert_eq!(d[2].retry_after, 8 * S);
    assert!(d[3].allowed);
    assert!(!d[4].allowed);
    assert_eq!(d[4].retry_after, S);
}

/// A fixed window's limit of 0, as the reference decides it: every hit refused and
/// counted, the reset at the window's end (never 0), and a check of cost 0 allowed with
/// nothing remaining.
#[test]
fn fixed_window_limit_zero_resets_at_the_window_end() {
    let q = quota(0, 60 * S, 0);
    let d = run::<fixed_window::FixedWindow>(
        &q,
        &[(T0 + 15 * S, 0), (T0 + 20 * S, 2), (T0 + 21 * S, 0)],
    );
    assert!(d[0].allowed && d[0].remaining == 0 && d[0].used == 0);
    assert!(!d[1].allowed);
    assert_eq!(
        (d[1].reset_after, d[1].retry_after, d[1].used),
        (40 * S, 40 * S, 2)
    );
    assert!(!d[2].allowed, "the refused hits counted");
    assert_eq!(d[2].reset_after, 39 * S);
}

#[test]
fn invalid_quotas_refuse_without_panicking() {
    for q in [quota(0, S, 1), quota(1, 0, 1), quota(0, 0, 0)] {
        for kind in [
            AlgorithmKind::FixedWindow,
            AlgorithmKind::SlidingWindow,
            AlgorithmKind::SlidingLog,
            AlgorithmKind::TokenBucket,
            AlgorithmKind::Gcra,
        ] {
            let (d, _) = decide(kind, &State::fresh(kind), T0, 1, &q);
            assert!(!d.allowed, "{kind:?} {q:?}");
        }
    }
}

#[test]
fn dispatch_treats_other_kind_as_fresh() {
    let q = quota(1, S, 1);
    let (_, used) = decide(
        AlgorithmKind::Gcra,
        &State::fresh(AlgorithmKind::Gcra),
        T0,
        1,
        &q,
    );
    let (d, next) = decide(AlgorithmKind::TokenBucket, &used, T0, 1, &q);
    assert!(d.allowed);
    assert!(matches!(next, State::TokenBucket(_)));
    assert!(expires_at(&next, &q) >= T0);
}

#[test]
fn earliest_finds_threshold_from_any_guess() {
    for guess in [0, 1, 99, 100, 101, 5000, u64::MAX] {
        assert_eq!(earliest(guess, |d| d >= 100), 100);
    }
    assert_eq!(earliest(7, |_| true), 0);
}

#[test]
fn sliding_window_worst_case_over_a_rolling_window() {
    // limit × (1 + elapsed / period): 10 at the end of a window, then half-way through
    // the next another 5 pass, so (t - period, t] holds 15.
    let q = quota(10, 100 * S, 10);
    let d = run::<sliding_window::SlidingWindow>(
        &q,
        &[(T0 + 99 * S, 10), (T0 + 150 * S, 5), (T0 + 150 * S, 1)],
    );
    assert!(d[0].allowed && d[1].allowed && !d[2].allowed);
}
