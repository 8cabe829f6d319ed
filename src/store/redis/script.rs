//! The Lua script: one file per algorithm family under `scripts/`, joined with the
//! shared helpers and the entry point into one script, so that a descriptor whose limits
//! use different algorithms is still decided in one atomic call.
//!
//! Wire format (see `scripts/main.lua`): KEYS are every limit key of every check in
//! order; ARGV is `now` (empty: Redis `TIME`), `1`/`0` (charge or peek), the number of
//! checks, then per check its cost, its number of limits, and per limit five numbers.
//! The reply is five integers per limit.

use std::sync::LazyLock;

use crate::algorithm::{AlgorithmKind, Decision, Micros};
use crate::store::{CounterKey, StoreCheck, StoreError};

/// The whole script, as loaded with `SCRIPT LOAD`.
pub const SCRIPT: &str = concat!(
    include_str!("scripts/common.lua"),
    include_str!("scripts/fixed_window.lua"),
    include_str!("scripts/sliding_window.lua"),
    include_str!("scripts/sliding_log.lua"),
    include_str!("scripts/token_bucket.lua"),
    include_str!("scripts/gcra.lua"),
    include_str!("scripts/main.lua"),
);

/// SHA-1 of [`SCRIPT`], the name `EVALSHA` runs it by.
pub static SHA: LazyLock<String> = LazyLock::new(|| fred::util::sha1_hash(SCRIPT));

/// Integers the script returns per limit.
const REPLY_WIDTH: usize = 5;

/// Redis key of limit `index` of the descriptor `key`: our digest is the hash tag, so
/// every limit of a descriptor lives in one slot.
pub fn limit_key(key: CounterKey, index: usize) -> String {
    format!("sluice:{{{}}}:{index}", key.hex())
}

/// The algorithm's number in the wire format.
fn algorithm_code(kind: AlgorithmKind) -> u8 {
    match kind {
        AlgorithmKind::FixedWindow => 1,
        AlgorithmKind::SlidingWindow => 2,
        AlgorithmKind::SlidingLog => 3,
        AlgorithmKind::TokenBucket => 4,
        AlgorithmKind::Gcra => 5,
    }
}

/// KEYS and ARGV of one script call.
#[derive(Debug, Default)]
pub struct Call {
    /// Limit keys in order.
    pub keys: Vec<String>,
    /// Arguments.
    pub args: Vec<String>,
    /// Limits decided by this call (the reply has five integers per limit).
    pub limits: usize,
}

impl Call {
    /// Hash slot of the call's keys (all of one call share it).
    pub fn slot(&self) -> u16 {
        self.keys
            .first()
            .map_or(0, |key| fred::util::redis_keyslot(key.as_bytes()))
    }

    /// A call deciding `checks` in order; `now` overrides Redis `TIME` (tests only).
    pub fn new<'a>(
        checks: impl IntoIterator<Item = &'a StoreCheck>,
        commit: bool,
        now: Option<Micros>,
    ) -> Self {
        let mut call = Self::default();
        call.args
            .push(now.map(|now| now.to_string()).unwrap_or_default());
        call.args.push(if commit { "1" } else { "0" }.to_owned());
        call.args.push(String::new()); // number of checks, set below
        let mut count = 0usize;
        for check in checks {
            count += 1;
            call.args.push(check.cost.to_string());
            call.args.push(check.limits.len().to_string());
            for (index, limit) in check.limits.iter().enumerate() {
                call.keys.push(limit_key(check.key, index));
                call.args.push(algorithm_code(limit.algorithm).to_string());
                call.args.push(limit.quota.limit.to_string());
                call.args.push(limit.quota.period.to_string());
                call.args.push(limit.quota.burst.to_string());
                call.args.push(
                    if limit.quota.stop_increment_when_over_limit {
                        "1"
                    } else {
                        "0"
                    }
                    .to_owned(),
                );
                call.limits += 1;
            }
        }
        call.args[2] = count.to_string();
        call
    }
}

/// Turns the script's reply into one decision per limit.
pub fn decode(reply: &[i64], limits: usize) -> Result<Vec<Decision>, StoreError> {
    if reply.len() != limits * REPLY_WIDTH {
        return Err(StoreError::Protocol(format!(
            "script returned {} integers for {limits} limits",
            reply.len()
        )));
    }
    let unsigned = |x: i64| u64::try_from(x).unwrap_or(0);
    Ok(reply
        .chunks_exact(REPLY_WIDTH)
        .map(|r| Decision {
            allowed: r[0] == 1,
            remaining: unsigned(r[1]),
            reset_after: unsigned(r[2]),
            retry_after: unsigned(r[3]),
            used: unsigned(r[4]),
        })
        .collect())
}
