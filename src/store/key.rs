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
        encode(domain, entries, share_patterns, &mut |bytes| {
            hasher.update(bytes)
        });
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

    /// [`Self::hex`] without allocating.
    pub fn hex_bytes(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, byte) in self.0.to_be_bytes().iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(byte >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(byte & 0x0f)];
        }
        out
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

/// The unambiguous encoding that is hashed: a version tag, then the domain, the entry
/// count and each key and value (or share pattern), every string length-prefixed.
/// Injective: the bytes decode back to exactly one (domain, entries) (tested).
fn encode(
    domain: &str,
    entries: &[Entry<'_>],
    share_patterns: &[Option<&str>],
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
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Decodes `encode`'s bytes: proof that the encoding is injective.
    fn decode(bytes: &[u8]) -> Option<(String, Vec<(String, String)>)> {
        let mut rest = bytes;
        let mut take = || -> Option<Vec<u8>> {
            let len = usize::try_from(u64::from_be_bytes(rest.get(..8)?.try_into().ok()?)).ok()?;
            let value = rest.get(8..8 + len)?.to_vec();
            rest = &rest[8 + len..];
            Some(value)
        };
        (take()? == ENCODING_TAG).then_some(())?;
        let domain = String::from_utf8(take()?).ok()?;
        let count = u64::from_be_bytes(take()?.try_into().ok()?);
        let mut entries = Vec::new();
        for _ in 0..count {
            let key = String::from_utf8(take()?).ok()?;
            let value = String::from_utf8(take()?).ok()?;
            entries.push((key, value));
        }
        rest.is_empty().then_some((domain, entries))
    }

    fn encoded(domain: &str, entries: &[(String, String)]) -> Vec<u8> {
        let borrowed: Vec<Entry<'_>> = entries
            .iter()
            .map(|(key, value)| Entry { key, value })
            .collect();
        let mut bytes = Vec::new();
        encode(domain, &borrowed, &[], &mut |chunk| {
            bytes.extend_from_slice(chunk)
        });
        bytes
    }

    /// Client-chosen strings, biased towards separators and braces.
    fn text() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[a-c_{}:=,./*\\\u{0}-\u{7f}\u{e9}]{0,6}").expect("regex")
    }

    proptest! {
        #[test]
        fn encoding_is_injective(domain in text(), entries in prop::collection::vec((text(), text()), 0..4)) {
            let bytes = encoded(&domain, &entries);
            prop_assert_eq!(decode(&bytes), Some((domain, entries)));
        }

        #[test]
        fn distinct_descriptors_get_distinct_keys(
            a in (text(), prop::collection::vec((text(), text()), 0..4)),
            b in (text(), prop::collection::vec((text(), text()), 0..4)),
        ) {
            prop_assume!(a != b);
            let key = |(domain, entries): &(String, Vec<(String, String)>)| {
                let borrowed: Vec<Entry<'_>> = entries.iter().map(|(key, value)| Entry { key, value }).collect();
                CounterKey::new(domain, &borrowed, &[])
            };
            prop_assert_ne!(key(&a), key(&b));
        }
    }

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
        assert_eq!(key.hex().as_bytes(), key.hex_bytes());
        assert_eq!(CounterKey(0xab).hex_bytes()[28..], *b"00ab");
        assert_eq!(
            key,
            CounterKey::new("domain", &[entry("key", "value")], &[])
        );
    }
}
