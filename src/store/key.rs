//! Counter keys: an unambiguous encoding of (domain, entries), digested.
//!
//! The reference joins domain, keys and values with `_`, so `user=alice_path_/login`
//! and `user=alice, path=/login` share a counter there: a way for one client to drain
//! another's budget. Here every part is length-prefixed before hashing, so distinct
//! descriptors never share a key, and the digest (not client bytes) chooses the Redis
//! hash slot.

use sha2::{Digest, Sha256};

use crate::rules::Entry;

/// Version tag of the encoding; changing the encoding must change it.
const ENCODING_TAG: &[u8] = b"sluice-key-v1\0";

/// Identity of one descriptor's counters: the first 128 bits of SHA-256 over the
/// length-prefixed encoding of the domain and the entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey(pub u128);

impl CounterKey {
    /// Digests `domain` and `entries`; where `share_patterns[i]` is `Some(p)`, entry
    /// `i`'s value is replaced by pattern `p` (the reference's `share_threshold`).
    pub fn new(domain: &str, entries: &[Entry<'_>], share_patterns: &[Option<&str>]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(ENCODING_TAG);
        put(&mut hasher, domain.as_bytes());
        hasher.update((entries.len() as u64).to_be_bytes());
        for (index, entry) in entries.iter().enumerate() {
            let value = share_patterns
                .get(index)
                .copied()
                .flatten()
                .unwrap_or(entry.value);
            put(&mut hasher, entry.key.as_bytes());
            put(&mut hasher, value.as_bytes());
        }
        let digest = hasher.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        Self(u128::from_be_bytes(first))
    }

    /// Key of the `index`-th limit of this descriptor (limits of one descriptor differ
    /// only here, so they share a Redis hash tag).
    pub fn for_limit(self, index: usize) -> LimitKey {
        LimitKey {
            counter: self,
            index: index as u32,
        }
    }

    /// Lower-case hex of the digest (the Redis hash tag).
    pub fn hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

/// Key of one limit's state: the descriptor's counter key and the limit's position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitKey {
    /// The descriptor's counter key.
    pub counter: CounterKey,
    /// Position of the limit within the rule (0 for single-limit rules).
    pub index: u32,
}

/// Feeds a length-prefixed byte string to the hasher.
fn put(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(key: &'a str, value: &'a str) -> Entry<'a> {
        Entry { key, value }
    }

    #[test]
    fn separator_tricks_do_not_collide() {
        let joined = CounterKey::new("d", &[entry("user", "alice_path_/login")], &[]);
        let split = CounterKey::new("d", &[entry("user", "alice"), entry("path", "/login")], &[]);
        assert_ne!(joined, split);
        let shifted = CounterKey::new("d_user", &[entry("alice", "x")], &[]);
        let plain = CounterKey::new("d", &[entry("user_alice", "x")], &[]);
        assert_ne!(shifted, plain);
    }

    #[test]
    fn share_pattern_replaces_value() {
        let a = CounterKey::new("d", &[entry("files", "files/a.pdf")], &[Some("files/*")]);
        let b = CounterKey::new("d", &[entry("files", "files/b.csv")], &[Some("files/*")]);
        assert_eq!(a, b);
        let c = CounterKey::new("d", &[entry("files", "files/*")], &[]);
        assert_eq!(a, c);
    }

    #[test]
    fn stable_across_runs() {
        let key = CounterKey::new("domain", &[entry("key", "value")], &[]);
        assert_eq!(key.hex().len(), 32);
        assert_eq!(
            key,
            CounterKey::new("domain", &[entry("key", "value")], &[])
        );
    }
}
