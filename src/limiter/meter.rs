//! Rate meters that tell hot keys from cold ones without allocating per key: keys hash
//! onto fixed arrays of packed atomic counters, two rows indexed by the two halves of
//! the key's digest, and a key is hot only when both of its meters are (a count-min
//! sketch of depth two). Keys sharing a meter look hotter than they are; every user of
//! the meters ([`super::lease`]'s `auto`, [`super::precheck`]) is sound for any key it
//! treats as hot, so a collision only costs a little memory, a cache lookup or an
//! earlier lease. With one row of 8 192 meters, 60 000 checks a second over many cold
//! keys called ~20 % of them hot (measured: the pre-check's cache then churned on
//! every fifth call); with two rows of 16 384, about one in 100 000.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithm::{Micros, MICROS_PER_SECOND};
use crate::store::CounterKey;

/// Meters per row.
const METERS: usize = 16_384;

/// Bits of a meter: 0..24 checks this second; 24: the previous second was hot;
/// 25..: the second.
const COUNT_MASK: u64 = (1 << 24) - 1;
const WAS_HOT: u64 = 1 << 24;
const SECOND_SHIFT: u32 = 25;

/// Fixed arrays of per-second check counters.
pub struct Meters {
    /// The packed counters: two rows, a key has one meter in each.
    rows: [Box<[AtomicU64]>; 2],
    /// Checks per second from which a key is hot.
    min_rate: u64,
}

impl Meters {
    /// Meters calling a key hot from `min_rate` checks within one second.
    pub fn new(min_rate: u64) -> Self {
        let row = || (0..METERS).map(|_| AtomicU64::new(0)).collect();
        Self {
            rows: [row(), row()],
            min_rate,
        }
    }

    /// Counts one check of `key` at `now`; whether the key is hot (this second or the
    /// previous one reached the rate).
    pub fn hot(&self, key: CounterKey, now: Micros) -> bool {
        let second = now / MICROS_PER_SECOND;
        let [first, other] = self.meters_of(key);
        // Both count every check: no short circuit.
        let first_hot = self.count(first, second);
        let other_hot = self.count(other, second);
        first_hot && other_hot
    }

    /// Whether `key` is hot at `now`, as [`Self::hot`] would say, without counting.
    pub fn is_hot(&self, key: CounterKey, now: Micros) -> bool {
        let second = (now / MICROS_PER_SECOND) & (u64::MAX >> SECOND_SHIFT);
        self.meters_of(key).iter().all(|meter| {
            let current = meter.load(Ordering::Relaxed);
            let count = current & COUNT_MASK;
            match current >> SECOND_SHIFT {
                stored if stored == second => current & WAS_HOT != 0 || count >= self.min_rate,
                stored => second == stored + 1 && count >= self.min_rate,
            }
        })
    }

    /// The meters `key` counts on: one per row, from each half of its digest.
    fn meters_of(&self, key: CounterKey) -> [&AtomicU64; 2] {
        let halves = [key.0 as u64, (key.0 >> 64) as u64];
        // `METERS` is a power of two: the low bits of each half pick the meter.
        [0, 1].map(|row| &self.rows[row][halves[row] as usize % METERS])
    }

    fn count(&self, meter: &AtomicU64, second: u64) -> bool {
        let second = second & (u64::MAX >> SECOND_SHIFT);
        let mut current = meter.load(Ordering::Relaxed);
        loop {
            let next = if current >> SECOND_SHIFT == second {
                let count = ((current & COUNT_MASK) + 1).min(COUNT_MASK);
                (current & !COUNT_MASK) | count
            } else {
                let was_hot = second == (current >> SECOND_SHIFT) + 1
                    && current & COUNT_MASK >= self.min_rate;
                (second << SECOND_SHIFT) | if was_hot { WAS_HOT } else { 0 } | 1
            };
            match meter.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return next & WAS_HOT != 0 || next & COUNT_MASK >= self.min_rate,
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_from_the_rate_until_a_quiet_second() {
        let meters = Meters::new(5);
        let key = CounterKey(42);
        let second = |s: u64| s * MICROS_PER_SECOND;
        let hot: Vec<bool> = (0..5).map(|_| meters.hot(key, second(7))).collect();
        assert_eq!(hot, [false, false, false, false, true]);
        assert!(meters.hot(key, second(8)), "still hot the next second");
        assert!(!meters.hot(key, second(10)), "cold after a quiet second");
    }

    #[test]
    fn many_cold_keys_are_seldom_called_hot() {
        let meters = Meters::new(10);
        // Digests are uniform: mix the numbers as a hash would.
        let key = |n: u64| {
            let mut x = u128::from(n).wrapping_add(0x9E37_79B9_7F4A_7C15);
            x = (x ^ (x >> 67)).wrapping_mul(0xBF58_476D_1CE4_E5B9_94D0_49BB_1331_11EB);
            CounterKey(x ^ (x >> 61))
        };
        // 60 000 distinct keys checked once each within one second: 3.7 per meter of
        // a row; one row alone would call ~0.4 % hot, one row of 8 192 about 20 %.
        let checks = 60_000;
        let hot = (0..checks).filter(|&n| meters.hot(key(n), 0)).count();
        assert!(hot <= 6, "{hot} of {checks} cold keys called hot");
        let still_hot = (0..checks).filter(|&n| meters.is_hot(key(n), 0)).count();
        assert!(still_hot <= 6, "{still_hot} of {checks} read as hot");
    }

    #[test]
    fn is_hot_reads_what_hot_would_say_without_counting() {
        let meters = Meters::new(3);
        let key = CounterKey(7);
        let second = |s: u64| s * MICROS_PER_SECOND;
        assert!(!meters.is_hot(key, second(1)));
        meters.hot(key, second(1));
        meters.hot(key, second(1));
        assert!(!meters.is_hot(key, second(1)), "reading does not count");
        assert!(meters.hot(key, second(1)));
        assert!(meters.is_hot(key, second(1)));
        assert!(meters.is_hot(key, second(2)), "hot the next second");
        assert!(!meters.is_hot(key, second(3)), "cold after a quiet second");
    }
}
