//! Reconnection back-off: exponential from an initial interval up to a maximum, each
//! wait spread by a random factor (the reference's `XDS_CLIENT_BACKOFF_*` settings).

use std::time::Duration;

/// How waits between connection attempts grow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Backoff {
    /// The first wait (`XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, default 10 s).
    pub(crate) initial: Duration,
    /// The longest wait (`XDS_CLIENT_BACKOFF_MAX_INTERVAL`, default 60 s).
    pub(crate) max: Duration,
    /// Each wait is drawn from `wait × (1 ± random_factor)`
    /// (`XDS_CLIENT_BACKOFF_RANDOM_FACTOR`, default 0.5, within 0–1).
    pub(crate) random_factor: f64,
    /// Whether waits are spread at all (`XDS_CLIENT_BACKOFF_JITTER`, default true).
    pub(crate) jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            random_factor: 0.5,
            jitter: true,
        }
    }
}

// === impl Backoff ===

impl Backoff {
    /// The wait before attempt `failures + 1`, given a uniform random number in [0, 1).
    pub(crate) fn wait(&self, failures: u32, random: f64) -> Duration {
        let doubled = self
            .initial
            .saturating_mul(2u32.saturating_pow(failures.min(31)));
        let base = doubled.min(self.max);
        if !self.jitter || self.random_factor <= 0.0 {
            return base;
        }
        let spread = self.random_factor.min(1.0) * (2.0 * random - 1.0);
        base.mul_f64((1.0 + spread).max(0.0)).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_maximum_within_the_random_factor() {
        let backoff = Backoff::default();
        let exact = Backoff {
            jitter: false,
            ..backoff
        };
        let waits: Vec<u64> = (0..5).map(|n| exact.wait(n, 0.9).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 60, 60]);
        assert_eq!(exact.wait(u32::MAX, 0.0), Duration::from_secs(60));
        for failures in 0..8 {
            for random in [0.0, 0.25, 0.5, 0.999] {
                let wait = backoff.wait(failures, random);
                let base = exact.wait(failures, random);
                assert!(wait >= base.mul_f64(0.5) && wait <= base.mul_f64(1.5).min(backoff.max));
            }
        }
        assert_eq!(backoff.wait(0, 0.5), Duration::from_secs(10));
    }
}
