//! A bounded top-K table (the Space-Saving algorithm) for the debug reports.
//!
//! It holds at most `capacity` keys. A key already in the table adds to its count; a new
//! key fills a free slot, or else replaces the key with the smallest count and inherits
//! that count plus one (its `error` records the inherited part). Any key seen more than
//! `total / capacity` times is guaranteed to be in the table, and a count overstates the
//! truth by at most `error`. Memory and time per update are bounded by `capacity`.

use std::collections::HashMap;
use std::time::SystemTime;

/// One tracked key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TopEntry {
    /// Human-readable key (domain and descriptor entries).
    pub(crate) label: String,
    /// Hits counted (an upper bound: true count ≥ `count - error`).
    pub(crate) count: u64,
    /// Hits inherited from the key this one replaced.
    pub(crate) error: u64,
    /// When the key entered the table.
    pub(crate) first_seen: SystemTime,
    /// When it was last counted.
    pub(crate) last_seen: SystemTime,
}

/// A bounded top-K table keyed by a 128-bit digest.
#[derive(Debug)]
pub(crate) struct TopK {
    /// Most keys held.
    capacity: usize,
    /// The tracked keys.
    entries: Vec<TopEntry>,
    /// Digest → slot in `entries`.
    slots: HashMap<u128, usize>,
    /// Digest of each slot (to unlink a replaced key).
    ids: Vec<u128>,
    /// Every hit counted, tracked or not.
    total: u64,
}

// === impl TopK ===

impl TopK {
    /// An empty table of at most `capacity` keys (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            entries: Vec::with_capacity(capacity),
            slots: HashMap::with_capacity(capacity),
            ids: Vec::with_capacity(capacity),
            total: 0,
        }
    }

    /// Counts `hits` for key `id`; `label` is built only when the key enters the table.
    pub(crate) fn record(
        &mut self,
        id: u128,
        hits: u64,
        now: SystemTime,
        label: impl FnOnce() -> String,
    ) {
        self.total = self.total.saturating_add(hits);
        if let Some(&slot) = self.slots.get(&id) {
            let entry = &mut self.entries[slot];
            entry.count = entry.count.saturating_add(hits);
            entry.last_seen = now;
            return;
        }
        let fresh = |base: u64| TopEntry {
            label: label(),
            count: base.saturating_add(hits),
            error: base,
            first_seen: now,
            last_seen: now,
        };
        if self.entries.len() < self.capacity {
            self.slots.insert(id, self.entries.len());
            self.ids.push(id);
            self.entries.push(fresh(0));
            return;
        }
        let Some((slot, min)) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, entry)| entry.count)
            .map(|(slot, entry)| (slot, entry.count))
        else {
            return;
        };
        self.slots.remove(&self.ids[slot]);
        self.slots.insert(id, slot);
        self.ids[slot] = id;
        self.entries[slot] = fresh(min);
    }

    /// The tracked keys, highest count first.
    pub(crate) fn top(&self) -> Vec<TopEntry> {
        let mut entries = self.entries.clone();
        entries.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.label.cmp(&b.label)));
        entries
    }

    /// Every hit counted since the table was created.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_hitters_survive_a_flood_of_singletons() {
        let now = SystemTime::UNIX_EPOCH;
        let mut top = TopK::new(4);
        for round in 0..1000u128 {
            top.record(1, 1, now, || "hot".into());
            if round % 2 == 0 {
                top.record(2, 1, now, || "warm".into());
            }
            top.record(1000 + round, 1, now, || format!("cold{round}"));
        }
        let entries = top.top();
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].label, "hot");
        assert!(entries[0].count >= 1000 && entries[0].count - entries[0].error <= 1000);
        assert!(entries.iter().any(|e| e.label == "warm"));
        assert_eq!(top.total(), 2500);
    }
}
