//! Memory per key of the memory store: fill it with token-bucket keys and divide the
//! growth of the process's resident set by the number of keys held.
//!
//! Run alone in its process (`sluice bench-memory`, or a test binary with one test):
//! RSS is process-wide, so anything else allocating at the same time counts too.

use std::sync::Arc;

use serde::Serialize;

use crate::algorithm::{AlgorithmKind, Quota, MICROS_PER_SECOND};
use crate::clock::ManualClock;
use crate::store::memory::MemoryStore;
use crate::store::{CounterKey, LimitCheck, Store, StoreCheck};

/// The outcome of one probe.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MemoryReport {
    /// Keys inserted.
    pub keys: u64,
    /// Keys the store holds at the end (evictions would make this smaller).
    pub held: u64,
    /// Resident set before, in bytes.
    pub rss_before: u64,
    /// Resident set after, in bytes.
    pub rss_after: u64,
    /// `(rss_after - rss_before) / held`.
    pub bytes_per_key: f64,
}

/// Inserts `keys` distinct token-bucket keys into a memory store sized for them and
/// measures the resident set growth. `None` where `/proc/self/status` is unreadable.
pub fn measure(keys: u64) -> Option<MemoryReport> {
    let rss_before = rss_bytes()?;
    // A store sized for twice the keys, so that uneven shards evict nothing.
    let store = MemoryStore::new(
        usize::try_from(keys.saturating_mul(2)).unwrap_or(usize::MAX),
        Arc::new(ManualClock::new(1_700_000_000 * MICROS_PER_SECOND)),
    );
    let limits = vec![LimitCheck {
        algorithm: AlgorithmKind::TokenBucket,
        quota: Quota {
            limit: 100,
            period: MICROS_PER_SECOND,
            burst: 100,
            on_over_limit: Default::default(),
        },
        sharing: crate::regions::Sharing::Regional,
    }]
    .into();
    let mut check = StoreCheck {
        key: CounterKey(0),
        limits,
        cost: 1,
        refund: false,
        max_wait: 0,
    };
    let mut decisions = Vec::with_capacity(1);
    let mut seed = 0u64;
    for _ in 0..keys {
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        check.key = CounterKey(u128::from(mix(seed)) << 64 | u128::from(mix(!seed)));
        decisions.clear();
        // The memory store never awaits: its future completes on the first poll.
        let _ =
            futures::executor::block_on(store.check(std::slice::from_ref(&check), &mut decisions));
    }
    let rss_after = rss_bytes()?;
    let held = store.len() as u64;
    let report = MemoryReport {
        keys,
        held,
        rss_before,
        rss_after,
        bytes_per_key: rss_after.saturating_sub(rss_before) as f64 / held.max(1) as f64,
    };
    drop(store);
    Some(report)
}

/// SplitMix64's finaliser: distinct inputs give distinct, well-spread outputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// This process's resident set, from `/proc/self/status` (`VmRSS`).
pub(crate) fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
