//! Rate meters that tell hot keys from cold ones without allocating per key: keys hash
//! onto a fixed array of packed atomic counters. Keys sharing a meter look hotter than
//! they are; every user of a meter ([`super::lease`]'s `auto`, [`super::precheck`]) is
//! sound for any key it treats as hot, so a collision only costs a little memory or an
//! earlier lease.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithm::{Micros, MICROS_PER_SECOND};
use crate::store::CounterKey;

/// Meters per array.
const METERS: usize = 8_192;

/// Bits of a meter: 0..24 checks this second; 24: the previous second was hot;
/// 25..: the second.
const COUNT_MASK: u64 = (1 << 24) - 1;
const WAS_HOT: u64 = 1 << 24;
const SECOND_SHIFT: u32 = 25;

/// A fixed array of per-second check counters.
pub struct Meters {
    /// The packed counters.
    cells: Box<[AtomicU64]>,
    /// Checks per second from which a key is hot.
    min_rate: u64,
}

impl Meters {
    /// Meters calling a key hot from `min_rate` checks within one second.
    pub fn new(min_rate: u64) -> Self {
        Self {
            cells: (0..METERS).map(|_| AtomicU64::new(0)).collect(),
            min_rate,
        }
    }

    /// Counts one check of `key` at `now`; whether the key is hot (this second or the
    /// previous one reached the rate).
    pub fn hot(&self, key: CounterKey, now: Micros) -> bool {
        self.count(&self.cells[meter_of(key)], now / MICROS_PER_SECOND)
    }

    /// Whether `key` is hot at `now`, as [`Self::hot`] would say, without counting.
    pub fn is_hot(&self, key: CounterKey, now: Micros) -> bool {
        let current = self.cells[meter_of(key)].load(Ordering::Relaxed);
        let second = (now / MICROS_PER_SECOND) & (u64::MAX >> SECOND_SHIFT);
        let count = current & COUNT_MASK;
        match current >> SECOND_SHIFT {
            stored if stored == second => current & WAS_HOT != 0 || count >= self.min_rate,
            stored => second == stored + 1 && count >= self.min_rate,
        }
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

/// The meter `key` counts on.
fn meter_of(key: CounterKey) -> usize {
    (key.0 as usize ^ (key.0 >> 64) as usize) % METERS
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
