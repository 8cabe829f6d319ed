//! Several regions (`--region`, `--peer-region`): each region checks its own Redis, and
//! a limit with `scope: global` is shared between regions, by static shares
//! ([`split`]) or by publishing usage to the other regions ([`crate::exchange`]), whose
//! last known usage every check counts (`scripts/main.lua`, mirror of
//! [`crate::algorithm::remote`]). This module is the vocabulary: the regions, their
//! shares, and how a limit is shared.

use std::sync::Arc;

/// Most regions a deployment names (its own and its peers).
pub const MAX_REGIONS: usize = 8;

/// Longest region name.
const MAX_NAME_BYTES: usize = 32;

/// The regions an instance knows: its own and its peers', sorted by name, so that every
/// instance of every region numbers them alike.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionPlan {
    /// Every region's name, sorted.
    names: Vec<Arc<str>>,
    /// Index of this instance's region in `names`.
    local: usize,
}

/// A region list that cannot be.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegionError {
    /// A name outside `[a-z0-9-]{1,32}`.
    #[error("region name {0:?} must be 1 to 32 characters of a-z, 0-9 and -")]
    BadName(String),
    /// A region named twice (a peer named as the local region, too).
    #[error("region {0:?} is named twice")]
    Duplicate(String),
    /// More than [`MAX_REGIONS`].
    #[error("at most {MAX_REGIONS} regions")]
    TooMany,
}

impl RegionPlan {
    /// The plan of an instance in region `local` whose peers are `peers`.
    pub fn new<'a>(
        local: &'a str,
        peers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, RegionError> {
        let mut names: Vec<Arc<str>> = Vec::new();
        for name in std::iter::once(local).chain(peers) {
            let valid = !name.is_empty()
                && name.len() <= MAX_NAME_BYTES
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !valid {
                return Err(RegionError::BadName(name.to_owned()));
            }
            if names.iter().any(|known| &**known == name) {
                return Err(RegionError::Duplicate(name.to_owned()));
            }
            names.push(Arc::from(name));
        }
        if names.len() > MAX_REGIONS {
            return Err(RegionError::TooMany);
        }
        names.sort();
        let local = names
            .iter()
            .position(|name| &**name == local)
            .unwrap_or_default();
        Ok(Self { names, local })
    }

    /// Every region's name, sorted (a region's index is its place here).
    pub fn names(&self) -> &[Arc<str>] {
        &self.names
    }

    /// Index of this instance's region.
    pub fn local(&self) -> usize {
        self.local
    }

    /// This instance's region.
    pub fn local_name(&self) -> &str {
        &self.names[self.local]
    }

    /// Index of region `name`, if it is one of the plan's.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|known| &**known == name)
    }
}

/// Weights of a global limit's regions, by region index in a [`RegionPlan`] (1 each when
/// the rule names none): a shared limit's fallback shares (`sharing: aggregate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RegionWeights(pub [u16; MAX_REGIONS]);

impl RegionWeights {
    /// The share of `limit` region `index` is taken to use while its usage is not known
    /// (its link is cut): its static share ([`split`] by these weights), so that a cut
    /// region and the others together stay within the limit.
    pub fn fallback_share(&self, limit: u64, index: usize) -> u64 {
        share_of(limit, &self.0.map(u64::from), index)
    }
}

/// How the store counts one limit across regions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// Only this region's usage (the default; a `split` limit's share is its limit).
    #[default]
    Regional,
    /// This region's usage plus the last known usage of the others (`sharing:
    /// aggregate`); `weights` give each region's share while its link is cut.
    Aggregate(RegionWeights),
}

/// Static shares of `total` units by `weights`: each share is `total × weight / sum`
/// rounded down, and the units left by rounding go one each to the largest remainders
/// (the lower index first among equals), so the shares add up to `total` exactly and
/// every region computes the same ones. All weights zero: every share is zero.
pub fn split(total: u64, weights: &[u64]) -> Vec<u64> {
    (0..weights.len())
        .map(|index| share_of(total, weights, index))
        .collect()
}

/// Share `index` of [`split`], computed alone (no allocation: up to [`MAX_REGIONS`]
/// weights are compared with it).
fn share_of(total: u64, weights: &[u64], index: usize) -> u64 {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let Some(&weight) = weights.get(index) else {
        return 0;
    };
    if sum == 0 {
        return 0;
    }
    let exact = |w: u64| {
        let product = u128::from(total) * u128::from(w);
        (product / sum, product % sum)
    };
    let given: u128 = weights.iter().map(|&w| exact(w).0).sum();
    let left = u128::from(total) - given;
    let (share, remainder) = exact(weight);
    // Regions before this one in the order the units left are given in.
    let ahead = weights
        .iter()
        .enumerate()
        .filter(|&(other, &w)| {
            let r = exact(w).1;
            r > remainder || (r == remainder && other < index)
        })
        .count() as u128;
    u64::try_from(share + u128::from(ahead < left)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn regions_are_numbered_by_name() {
        let plan = RegionPlan::new("eu", ["us", "ap"]).expect("a plan");
        let names: Vec<&str> = plan.names().iter().map(|n| &**n).collect();
        assert_eq!(names, ["ap", "eu", "us"]);
        assert_eq!((plan.local(), plan.local_name()), (1, "eu"));
        assert_eq!(plan.index_of("us"), Some(2));
    }

    #[test]
    fn bad_region_lists_are_refused() {
        assert_eq!(
            RegionPlan::new("eu", ["eu"]),
            Err(RegionError::Duplicate("eu".into()))
        );
        assert_eq!(
            RegionPlan::new("EU", []),
            Err(RegionError::BadName("EU".into()))
        );
        let many: Vec<String> = (0..MAX_REGIONS).map(|i| format!("r{i}")).collect();
        assert_eq!(
            RegionPlan::new("x", many.iter().map(String::as_str)),
            Err(RegionError::TooMany)
        );
    }

    #[test]
    fn a_hundred_in_three_equal_shares_is_34_33_33() {
        assert_eq!(split(100, &[1, 1, 1]), [34, 33, 33]);
        assert_eq!(split(100, &[2, 1, 1]), [50, 25, 25]);
        assert_eq!(split(2, &[1, 1, 1]), [1, 1, 0]);
        assert_eq!(split(7, &[0, 0]), [0, 0]);
    }

    proptest! {
        #[test]
        fn shares_add_up_and_stay_within_one_of_the_exact_share(
            total in 0u64..1_000_000_000,
            weights in prop::collection::vec(0u64..1_000, 1..MAX_REGIONS),
        ) {
            let shares = split(total, &weights);
            let sum: u64 = weights.iter().sum();
            if sum > 0 {
                prop_assert_eq!(shares.iter().sum::<u64>(), total);
            }
            for (share, weight) in shares.iter().zip(&weights) {
                let exact = total as f64 * *weight as f64 / sum.max(1) as f64;
                prop_assert!((*share as f64 - exact).abs() < 1.0 + 1e-6);
            }
        }
    }
}
