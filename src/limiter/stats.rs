//! The reference's per-rule hit statistics: where a request's hits fall relative to the
//! near-limit and over-limit thresholds.

use crate::algorithm::Decision;

/// How one descriptor's hits split across the reference's statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HitSplit {
    /// Hits that ended within the limit.
    pub(crate) within_limit: u64,
    /// Hits past the near-limit threshold.
    pub(crate) near_limit: u64,
    /// Hits past the limit.
    pub(crate) over_limit: u64,
}

/// Splits `hits` as envoyproxy/ratelimit does: the near threshold is
/// `floor(limit × ratio)` (computed in `f32` like the reference), and a request's hits
/// are attributed by where the usage before and after them falls.
pub(crate) fn split_hits(
    decision: &Decision,
    limit: u64,
    hits: u64,
    near_limit_ratio: f32,
) -> HitSplit {
    let near_threshold = ((limit as f32) * near_limit_ratio).floor() as u64;
    let after = decision.used;
    let before = after.saturating_sub(hits);
    let mut split = HitSplit::default();
    if !decision.allowed {
        if before >= limit {
            split.over_limit = hits;
        } else {
            split.over_limit = after.saturating_sub(limit);
            split.near_limit = limit.saturating_sub(near_threshold.max(before));
        }
    } else {
        if after > near_threshold {
            split.near_limit = if before >= near_threshold {
                hits
            } else {
                after - near_threshold
            };
        }
        split.within_limit = hits;
    }
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool, used: u64) -> Decision {
        Decision {
            allowed,
            used,
            ..Decision::default()
        }
    }

    #[test]
    fn reference_near_limit_sequence() {
        // limit 15, ratio 0.8: near threshold 12.
        assert_eq!(
            split_hits(&decision(true, 11), 15, 1, 0.8),
            HitSplit {
                within_limit: 1,
                near_limit: 0,
                over_limit: 0
            }
        );
        assert_eq!(
            split_hits(&decision(true, 13), 15, 1, 0.8),
            HitSplit {
                within_limit: 1,
                near_limit: 1,
                over_limit: 0
            }
        );
        assert_eq!(
            split_hits(&decision(false, 16), 15, 1, 0.8),
            HitSplit {
                within_limit: 0,
                near_limit: 0,
                over_limit: 1
            }
        );
    }

    #[test]
    fn partial_hits_straddle_thresholds() {
        // limit 20, near 16; 3 hits from 15 to 18: 2 near, 3 within.
        assert_eq!(
            split_hits(&decision(true, 18), 20, 3, 0.8),
            HitSplit {
                within_limit: 3,
                near_limit: 2,
                over_limit: 0
            }
        );
        // From 18 to 22: 2 over, and 20 - max(16, 18) = 2 near.
        assert_eq!(
            split_hits(&decision(false, 22), 20, 4, 0.8),
            HitSplit {
                within_limit: 0,
                near_limit: 2,
                over_limit: 2
            }
        );
    }
}
