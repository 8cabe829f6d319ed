//! Property tests of `on_over_limit: charge` (debt): every charge counts, admitted or
//! not, the state goes into debt, and the debt is paid back by time at the configured
//! rate, for every algorithm that takes it, through the public dispatch API.

use proptest::prelude::*;
use sluice::algorithm::{decide, AlgorithmKind, Micros, OnOverLimit, Quota, State};

const T0: Micros = 1_800_000_000_000_000;

/// The algorithms that take `on_over_limit: charge` (the sliding log does not: it
/// dates every unit, so a debt would be as many entries as units).
const DEBT_KINDS: [AlgorithmKind; 4] = [
    AlgorithmKind::FixedWindow,
    AlgorithmKind::SlidingWindow,
    AlgorithmKind::TokenBucket,
    AlgorithmKind::Gcra,
];

fn kind() -> impl Strategy<Value = AlgorithmKind> {
    prop::sample::select(DEBT_KINDS.to_vec())
}

fn quota() -> impl Strategy<Value = Quota> {
    crate::quotas::quota(OnOverLimit::Charge, false)
}

/// Units a request can ever get at once.
fn capacity(kind: AlgorithmKind, quota: &Quota) -> u64 {
    match kind {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => quota.burst,
        _ => quota.limit,
    }
}

/// The earliest instant at which a request of `cost` passes on `state`, from `from`:
/// stepped forward by a sixteenth of the period, then bisected (passing is monotone in
/// time). It checks the algorithm's own `retry_after`, so it must not use it.
fn first_pass(
    kind: AlgorithmKind,
    state: &State,
    from: Micros,
    cost: u64,
    quota: &Quota,
) -> Micros {
    let passes = |at: Micros| decide(kind, state, at, cost, quota).0.allowed;
    let step = quota.period / 16 + 1;
    let mut at = from;
    while !passes(at) {
        at += step;
    }
    let mut lo = at.saturating_sub(step).max(from);
    while lo < at {
        let mid = lo + (at - lo) / 2;
        if passes(mid) {
            at = mid
        } else {
            lo = mid + 1
        }
    }
    at
}

proptest! {
    /// Every charge counts, refused or not: a charge of `debt` units on a fresh key
    /// refuses later requests until time has paid it back at the configured rate:
    /// exactly for the token bucket (to within a microsecond of rounding) and GCRA, and
    /// at window granularity for the windows (never sooner than a window before the rate
    /// allows, and at most one window later, two for the sliding window's estimate).
    #[test]
    fn debt_is_paid_back_at_the_configured_rate(
        kind in kind(), quota in quota(), offset in 0..10_000u64, debt in 1..=200u64,
        cost in 0..=30u64,
    ) {
        prop_assume!(cost <= capacity(kind, &quota));
        let now = T0 + offset;
        let (charge, charged) = decide(kind, &State::fresh(kind), now, debt, &quota);
        prop_assert_eq!(charge.allowed, debt <= capacity(kind, &quota));
        let passes_at = first_pass(kind, &charged, now, cost, &quota);
        let (p, limit) = (u128::from(quota.period), u128::from(quota.limit));
        // Units owed beyond what the limit could hold, and the time the rate needs to
        // pay them back: (debt + cost - capacity) × period / limit.
        let owed = u128::from(debt + cost).saturating_sub(u128::from(capacity(kind, &quota)));
        let exact = (owed * p).div_ceil(limit);
        let waited = u128::from(passes_at - now);
        match kind {
            AlgorithmKind::TokenBucket => prop_assert!(waited.abs_diff(exact) <= 1, "{} vs {}", waited, exact),
            AlgorithmKind::Gcra => prop_assert_eq!(waited, exact),
            _ => {
                // The fixed window pays at window ends; the sliding window's estimate also
                // weighs the last window paid for until the next one has passed.
                let windows = if kind == AlgorithmKind::FixedWindow { 1 } else { 2 };
                prop_assert!(waited >= exact.saturating_sub(p), "{} sooner than {}", waited, exact);
                prop_assert!(waited <= exact + windows * p, "{} later than {} + {} windows", waited, exact, windows);
            }
        }
        // A refused request's retry_after says when it passes, after its own charge.
        let (retry, again) = decide(kind, &charged, now, cost, &quota);
        if !retry.allowed {
            let passes_again = first_pass(kind, &again, now, cost, &quota);
            prop_assert_eq!(now + retry.retry_after, passes_again, "retry_after of {:?}", retry);
        }
    }

    /// Refused requests are charged too (every charge counts), and nothing a charge
    /// does lets a request through that the state before would refuse at that cost.
    #[test]
    fn refused_charges_count(
        kind in kind(), quota in quota(), offset in 0..10_000u64,
        costs in prop::collection::vec((0..2000u64, 0..=40u64), 1..40),
    ) {
        let mut state = State::fresh(kind);
        let mut now = T0 + offset;
        for (step, cost) in costs {
            now += quota.period * step / 1000;
            let (d, next) = decide(kind, &state, now, cost, &quota);
            if cost > 0 {
                prop_assert_ne!(&next, &state, "a charge of {} counted nothing", cost);
            }
            // More debt never admits sooner.
            for probe in [0, 1, cost] {
                let before = decide(kind, &state, now, probe, &quota).0;
                let after = decide(kind, &next, now, probe, &quota).0;
                prop_assert!(!after.allowed || before.allowed || probe == 0 && d.allowed);
            }
            state = next;
        }
    }
}
