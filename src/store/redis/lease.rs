//! The lease script (`scripts/lease.lua`): the shared helpers and algorithm files of
//! [`super::script`] joined with a lease entry point instead of `main.lua`, run as its
//! own call (`FCALL` of the library's lease function, or `EVALSHA`). Lease calls are rare by design (one per leased batch of units), so
//! they bypass the batcher's queue, but are sent as its calls are
//! ([`super::call::run_call`]: a missing script or library, MOVED, breaker, deadline).

use std::time::Instant;

use bytes::Bytes;
use fred::types::Value;

use super::call::{run_alone, Shared};
use super::script::{limit_key, number, Call, Entry};
use crate::algorithm::{AlgorithmKind, Decision, Micros};
use crate::store::{KeyPrefix, LeaseGrant, LeaseRequest, StoreError};

/// Integers the script returns.
const REPLY_WIDTH: usize = 8;

/// The algorithm's number in the wire format (as `script.rs`), `None` if it cannot lease.
fn algorithm_code(kind: AlgorithmKind) -> Option<u8> {
    match kind {
        AlgorithmKind::FixedWindow => Some(1),
        AlgorithmKind::SlidingWindow => Some(2),
        AlgorithmKind::SlidingLog | AlgorithmKind::Concurrency => None,
        AlgorithmKind::TokenBucket => Some(4),
        AlgorithmKind::Gcra => Some(5),
    }
}

/// The lease call for `request`, its key after `prefix`; `now` overrides Redis `TIME`
/// (tests only).
fn call(
    prefix: &KeyPrefix,
    request: &LeaseRequest,
    now: Option<Micros>,
) -> Result<Call, StoreError> {
    let check = &request.check;
    let [limit] = &check.limits[..] else {
        return Err(StoreError::Protocol(format!(
            "a lease covers one limit, not {}",
            check.limits.len()
        )));
    };
    let code = algorithm_code(limit.algorithm).ok_or_else(|| {
        StoreError::Protocol(format!("{} cannot lease", limit.algorithm.as_str()))
    })?;
    let (unused, granted_at, granted_lifetime) = request.give_back.unwrap_or((0, 0, 0));
    let argv = vec![
        now.map_or_else(|| Value::from_static_str(""), number),
        number(code.into()),
        number(limit.quota.limit),
        number(limit.quota.period),
        number(limit.quota.burst),
        number(check.cost),
        number(request.units),
        number(unused),
        number(granted_at),
        number(request.lifetime),
        number(granted_lifetime),
    ];
    let key = Value::Bytes(Bytes::from(limit_key(prefix, check.key, 0)));
    Ok(Call::of(Entry::Lease, vec![key], argv))
}

/// Runs one lease call, as the batcher runs its calls but on its own.
pub(crate) async fn run(
    shared: &Shared,
    request: &LeaseRequest,
    now: Option<Micros>,
) -> Result<LeaseGrant, StoreError> {
    let call = call(&shared.key_prefix, request, now)?;
    run_alone(shared, &call, Instant::now() + shared.timeout, decode).await
}

/// Turns the script's reply into a grant.
pub(crate) fn decode(reply: Value) -> Result<LeaseGrant, StoreError> {
    let reply: Vec<i64> = reply
        .convert()
        .map_err(|e| StoreError::Protocol(format!("lease script reply: {}", e.details())))?;
    let [allowed, remaining, reset_after, retry_after, used, units, store_now, window_left] =
        reply[..]
    else {
        return Err(StoreError::Protocol(format!(
            "lease script returned {} integers, not {REPLY_WIDTH}",
            reply.len()
        )));
    };
    let unsigned = |x: i64| u64::try_from(x).unwrap_or(0);
    Ok(LeaseGrant {
        decision: Decision {
            allowed: allowed == 1,
            remaining: unsigned(remaining),
            reset_after: unsigned(reset_after),
            retry_after: unsigned(retry_after),
            used: unsigned(used),
        },
        units: unsigned(units),
        store_now: unsigned(store_now),
        window_left: unsigned(window_left),
    })
}
