//! The lease script (`scripts/lease.lua`): the shared helpers and algorithm files of
//! [`super::script`] joined with a lease entry point instead of `main.lua`, run with its
//! own `EVALSHA`. Lease calls are rare by design (one per leased batch of units), so
//! they bypass the batcher; a NOSCRIPT answer loads the script and runs the call again
//! (it did not run, so nothing is charged twice).

use std::sync::LazyLock;

use fred::prelude::{ClientLike, LuaInterface};
use fred::types::{ClusterHash, CustomCommand, Value};

use super::batcher::{unrouted, Shared};
use super::client::{classify, is_noscript};
use super::nodes::Node;
use super::script::limit_key;
use crate::algorithm::{AlgorithmKind, Decision, Micros};
use crate::store::{LeaseGrant, LeaseRequest, StoreError};

/// The whole lease script, as loaded with `SCRIPT LOAD`.
pub const SCRIPT: &str = concat!(
    include_str!("scripts/common.lua"),
    include_str!("scripts/fixed_window.lua"),
    include_str!("scripts/sliding_window.lua"),
    include_str!("scripts/sliding_log.lua"),
    include_str!("scripts/token_bucket.lua"),
    include_str!("scripts/gcra.lua"),
    include_str!("scripts/lease.lua"),
);

/// SHA-1 of [`SCRIPT`].
pub static SHA: LazyLock<String> = LazyLock::new(|| fred::util::sha1_hash(SCRIPT));

/// Integers the script returns.
const REPLY_WIDTH: usize = 8;

/// The algorithm's number in the wire format (as `script.rs`), `None` if it cannot lease.
fn algorithm_code(kind: AlgorithmKind) -> Option<u8> {
    match kind {
        AlgorithmKind::FixedWindow => Some(1),
        AlgorithmKind::SlidingWindow => Some(2),
        AlgorithmKind::SlidingLog => None,
        AlgorithmKind::TokenBucket => Some(4),
        AlgorithmKind::Gcra => Some(5),
    }
}

/// KEYS and ARGV of one lease call; `now` overrides Redis `TIME` (tests only).
fn call(request: &LeaseRequest, now: Option<Micros>) -> Result<(String, Vec<String>), StoreError> {
    let check = &request.check;
    let [limit] = check.limits.as_slice() else {
        return Err(StoreError::Protocol(format!(
            "a lease covers one limit, not {}",
            check.limits.len()
        )));
    };
    let code = algorithm_code(limit.algorithm).ok_or_else(|| {
        StoreError::Protocol(format!("{} cannot lease", limit.algorithm.as_str()))
    })?;
    let (unused, granted_at, granted_lifetime) = request.give_back.unwrap_or((0, 0, 0));
    let args = vec![
        now.map(|now| now.to_string()).unwrap_or_default(),
        code.to_string(),
        limit.quota.limit.to_string(),
        limit.quota.period.to_string(),
        limit.quota.burst.to_string(),
        u8::from(limit.quota.stop_increment_when_over_limit).to_string(),
        check.cost.to_string(),
        request.units.to_string(),
        unused.to_string(),
        granted_at.to_string(),
        request.lifetime.to_string(),
        granted_lifetime.to_string(),
    ];
    Ok((limit_key(check.key, 0), args))
}

/// Runs one lease call.
pub async fn run(
    shared: &Shared,
    request: &LeaseRequest,
    now: Option<Micros>,
) -> Result<LeaseGrant, StoreError> {
    let (key, args) = call(request, now)?;
    let slot = fred::util::redis_keyslot(key.as_bytes());
    let node = shared
        .nodes
        .topology()
        .route(slot)
        .cloned()
        .ok_or_else(|| unrouted(slot))?;
    let result = on_node(shared, &node, &key, &args).await;
    shared
        .health
        .record(&node.name, result.as_ref().map(|_| ()));
    if result.is_err() {
        shared.nodes.suspect();
    }
    let reply = result?;
    let numbers: Vec<i64> = reply
        .convert()
        .map_err(|e| StoreError::Protocol(format!("lease reply: {}", e.details())))?;
    decode(&numbers)
}

/// The lease call on `node`; a NOSCRIPT answer loads the script there and runs the call
/// again.
async fn on_node(
    shared: &Shared,
    node: &Node,
    key: &str,
    args: &[String],
) -> Result<Value, StoreError> {
    // Sent as the batcher sends its calls: a custom EVALSHA.
    let run = || async {
        let command = CustomCommand::new_static("EVALSHA", ClusterHash::FirstKey, false);
        let mut values: Vec<Value> = Vec::with_capacity(3 + args.len());
        values.push(SHA.as_str().into());
        values.push(Value::Integer(1));
        values.push(key.into());
        values.extend(args.iter().map(|arg| Value::from(arg.as_str())));
        tokio::time::timeout(
            shared.timeout,
            node.client.custom::<Value, _>(command, values),
        )
        .await
        .map_err(|_| StoreError::Timeout(shared.timeout))
    };
    match run().await? {
        Err(error) if is_noscript(&error) => {
            node.client
                .script_load::<String, _>(SCRIPT)
                .await
                .map_err(|error| classify(&error, shared.timeout))?;
            run().await?
        }
        other => other,
    }
    .map_err(|error| classify(&error, shared.timeout))
}

/// Turns the script's reply into a grant.
fn decode(reply: &[i64]) -> Result<LeaseGrant, StoreError> {
    let [allowed, remaining, reset_after, retry_after, used, units, store_now, window_left] =
        *reply
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
