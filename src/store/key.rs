//! Counter keys: an unambiguous encoding of (domain, entries, limits), digested.
//!
//! The reference joins domain, keys and values with `_`, so `user=alice_path_/login`
//! and `user=alice, path=/login` share a counter there: a way for one client to drain
//! another's budget. Here every part is length-prefixed before hashing, so distinct
//! descriptors never share a key, and the digest (not client bytes) chooses the Redis
//! hash slot.
//!
//! The algorithm and window length of each of the rule's limits are part of the key, as
//! the reference's key holds the start of the unit's window: a request's limit override
//! with another unit than the configured rule (or a reload that changes a rule's unit or
//! algorithm) counts apart, never in a state kept for another window or algorithm; a
//! fixed window of the same unit shares the counter. The numbers are not part of it: a
//! limit edited from 10 to 8 keeps its count.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::algorithm::{AlgorithmKind, Micros};
use crate::rules::Entry;

/// Version tag of the encoding; changing the encoding must change it.
const ENCODING_TAG: &[u8] = b"sluice-key-v2\0";

/// Identity of one descriptor's counters: the first 128 bits of SHA-256 over the
/// length-prefixed encoding of the domain, the entries and the limits' algorithms and
/// windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey(pub u128);

impl CounterKey {
    /// Digests `domain`, `entries` and `limits` (the algorithm and period of each limit
    /// of the rule, in order); where `share_patterns[i]` is `Some(p)`, entry `i`'s value
    /// is replaced by pattern `p` (the reference's `share_threshold`).
    pub fn new(
        domain: &str,
        entries: &[Entry<'_>],
        share_patterns: &[Option<&str>],
        limits: impl IntoIterator<Item = (AlgorithmKind, Micros)>,
    ) -> Self {
        let mut hasher = Sha256::new();
        encode(domain, entries, share_patterns, limits, &mut |bytes| {
            hasher.update(bytes)
        });
        let digest = hasher.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        Self(u128::from_be_bytes(first))
    }

    /// Key of the `index`-th limit of this descriptor (limits of one descriptor differ
    /// only here, so they share a Redis hash tag).
    pub(crate) fn for_limit(self, index: usize) -> LimitKey {
        LimitKey {
            counter: self,
            index: index as u32,
        }
    }

    /// Lower-case hex of the digest (the Redis hash tag).
    pub(crate) fn hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// [`Self::hex`] without allocating.
    pub(crate) fn hex_bytes(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, byte) in self.0.to_be_bytes().iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(byte >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(byte & 0x0f)];
        }
        out
    }
}

/// A deployment's prefix on every key it writes to Redis (the reference's
/// `CACHE_KEY_PREFIX`), so that deployments sharing one Redis keep separate counters.
/// It never holds `{` or `}`: the key's hash tag must stay the digest, which chooses
/// the Redis Cluster slot. Built once at startup; every key copies its bytes into the
/// buffer it is written in, so it costs no allocation per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPrefix(Arc<str>);

impl KeyPrefix {
    /// The prefix `text`, or why it cannot be one.
    pub fn new(text: &str) -> Result<Self, KeyPrefixError> {
        if text.contains(['{', '}']) {
            return Err(KeyPrefixError::Brace);
        }
        if text.len() > MAX_KEY_PREFIX_BYTES {
            return Err(KeyPrefixError::TooLong);
        }
        Ok(Self(Arc::from(text)))
    }

    /// The prefix as written before each key.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for KeyPrefix {
    /// No prefix.
    fn default() -> Self {
        Self(Arc::from(""))
    }
}

/// Longest key prefix: every key of every check carries it.
const MAX_KEY_PREFIX_BYTES: usize = 128;

/// A text that cannot prefix Redis keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyPrefixError {
    /// A brace would make part of the prefix the key's hash tag in a Redis Cluster.
    #[error("a key prefix may not contain `{{` or `}}`: the Redis Cluster slot of every key would follow it")]
    Brace,
    /// Longer than [`MAX_KEY_PREFIX_BYTES`].
    #[error("a key prefix may be at most {MAX_KEY_PREFIX_BYTES} bytes long")]
    TooLong,
}

/// Key of one limit's state: the descriptor's counter key and the limit's position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LimitKey {
    /// The descriptor's counter key.
    pub(crate) counter: CounterKey,
    /// Position of the limit within the rule (0 for single-limit rules).
    pub(crate) index: u32,
}

/// The unambiguous encoding that is hashed: a version tag, then the domain, the entry
/// count and each key and value (or share pattern), every part length-prefixed, then one
/// 9-byte record per limit: its algorithm's code and its period. Injective: the bytes
/// decode back to exactly one (domain, entries, limits) (tested).
fn encode(
    domain: &str,
    entries: &[Entry<'_>],
    share_patterns: &[Option<&str>],
    limits: impl IntoIterator<Item = (AlgorithmKind, Micros)>,
    sink: &mut dyn FnMut(&[u8]),
) {
    let mut put = |bytes: &[u8]| {
        sink(&(bytes.len() as u64).to_be_bytes());
        sink(bytes);
    };
    put(ENCODING_TAG);
    put(domain.as_bytes());
    put(&(entries.len() as u64).to_be_bytes());
    for (index, entry) in entries.iter().enumerate() {
        let value = share_patterns
            .get(index)
            .copied()
            .flatten()
            .unwrap_or(entry.value);
        put(entry.key.as_bytes());
        put(value.as_bytes());
    }
    // Records of a fixed size after the last length-prefixed part: one write each.
    for (algorithm, period) in limits {
        let mut record = [0u8; 9];
        record[0] = algorithm_code(algorithm);
        record[1..].copy_from_slice(&period.to_be_bytes());
        sink(&record);
    }
}

/// An algorithm's code in the encoding: fixed, since it chooses keys.
fn algorithm_code(algorithm: AlgorithmKind) -> u8 {
    match algorithm {
        AlgorithmKind::FixedWindow => 1,
        AlgorithmKind::SlidingWindow => 2,
        // 3 named the log of runs ("at:units" members) that earlier versions stored;
        // one member per unit is another layout, so another key.
        AlgorithmKind::SlidingLog => 6,
        AlgorithmKind::TokenBucket => 4,
        AlgorithmKind::Gcra => 5,
        AlgorithmKind::Concurrency => 7,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What `encode` encodes.
    type Decoded = (String, Vec<(String, String)>, Vec<(AlgorithmKind, Micros)>);

    /// Decodes `encode`'s bytes: proof that the encoding is injective.
    fn decode(bytes: &[u8]) -> Option<Decoded> {
        /// The next length-prefixed part of `rest`.
        fn take(rest: &mut &[u8]) -> Option<Vec<u8>> {
            let len = usize::try_from(u64::from_be_bytes(rest.get(..8)?.try_into().ok()?)).ok()?;
            let value = rest.get(8..8 + len)?.to_vec();
            *rest = &rest[8 + len..];
            Some(value)
        }
        let mut rest = bytes;
        (take(&mut rest)? == ENCODING_TAG).then_some(())?;
        let domain = String::from_utf8(take(&mut rest)?).ok()?;
        let count = u64::from_be_bytes(take(&mut rest)?.try_into().ok()?);
        let mut entries = Vec::new();
        for _ in 0..count {
            let key = String::from_utf8(take(&mut rest)?).ok()?;
            let value = String::from_utf8(take(&mut rest)?).ok()?;
            entries.push((key, value));
        }
        let mut limits = Vec::new();
        while !rest.is_empty() {
            let record = rest.get(..9)?;
            let algorithm = AlgorithmKind::ALL
                .into_iter()
                .find(|kind| algorithm_code(*kind) == record[0])?;
            limits.push((algorithm, u64::from_be_bytes(record[1..].try_into().ok()?)));
            rest = &rest[9..];
        }
        Some((domain, entries, limits))
    }

    fn encoded(
        domain: &str,
        entries: &[(String, String)],
        limits: &[(AlgorithmKind, Micros)],
    ) -> Vec<u8> {
        let borrowed: Vec<Entry<'_>> = entries
            .iter()
            .map(|(key, value)| Entry { key, value })
            .collect();
        let mut bytes = Vec::new();
        encode(
            domain,
            &borrowed,
            &[],
            limits.iter().copied(),
            &mut |chunk| bytes.extend_from_slice(chunk),
        );
        bytes
    }

    /// Any algorithm.
    fn algorithm() -> impl Strategy<Value = AlgorithmKind> {
        prop::sample::select(AlgorithmKind::ALL.to_vec())
    }

    /// Client-chosen strings, biased towards separators and braces.
    fn text() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[a-c_{}:=,./*\\\u{0}-\u{7f}\u{e9}]{0,6}").expect("regex")
    }

    proptest! {
        #[test]
        fn encoding_is_injective(
            domain in text(),
            entries in prop::collection::vec((text(), text()), 0..4),
            limits in prop::collection::vec((algorithm(), any::<u64>()), 0..3),
        ) {
            let bytes = encoded(&domain, &entries, &limits);
            prop_assert_eq!(decode(&bytes), Some((domain, entries, limits)));
        }

        #[test]
        fn distinct_descriptors_get_distinct_keys(
            a in (text(), prop::collection::vec((text(), text()), 0..4), prop::collection::vec((algorithm(), 0..3u64), 0..3)),
            b in (text(), prop::collection::vec((text(), text()), 0..4), prop::collection::vec((algorithm(), 0..3u64), 0..3)),
        ) {
            prop_assume!(a != b);
            let key = |(domain, entries, limits): &Decoded| {
                let borrowed: Vec<Entry<'_>> = entries.iter().map(|(key, value)| Entry { key, value }).collect();
                CounterKey::new(domain, &borrowed, &[], limits.iter().copied())
            };
            prop_assert_ne!(key(&a), key(&b));
        }
    }

    /// A fixed window of a minute.
    const MINUTE: (AlgorithmKind, Micros) = (AlgorithmKind::FixedWindow, 60_000_000);

    #[test]
    fn limits_of_other_windows_or_algorithms_count_apart() {
        let entries = [entry("user", "alice")];
        let minute = CounterKey::new("d", &entries, &[], [MINUTE]);
        assert_eq!(minute, CounterKey::new("d", &entries, &[], [MINUTE]));
        let (fixed, period) = MINUTE;
        for other in [
            vec![(fixed, period / 60)],
            vec![(fixed, period * 60)],
            vec![(AlgorithmKind::TokenBucket, period)],
            vec![MINUTE, MINUTE],
            vec![],
        ] {
            assert_ne!(
                minute,
                CounterKey::new("d", &entries, &[], other.clone()),
                "{other:?}"
            );
        }
    }

    fn entry<'a>(key: &'a str, value: &'a str) -> Entry<'a> {
        Entry { key, value }
    }

    #[test]
    fn separator_tricks_do_not_collide() {
        let joined = CounterKey::new("d", &[entry("user", "alice_path_/login")], &[], [MINUTE]);
        let split = CounterKey::new(
            "d",
            &[entry("user", "alice"), entry("path", "/login")],
            &[],
            [MINUTE],
        );
        assert_ne!(joined, split);
        let shifted = CounterKey::new("d_user", &[entry("alice", "x")], &[], [MINUTE]);
        let plain = CounterKey::new("d", &[entry("user_alice", "x")], &[], [MINUTE]);
        assert_ne!(shifted, plain);
    }

    #[test]
    fn share_pattern_replaces_value() {
        let a = CounterKey::new(
            "d",
            &[entry("files", "files/a.pdf")],
            &[Some("files/*")],
            [MINUTE],
        );
        let b = CounterKey::new(
            "d",
            &[entry("files", "files/b.csv")],
            &[Some("files/*")],
            [MINUTE],
        );
        assert_eq!(a, b);
        let c = CounterKey::new("d", &[entry("files", "files/*")], &[], [MINUTE]);
        assert_eq!(a, c);
    }

    #[test]
    fn stable_across_runs() {
        let key = CounterKey::new("domain", &[entry("key", "value")], &[], [MINUTE]);
        assert_eq!(key.hex().len(), 32);
        assert_eq!(key.hex().as_bytes(), key.hex_bytes());
        assert_eq!(CounterKey(0xab).hex_bytes()[28..], *b"00ab");
        assert_eq!(
            key,
            CounterKey::new("domain", &[entry("key", "value")], &[], [MINUTE])
        );
        // Keys are shared by instances and kept in Redis: the encoding never changes
        // without its tag.
        assert_eq!(key.hex(), "e703e021c07f6138607251f351049937");
    }
}
