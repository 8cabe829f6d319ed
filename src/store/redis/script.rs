//! The Lua script: one file per algorithm family under `scripts/`, joined with the
//! shared helpers and the entry point into one script, so that a descriptor whose limits
//! use different algorithms is still decided in one atomic call.
//!
//! Wire format (see `scripts/main.lua`): KEYS are every limit key of every check in
//! order; ARGV is `now` (empty: Redis `TIME`), `1`/`0` (charge or peek), the other
//! regions' key suffixes (their count first), the number of distinct rules, then per
//! rule its number of limits and per limit six numbers (and, for an aggregated limit,
//! each other region's floor), then
//! per run of consecutive checks with one rule and cost: the rule's index, the cost
//! (negative for a refund of that many units), the number of checks and the longest
//! wait a refused check may be admitted after (a batch's checks mostly share both: a few arguments, not two
//! per check, for Redis to read).
//! The reply is one string: five little-endian doubles per limit (see [`decode`]).

use std::collections::HashMap;
use std::sync::LazyLock;

use std::io::Write;

use bytes::{BufMut, Bytes, BytesMut};
use fred::types::Value;

use crate::algorithm::{AlgorithmKind, Decision, Micros};
use crate::regions::Sharing;
use crate::store::redis::links::{Published, RegionLinks};
use crate::store::{CounterKey, KeyPrefix, LimitCheck, StoreCheck, StoreError};

/// The shared helpers and every algorithm, which each entry point (a file under
/// `scripts/`) follows.
macro_rules! algorithms {
    () => {
        concat!(
            include_str!("scripts/common.lua"),
            include_str!("scripts/fixed_window.lua"),
            include_str!("scripts/sliding_window.lua"),
            include_str!("scripts/sliding_log.lua"),
            include_str!("scripts/token_bucket.lua"),
            include_str!("scripts/gcra.lua"),
        )
    };
}

/// The shared helpers and every algorithm.
pub(crate) const ALGORITHMS: &str = algorithms!();

/// The main entry point's working tables and their helpers, made before the entry
/// point: kept from call to call in the function library.
pub(crate) const CHECK_STATE: &str = include_str!("scripts/check_state.lua");

/// The main entry point: decides a batch of checks.
pub(crate) const ENTRY: &str = include_str!("scripts/main.lua");

/// The whole script, as loaded with `SCRIPT LOAD`.
pub(crate) const SCRIPT: &str = concat!(
    algorithms!(),
    include_str!("scripts/check_state.lua"),
    include_str!("scripts/main.lua")
);

/// SHA-1 of [`SCRIPT`], the name `EVALSHA` runs it by.
pub(crate) static SHA: LazyLock<Value> =
    LazyLock::new(|| Value::from(fred::util::sha1_hash(SCRIPT)));

/// The lease entry point (`scripts/lease.lua`).
pub(crate) const LEASE_ENTRY: &str = include_str!("scripts/lease.lua");

/// The whole lease script, as loaded with `SCRIPT LOAD`: the helpers and algorithms
/// joined with the lease entry point instead of `main.lua`.
pub(crate) const LEASE_SCRIPT: &str = concat!(algorithms!(), include_str!("scripts/lease.lua"));

/// SHA-1 of [`LEASE_SCRIPT`], the name `EVALSHA` runs it by.
pub(crate) static LEASE_SHA: LazyLock<Value> =
    LazyLock::new(|| Value::from(fred::util::sha1_hash(LEASE_SCRIPT)));

/// The hold entry point (`scripts/hold.lua`): concurrency limits.
pub(crate) const HOLD_ENTRY: &str = include_str!("scripts/hold.lua");

/// The whole hold script, as loaded with `SCRIPT LOAD`: the shared helpers and the hold
/// entry point (it needs no algorithm).
pub(crate) const HOLD_SCRIPT: &str = concat!(
    include_str!("scripts/common.lua"),
    include_str!("scripts/hold.lua")
);

/// SHA-1 of [`HOLD_SCRIPT`], the name `EVALSHA` runs it by.
pub(crate) static HOLD_SHA: LazyLock<Value> =
    LazyLock::new(|| Value::from(fred::util::sha1_hash(HOLD_SCRIPT)));

/// The region exchange's entry points (`scripts/export.lua`, `import.lua`, `seen.lua`):
/// reading aggregated limits' states, keeping another region's, and each region's mark.
pub(crate) const EXPORT_ENTRY: &str = include_str!("scripts/export.lua");
/// See [`EXPORT_ENTRY`].
pub(crate) const IMPORT_ENTRY: &str = include_str!("scripts/import.lua");
/// See [`EXPORT_ENTRY`].
pub(crate) const SEEN_ENTRY: &str = include_str!("scripts/seen.lua");

/// The whole export script, as loaded with `SCRIPT LOAD`.
const EXPORT_SCRIPT: &str = include_str!("scripts/export.lua");
/// The whole import script: the helpers and algorithms (it decodes and merges states).
const IMPORT_SCRIPT: &str = concat!(algorithms!(), include_str!("scripts/import.lua"));
/// The whole seen script.
const SEEN_SCRIPT: &str = include_str!("scripts/seen.lua");

/// SHA-1 of each exchange script, the name `EVALSHA` runs it by.
static EXPORT_SHA: LazyLock<Value> =
    LazyLock::new(|| Value::from(fred::util::sha1_hash(EXPORT_SCRIPT)));
/// See [`EXPORT_SHA`].
static IMPORT_SHA: LazyLock<Value> =
    LazyLock::new(|| Value::from(fred::util::sha1_hash(IMPORT_SCRIPT)));
/// See [`EXPORT_SHA`].
static SEEN_SHA: LazyLock<Value> =
    LazyLock::new(|| Value::from(fred::util::sha1_hash(SEEN_SCRIPT)));

/// Which entry point a call runs: the main one, the lease's, the hold's, or one of the
/// region exchange's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// `scripts/main.lua`: decides checks.
    Check,
    /// `scripts/lease.lua`: grants a lease.
    Lease,
    /// `scripts/hold.lua`: takes, probes or frees a concurrency limit's slot.
    Hold,
    /// `scripts/export.lua`: reads states to publish.
    Export,
    /// `scripts/import.lua`: keeps another region's published states.
    Import,
    /// `scripts/seen.lua`: writes or reads another region's mark.
    Seen,
}

impl Entry {
    /// The whole script of this entry point, for `SCRIPT LOAD`.
    pub(crate) fn script(self) -> &'static str {
        match self {
            Entry::Check => SCRIPT,
            Entry::Lease => LEASE_SCRIPT,
            Entry::Hold => HOLD_SCRIPT,
            Entry::Export => EXPORT_SCRIPT,
            Entry::Import => IMPORT_SCRIPT,
            Entry::Seen => SEEN_SCRIPT,
        }
    }

    /// The SHA-1 of [`Entry::script`], for `EVALSHA`.
    pub(crate) fn sha(self) -> &'static Value {
        match self {
            Entry::Check => &SHA,
            Entry::Lease => &LEASE_SHA,
            Entry::Hold => &HOLD_SHA,
            Entry::Export => &EXPORT_SHA,
            Entry::Import => &IMPORT_SHA,
            Entry::Seen => &SEEN_SHA,
        }
    }
}

/// Numbers the script returns per limit.
const REPLY_WIDTH: usize = 5;

/// Bytes of one number of the reply (a little-endian double).
const NUMBER_BYTES: usize = 8;

/// Redis key of limit `index` of the descriptor `key`, after the deployment's `prefix`:
/// our digest is the hash tag (the prefix holds no brace), so every limit of a
/// descriptor lives in one slot.
pub fn limit_key(prefix: &KeyPrefix, key: CounterKey, index: usize) -> String {
    format!("{}sluice:{{{}}}:{index}", prefix.as_str(), key.hex())
}

/// Hash slot of every limit key of the descriptor `key` (the slot of its hash tag, the
/// digest's hex), computed without building a key.
pub(crate) fn slot(key: CounterKey) -> u16 {
    fred::util::redis_keyslot(&key.hex_bytes())
}

/// Bytes of one limit key after the deployment's prefix: room for `sluice:`, the tag,
/// and any index.
const KEY_CAPACITY: usize = 64;
/// Keys written into one shared buffer before the next one is allocated.
const KEYS_PER_BUFFER: usize = 32;

/// [`limit_key`] written into `buffer` (which many keys share) and split off it.
fn limit_key_in(prefix: &[u8], key: CounterKey, index: usize, buffer: &mut BytesMut) -> Bytes {
    let room = prefix.len() + KEY_CAPACITY;
    if buffer.capacity() < room {
        *buffer = BytesMut::with_capacity(room * KEYS_PER_BUFFER);
    }
    buffer.put_slice(prefix);
    buffer.put_slice(b"sluice:{");
    buffer.put_slice(&key.hex_bytes());
    buffer.put_slice(b"}:");
    let mut writer = buffer.writer();
    // Writing into a BytesMut cannot fail.
    let _ = write!(writer, "{index}");
    writer.into_inner().split().freeze()
}

/// The algorithm's number in the wire format.
fn algorithm_code(kind: AlgorithmKind) -> u8 {
    match kind {
        AlgorithmKind::FixedWindow => 1,
        AlgorithmKind::SlidingWindow => 2,
        AlgorithmKind::SlidingLog => 3,
        AlgorithmKind::TokenBucket => 4,
        AlgorithmKind::Gcra => 5,
        // No algorithm of the main script: it refuses the call (the hold script
        // decides concurrency limits).
        AlgorithmKind::Concurrency => 6,
    }
}

/// One script call: its entry point and argument list after the script's name (the
/// number of keys, the keys, then ARGV), built once as fred values (numbers as integers,
/// which fred writes as bulk strings without formatting them into strings). Whether it
/// goes as `FCALL` or `EVALSHA` is chosen when it is sent ([`super::functions`]).
#[derive(Debug)]
pub(crate) struct Call {
    /// The number of keys, the keys, then ARGV.
    pub(crate) args: Vec<Value>,
    /// What it runs.
    pub(crate) entry: Entry,
    /// Hash slot of the keys (all of one call share it).
    slot: u16,
    /// Limits decided by this call (the main script's reply has five numbers per limit).
    pub(crate) limits: usize,
}

/// A number as a script argument.
pub(crate) fn number(x: u64) -> Value {
    i64::try_from(x).map_or_else(|_| Value::from(x.to_string()), Value::Integer)
}

impl Call {
    /// A call of `entry` on `keys`, all in one slot, with `argv`.
    pub(crate) fn of(entry: Entry, mut keys: Vec<Value>, mut argv: Vec<Value>) -> Self {
        let slot = keys
            .first()
            .and_then(Value::as_bytes)
            .map_or(0, fred::util::redis_keyslot);
        let mut args = Vec::with_capacity(1 + keys.len() + argv.len());
        args.push(number(keys.len() as u64));
        args.append(&mut keys);
        args.append(&mut argv);
        Self {
            args,
            entry,
            slot,
            limits: 0,
        }
    }

    /// Hash slot of the call's keys.
    pub(crate) fn slot(&self) -> u16 {
        self.slot
    }

    /// A call deciding `checks` in order, their keys after `prefix`; `now` overrides
    /// Redis `TIME` (tests only). Each distinct rule (list of limits) is sent once, and
    /// each run of checks names its rule by index: the checks of a batch mostly share one.
    /// An aggregated limit (`sharing: aggregate`) counts the other regions of `regions`,
    /// each at least at its fallback share while its link is cut; a committed charge of
    /// one is recorded to be published to them.
    pub(crate) fn new<'a>(
        prefix: &KeyPrefix,
        checks: impl IntoIterator<Item = &'a StoreCheck>,
        commit: bool,
        now: Option<Micros>,
        regions: Option<&RegionLinks>,
    ) -> Self {
        let peers = regions.map_or(&[][..], RegionLinks::peers);
        // Aggregated keys this call charges (none without other regions).
        let mut charged: Vec<Published> = Vec::new();
        let flag = |on: bool| Value::Integer(i64::from(on));
        let checks = checks.into_iter();
        // Sized for one limit per check, the common case.
        let (expected, _) = checks.size_hint();
        let mut keys: Vec<Value> = Vec::with_capacity(expected);
        let mut rules: Vec<&'a [LimitCheck]> = Vec::new();
        // A rule's index in `rules`; consecutive checks mostly share a rule, so the
        // previous check's is tried before hashing (a batch can hold many rules).
        let mut rule_index: HashMap<&'a [LimitCheck], usize> = HashMap::new();
        let mut previous: Option<(&'a [LimitCheck], usize)> = None;
        // Per run of checks: the rule's index (1-based, as Lua counts), the cost and the
        // number of checks; the run being built is `run`.
        let mut tail: Vec<Value> = Vec::new();
        let mut run: Option<Run> = None;
        let mut limits = 0;
        let mut key_buffer = BytesMut::new();
        for check in checks {
            let limits_of_check: &[LimitCheck] = &check.limits;
            let rule = match previous {
                Some((limits, index)) if limits == limits_of_check => index,
                _ => {
                    let next = rules.len();
                    let index = *rule_index.entry(limits_of_check).or_insert(next);
                    if index == next {
                        rules.push(limits_of_check);
                    }
                    previous = Some((limits_of_check, index));
                    index
                }
            };
            match &mut run {
                Some(current)
                    if current.rule == rule
                        && current.cost == check.cost
                        && current.refund == check.refund
                        && current.max_wait == check.max_wait =>
                {
                    current.checks += 1;
                }
                _ => {
                    if let Some(done) = run.replace(Run::first(rule, check)) {
                        done.push_to(&mut tail);
                    }
                }
            }
            if commit && !check.refund && check.cost > 0 && !peers.is_empty() {
                charged.extend(
                    check
                        .limits
                        .iter()
                        .enumerate()
                        .filter_map(|(index, limit)| {
                            matches!(limit.sharing, Sharing::Aggregate(_)).then_some(Published {
                                key: check.key.for_limit(index),
                                algorithm: limit.algorithm,
                                period: limit.quota.period,
                            })
                        }),
                );
            }
            for index in 0..check.limits.len() {
                keys.push(Value::Bytes(limit_key_in(
                    prefix.as_str().as_bytes(),
                    check.key,
                    index,
                    &mut key_buffer,
                )));
            }
            limits += check.limits.len();
        }
        if let Some(done) = run {
            done.push_to(&mut tail);
        }
        if let (Some(regions), false) = (regions, charged.is_empty()) {
            regions.mark_charged(charged);
        }
        let rule_args: usize = rules.iter().map(|rule| 1 + 6 * rule.len()).sum();
        let mut argv: Vec<Value> = Vec::with_capacity(4 + peers.len() + rule_args + tail.len());
        argv.push(now.map_or_else(|| Value::from_static_str(""), number));
        argv.push(flag(commit));
        argv.push(number(peers.len() as u64));
        argv.extend(peers.iter().map(|peer| Value::Bytes(peer.suffix.clone())));
        argv.push(number(rules.len() as u64));
        for rule in &rules {
            argv.push(number(rule.len() as u64));
            for limit in *rule {
                argv.push(Value::Integer(i64::from(algorithm_code(limit.algorithm))));
                argv.push(number(limit.quota.limit));
                argv.push(number(limit.quota.period));
                argv.push(number(limit.quota.burst));
                argv.push(flag(limit.quota.charges_always()));
                match limit.sharing {
                    Sharing::Aggregate(weights) if !peers.is_empty() => {
                        argv.push(number(peers.len() as u64));
                        argv.extend(peers.iter().map(|peer| {
                            number(if peer.is_stale() {
                                weights.fallback_share(limit.quota.limit, peer.index)
                            } else {
                                0
                            })
                        }));
                    }
                    _ => argv.push(number(0)),
                }
            }
        }
        argv.append(&mut tail);
        Self {
            limits,
            ..Self::of(Entry::Check, keys, argv)
        }
    }
}

/// Consecutive checks of a call with one rule and one cost.
struct Run {
    /// Index into the call's rules (0-based).
    rule: usize,
    cost: u64,
    /// The checks give `cost` back.
    refund: bool,
    /// The longest wait a refused check may be admitted after (0: never).
    max_wait: Micros,
    checks: u64,
}

impl Run {
    /// A run of `check` alone, under rule `rule`.
    fn first(rule: usize, check: &StoreCheck) -> Self {
        Self {
            rule,
            cost: check.cost,
            refund: check.refund,
            max_wait: check.max_wait,
            checks: 1,
        }
    }

    /// The run's four arguments: rule index (1-based, as Lua counts), cost (negative:
    /// a refund of that many units), checks, and the longest wait a refused check may
    /// be admitted after.
    fn push_to(self, argv: &mut Vec<Value>) {
        argv.push(number(self.rule as u64 + 1));
        argv.push(if self.refund && self.cost > 0 {
            negative(self.cost)
        } else {
            number(self.cost)
        });
        argv.push(number(self.checks));
        argv.push(number(self.max_wait));
    }
}

/// `-x` as a script argument.
fn negative(x: u64) -> Value {
    i64::try_from(x).map_or_else(|_| Value::from(format!("-{x}")), |x| Value::Integer(-x))
}

/// Turns the script's reply into one decision per limit. The reply is one string of
/// five little-endian doubles per limit (allowed as 1 or 0, remaining, reset_after,
/// retry_after, used): the numbers Lua holds, exactly, where a RESP integer per number
/// cost the client a frame each. Each is a whole number; one past `u64::MAX` reads as
/// `u64::MAX`, a negative or NaN one as 0 (Rust `as`).
pub(crate) fn decode(reply: &Value, limits: usize) -> Result<Vec<Decision>, StoreError> {
    let bytes = reply
        .as_bytes()
        .ok_or_else(|| StoreError::Protocol("script reply is not a string".into()))?;
    if bytes.len() != limits * REPLY_WIDTH * NUMBER_BYTES {
        return Err(StoreError::Protocol(format!(
            "script returned {} bytes for {limits} limits",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(REPLY_WIDTH * NUMBER_BYTES)
        .map(|limit| {
            // Number `i` of this limit's five.
            let number = |i: usize| {
                let mut word = [0; NUMBER_BYTES];
                word.copy_from_slice(&limit[i * NUMBER_BYTES..(i + 1) * NUMBER_BYTES]);
                f64::from_le_bytes(word) as u64
            };
            Decision {
                allowed: number(0) == 1,
                remaining: number(1),
                reset_after: number(2),
                retry_after: number(3),
                used: number(4),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply of `numbers`, as the script packs it.
    fn packed(numbers: &[f64]) -> Value {
        let bytes: Vec<u8> = numbers.iter().flat_map(|x| x.to_le_bytes()).collect();
        Value::Bytes(bytes.into())
    }

    #[test]
    fn replies_decode_to_one_decision_per_limit() {
        let reply = packed(&[1.0, 9.0, 1.0, 0.0, 1.0, 0.0, 0.0, 2e6, 5e5, 3.0]);
        let decisions = decode(&reply, 2).expect("two limits");
        assert_eq!(
            decisions,
            [
                Decision {
                    allowed: true,
                    remaining: 9,
                    reset_after: 1,
                    retry_after: 0,
                    used: 1,
                },
                Decision {
                    allowed: false,
                    remaining: 0,
                    reset_after: 2_000_000,
                    retry_after: 500_000,
                    used: 3,
                },
            ]
        );
    }

    #[test]
    fn numbers_past_u64_read_as_its_largest_and_nan_as_zero() {
        let reply = packed(&[1.0, 2f64.powi(70), f64::NAN, -4.0, 2f64.powi(60)]);
        let [decision] = decode(&reply, 1).expect("one limit")[..] else {
            panic!("one decision");
        };
        assert_eq!(decision.remaining, u64::MAX);
        assert_eq!((decision.reset_after, decision.retry_after), (0, 0));
        assert_eq!(decision.used, 1 << 60);
    }

    #[test]
    fn a_reply_of_the_wrong_size_or_type_is_a_protocol_error() {
        for (reply, limits) in [
            (packed(&[1.0; 5]), 2),
            (packed(&[1.0; 6]), 1),
            (Value::Array(vec![Value::Integer(1); 5]), 1),
        ] {
            assert!(matches!(
                decode(&reply, limits),
                Err(StoreError::Protocol(_))
            ));
        }
    }

    #[test]
    fn keys_built_in_a_shared_buffer_equal_the_formatted_ones() {
        for prefix in ["", "tenant-a:", &"long-prefix:".repeat(10)] {
            let prefix = KeyPrefix::new(prefix).expect("a prefix");
            let mut buffer = BytesMut::new();
            for n in 0..100u128 {
                let key = CounterKey(n.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835));
                let index = (n % 12) as usize;
                let built = limit_key_in(prefix.as_str().as_bytes(), key, index, &mut buffer);
                let formatted = limit_key(&prefix, key, index);
                assert_eq!(built, formatted.as_bytes());
                assert!(formatted.starts_with(prefix.as_str()));
                // The prefix never moves the slot: the digest stays the hash tag.
                assert_eq!(slot(key), fred::util::redis_keyslot(formatted.as_bytes()));
            }
        }
    }
}
