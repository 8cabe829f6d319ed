//! The hold script (`scripts/hold.lua`): concurrency limits. The shared helpers joined
//! with the hold entry point, run as its own call (`FCALL` of the library's hold
//! function, or `EVALSHA`), as lease calls are ([`super::call::run_call`]: a missing
//! script or library, MOVED, breaker, deadline). One call per request phase and one per
//! stream end: these bypass the batcher, whose calls decide rate algorithms.

use std::time::Instant;

use bytes::Bytes;
use fred::types::Value;

use super::call::{run_alone, Shared};
use super::script::{limit_key, number, Call, Entry};
use crate::algorithm::concurrency::SlotOp;
use crate::algorithm::{Decision, Micros};
use crate::store::{HoldCall, KeyPrefix, StoreError};

/// Integers the script returns.
const REPLY_WIDTH: usize = 5;

/// The script call for `hold`, its key after `prefix`; `now` overrides Redis `TIME`
/// (tests only).
fn call(prefix: &KeyPrefix, hold: &HoldCall, now: Option<Micros>) -> Call {
    let op = match hold.op {
        SlotOp::Acquire => Value::Integer(1),
        SlotOp::Probe => Value::Integer(0),
        SlotOp::Release => Value::Integer(-1),
    };
    let argv = vec![
        now.map_or_else(|| Value::from_static_str(""), number),
        op,
        Value::from(format!("{:016x}", hold.slot)),
        number(hold.quota.limit),
        number(hold.quota.period),
    ];
    let key = Value::Bytes(Bytes::from(limit_key(prefix, hold.key, 0)));
    Call::of(Entry::Hold, vec![key], argv)
}

/// Runs one hold call, as the batcher runs its calls but on its own.
pub(crate) async fn run(
    shared: &Shared,
    hold: &HoldCall,
    now: Option<Micros>,
) -> Result<Decision, StoreError> {
    let call = call(&shared.key_prefix, hold, now);
    run_alone(shared, &call, Instant::now() + shared.timeout, decode).await
}

/// Turns the script's reply into a decision.
fn decode(reply: Value) -> Result<Decision, StoreError> {
    let reply: Vec<i64> = reply
        .convert()
        .map_err(|e| StoreError::Protocol(format!("hold script reply: {}", e.details())))?;
    let [allowed, remaining, reset_after, retry_after, used] = reply[..] else {
        return Err(StoreError::Protocol(format!(
            "hold script returned {} integers, not {REPLY_WIDTH}",
            reply.len()
        )));
    };
    let unsigned = |x: i64| u64::try_from(x).unwrap_or(0);
    Ok(Decision {
        allowed: allowed == 1,
        remaining: unsigned(remaining),
        reset_after: unsigned(reset_after),
        retry_after: unsigned(retry_after),
        used: unsigned(used),
    })
}
