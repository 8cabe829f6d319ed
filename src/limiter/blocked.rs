//! The blocked-until cache (DESIGN §6, layer 1): after the store refuses a key, the key
//! is refused locally until the store said it could pass again.
//!
//! Sound by construction: an entry remembers the refused cost and the instant the store
//! named (`now + retry_after`). Before that instant, no request of that cost can pass,
//! because capacity only returns with time and other instances only use it up, and the
//! store's wait for it is exactly what is left of it. Other costs, and anything after
//! the instant, go to the store: a larger cost would be refused too, but its wait is
//! longer than the entry knows. Except under a single fixed window, where every cost
//! at least the refused one waits for the window's end: there larger costs are
//! answered too (as the reference's local cache answers any). An entry is tied to the
//! limits' numbers, so an edited rule never reads a stale block.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use moka::sync::Cache;
use moka::Expiry;

use crate::algorithm::{AlgorithmKind, Decision, Micros};
use crate::store::{CounterKey, LimitCheck, StoreCheck};

/// Shortest real-time lifetime of an entry.
const MIN_TTL: Duration = Duration::from_secs(1);

/// Default number of keys the cache holds.
pub(crate) const DEFAULT_CAPACITY: u64 = 100_000;

/// Identity of a blocked check: its counters and the limits it was decided under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct BlockKey {
    /// The descriptor's counter key.
    counter: CounterKey,
    /// Hash of the limits (algorithm and numbers).
    limits: u64,
}

/// What the store said when it refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocked {
    /// Until this instant, requests of `cost` are refused here.
    pub(crate) until: Micros,
    /// When the store said such a request could pass (reported; at or after `until`).
    retry_at: Micros,
    /// The refused cost.
    pub(crate) cost: u64,
    /// Larger costs wait as long (a single fixed window: until its end).
    larger_too: bool,
    /// When the refusing limit is whole again.
    pub(crate) reset_at: Micros,
    /// Which limit refused.
    pub(crate) limit_index: usize,
    /// Real-time lifetime of the entry (for eviction only; decisions use `until`).
    ttl: Duration,
}

impl Blocked {
    /// The refusal to answer at `now`.
    pub(crate) fn decision_at(&self, now: Micros) -> Decision {
        Decision {
            allowed: false,
            remaining: 0,
            reset_after: self.reset_at.saturating_sub(now),
            retry_after: self.retry_at.saturating_sub(now),
            used: 0,
        }
    }
}

/// Expires each entry when its block ends.
struct UntilBlockEnds;

impl Expiry<BlockKey, Blocked> for UntilBlockEnds {
    fn expire_after_create(
        &self,
        _key: &BlockKey,
        value: &Blocked,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }

    fn expire_after_update(
        &self,
        _key: &BlockKey,
        value: &Blocked,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

/// Bounded map of keys the store has refused.
pub(crate) struct BlockedCache {
    /// Entries expire when their block ends; the least useful go first when full.
    cache: Cache<BlockKey, Blocked>,
    /// The latest `until` ever inserted: at or after it no entry can block, so the
    /// common case (nothing refused lately) answers without hashing or touching the
    /// cache. Only grows.
    latest_until: AtomicU64,
}

impl BlockedCache {
    /// A cache holding at most `capacity` keys.
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            cache: Cache::builder()
                .max_capacity(capacity)
                .expire_after(UntilBlockEnds)
                .build(),
            latest_until: AtomicU64::new(0),
        }
    }

    /// The standing block for a check of `cost` at `now`, if any: only a refusal of the
    /// same cost answers (or of a smaller one, under a single fixed window), so its wait
    /// is the store's own.
    pub(crate) fn get(
        &self,
        counter: CounterKey,
        limits: &[LimitCheck],
        cost: u64,
        now: Micros,
    ) -> Option<Blocked> {
        if now >= self.latest_until.load(Ordering::Relaxed) {
            return None;
        }
        let blocked = self.cache.get(&key(counter, limits))?;
        let same_wait = cost == blocked.cost || (blocked.larger_too && cost > blocked.cost);
        (now < blocked.until && same_wait).then_some(blocked)
    }

    /// Remembers that the store refused `check` at `now` with `decision` from limit
    /// `limit_index`, for at most `longest` (a leased rule's: units other instances
    /// hold come back when their leases end, sooner than the store could say). A
    /// refusal that may pass at once is not remembered.
    pub(crate) fn insert(
        &self,
        check: &StoreCheck,
        now: Micros,
        limit_index: usize,
        decision: &Decision,
        longest: Micros,
    ) {
        let (counter, limits, cost) = (check.key, &*check.limits, check.cost);
        if decision.allowed || decision.retry_after == 0 {
            return;
        }
        let until = now.saturating_add(decision.retry_after.min(longest));
        self.latest_until.fetch_max(until, Ordering::Relaxed);
        self.cache.insert(
            key(counter, limits),
            Blocked {
                until,
                retry_at: now.saturating_add(decision.retry_after),
                cost,
                larger_too: matches!(limits, [only] if only.algorithm == AlgorithmKind::FixedWindow),
                reset_at: now.saturating_add(decision.reset_after),
                limit_index,
                // Decisions compare `until` with the store's clock; the real-time TTL
                // only frees memory, so a floor keeps short blocks from vanishing early.
                ttl: Duration::from_micros(until - now).max(MIN_TTL),
            },
        );
    }
}

impl BlockedCache {
    /// Drops the block of `counter` under `limits`, if any: hits were given back, so
    /// the store may admit sooner than its refusal said.
    pub(crate) fn forget(&self, counter: CounterKey, limits: &[LimitCheck]) {
        if self.latest_until.load(Ordering::Relaxed) > 0 {
            self.cache.invalidate(&key(counter, limits));
        }
    }
}

fn key(counter: CounterKey, limits: &[LimitCheck]) -> BlockKey {
    BlockKey {
        counter,
        limits: fingerprint(limits),
    }
}

/// Hash of a check's limits (algorithm and numbers): local layers key their entries by
/// counter and fingerprint, so an edited rule never reads a stale entry.
pub(crate) fn fingerprint(limits: &[LimitCheck]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for limit in limits {
        limit.algorithm.hash(&mut hasher);
        limit.quota.hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Quota;

    fn limits(limit: u64) -> Vec<LimitCheck> {
        vec![LimitCheck {
            algorithm: AlgorithmKind::TokenBucket,
            quota: Quota {
                limit,
                period: 1_000_000,
                burst: limit,
                on_over_limit: Default::default(),
            },
            sharing: crate::regions::Sharing::Regional,
        }]
    }

    fn check(key: CounterKey, limits: &[LimitCheck], cost: u64) -> StoreCheck {
        StoreCheck {
            key,
            limits: limits.into(),
            cost,
            refund: false,
            max_wait: 0,
        }
    }

    fn refused(retry_after: Micros) -> Decision {
        Decision {
            allowed: false,
            remaining: 0,
            reset_after: retry_after * 2,
            retry_after,
            used: 0,
        }
    }

    #[test]
    fn blocks_the_same_cost_until_retry_time() {
        let cache = BlockedCache::new(10);
        let key = CounterKey(7);
        cache.insert(
            &check(key, &limits(5), 2),
            1_000,
            0,
            &refused(500),
            Micros::MAX,
        );
        assert!(cache.get(key, &limits(5), 2, 1_200).is_some());
        assert!(cache.get(key, &limits(5), 2, 1_499).is_some());
        assert!(
            cache.get(key, &limits(5), 1, 1_200).is_none(),
            "smaller cost asks the store"
        );
        assert!(
            cache.get(key, &limits(5), 3, 1_200).is_none(),
            "a larger cost waits longer than the entry knows: the store answers it"
        );
        assert!(
            cache.get(key, &limits(5), 2, 1_500).is_none(),
            "block ends at retry time"
        );
        assert!(
            cache.get(key, &limits(6), 2, 1_200).is_none(),
            "edited limit misses"
        );
        let decision = cache
            .get(key, &limits(5), 2, 1_200)
            .map(|b| b.decision_at(1_200));
        assert_eq!(
            decision.map(|d| (d.retry_after, d.reset_after)),
            Some((300, 800))
        );
    }

    /// Under a single fixed window every cost at least the refused one waits for the
    /// window's end: larger costs are answered too, smaller ones still asked.
    #[test]
    fn a_fixed_window_block_answers_larger_costs_too() {
        let cache = BlockedCache::new(10);
        let key = CounterKey(8);
        let mut window = limits(5);
        window[0].algorithm = AlgorithmKind::FixedWindow;
        cache.insert(
            &check(key, &window, 2),
            1_000,
            0,
            &refused(500),
            Micros::MAX,
        );
        assert!(cache.get(key, &window, 2, 1_200).is_some());
        assert!(cache.get(key, &window, 7, 1_200).is_some(), "a larger cost");
        assert!(
            cache.get(key, &window, 1, 1_200).is_none(),
            "a smaller cost"
        );
        let two = [window[0], window[0]];
        cache.insert(&check(key, &two, 2), 1_000, 0, &refused(500), Micros::MAX);
        assert!(cache.get(key, &two, 3, 1_200).is_none(), "not alone: asked");
    }

    /// A leased rule's block stands at most `longest` (other instances' lease units
    /// come back), and still reports the store's wait.
    #[test]
    fn a_block_stands_at_most_its_longest() {
        let cache = BlockedCache::new(10);
        let key = CounterKey(6);
        cache.insert(
            &check(key, &limits(5), 1),
            1_000,
            0,
            &refused(60_000_000),
            300_000,
        );
        let blocked = cache
            .get(key, &limits(5), 1, 300_999)
            .expect("still blocked");
        assert_eq!(
            blocked.decision_at(300_999).retry_after,
            60_000_000 - 299_999
        );
        assert!(
            cache.get(key, &limits(5), 1, 301_000).is_none(),
            "asked again"
        );
    }

    #[test]
    fn allowed_or_immediately_retriable_is_not_cached() {
        let cache = BlockedCache::new(10);
        cache.insert(
            &check(CounterKey(1), &limits(5), 1),
            0,
            0,
            &refused(0),
            Micros::MAX,
        );
        assert!(cache.get(CounterKey(1), &limits(5), 1, 0).is_none());
    }
}
