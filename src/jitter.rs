//! Random spread for timers that many connections share (reconnection back-off,
//! connection age), so that they do not all fire at once. Not for anything that must be
//! unpredictable.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// A uniform random number in [0, 1).
pub(crate) fn unit() -> f64 {
    let bits = RandomState::new().build_hasher().finish() >> 11;
    bits as f64 / (1u64 << 53) as f64
}

/// `duration` spread uniformly over `duration × (1 ± factor)` (factor within 0–1).
pub(crate) fn spread(duration: Duration, factor: f64) -> Duration {
    let factor = factor.clamp(0.0, 1.0);
    duration.mul_f64(1.0 + factor * (2.0 * unit() - 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_the_factor_and_varies() {
        let base = Duration::from_secs(100);
        let draws: Vec<Duration> = (0..200).map(|_| spread(base, 0.1)).collect();
        assert!(draws
            .iter()
            .all(|d| *d >= Duration::from_secs(90) && *d <= Duration::from_secs(110)));
        assert!(draws.iter().any(|d| *d != draws[0]), "no spread at all");
        assert_eq!(spread(base, 0.0), base);
    }
}
