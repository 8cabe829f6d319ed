//! The quotas the algorithm property tests generate: limits 1–20, bursts 1–30, periods
//! from microseconds to seconds.

use proptest::prelude::*;
use sluice::algorithm::{OnOverLimit, Quota};

/// Quotas with periods of 10 µs to 10 ms, 1 s or 3 s, under `on_over_limit`; with
/// `tiny` periods of 1–10 µs too (where rounding is coarsest).
pub(crate) fn quota(on_over_limit: OnOverLimit, tiny: bool) -> impl Strategy<Value = Quota> {
    let period = if tiny {
        prop_oneof![
            1..=10u64,
            10..=10_000u64,
            Just(1_000_000u64),
            Just(3_000_000)
        ]
        .boxed()
    } else {
        prop_oneof![10..=10_000u64, Just(1_000_000u64), Just(3_000_000)].boxed()
    };
    (1..=20u64, period, 1..=30u64).prop_map(move |(limit, period, burst)| Quota {
        limit,
        period,
        burst,
        on_over_limit,
    })
}
