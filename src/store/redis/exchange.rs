//! The region exchange's calls (`scripts/export.lua`, `import.lua`, `seen.lua`): read
//! the states of aggregated limits to publish, keep another region's published states,
//! and write or read each region's mark. Each runs as its own call per hash slot
//! through [`super::call::run_call`] (a missing script or library, MOVED, breaker,
//! deadline), off the request path: the publisher ([`crate::exchange`]) makes
//! them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use fred::types::Value;

use super::call::{run_alone, Shared};
use super::script::{self, limit_key, number, Call, Entry};
use crate::algorithm::Micros;
use crate::store::redis::links::Published;
use crate::store::{KeyPrefix, StoreError};

/// Most keys in one exchange call: a call holds its node that long.
const KEYS_PER_CALL: usize = 500;

/// The keys of `items` grouped by hash slot, each group cut into calls of at most
/// [`KEYS_PER_CALL`]; each entry is the indexes of its items.
fn by_slot(items: &[Published]) -> Vec<Vec<usize>> {
    let mut slots: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (index, item) in items.iter().enumerate() {
        slots
            .entry(script::slot(item.key.counter))
            .or_default()
            .push(index);
    }
    slots
        .into_values()
        .flat_map(|indexes| {
            indexes
                .chunks(KEYS_PER_CALL)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Key of `item`'s state in this region's store.
fn state_key(prefix: &KeyPrefix, item: &Published) -> String {
    limit_key(prefix, item.key.counter, item.key.index as usize)
}

/// The stored states of `items` (`None` where a key holds none), within `timeout`.
pub(crate) async fn export(
    shared: &Shared,
    items: &[Published],
    timeout: Duration,
) -> Result<Vec<Option<Bytes>>, StoreError> {
    let deadline = Instant::now() + timeout;
    let mut states = vec![None; items.len()];
    for group in by_slot(items) {
        let keys = group
            .iter()
            .map(|&i| Value::from(state_key(&shared.key_prefix, &items[i])))
            .collect();
        let call = Call::of(Entry::Export, keys, Vec::new());
        let values = run_alone(shared, &call, deadline, |reply| match reply {
            Value::Array(values) => Ok(values),
            other => Err(StoreError::Protocol(format!(
                "export script reply is not an array: {other:?}"
            ))),
        })
        .await?;
        for (&i, value) in group.iter().zip(values) {
            states[i] = value.as_bytes().map(Bytes::copy_from_slice);
        }
    }
    Ok(states)
}

/// Keeps `states` (each `items`' state as its region published it) at the keys with
/// `suffix` (`:from:<region>`), within `timeout`; `now` overrides Redis `TIME` (tests).
/// The number of keys written.
pub(crate) async fn import(
    shared: &Shared,
    suffix: &[u8],
    items: &[(Published, Bytes)],
    now: Option<Micros>,
    timeout: Duration,
) -> Result<u64, StoreError> {
    let deadline = Instant::now() + timeout;
    let published: Vec<Published> = items.iter().map(|(item, _)| *item).collect();
    let mut written = 0;
    for group in by_slot(&published) {
        let mut keys = Vec::with_capacity(group.len());
        let mut argv = Vec::with_capacity(1 + 2 * group.len());
        argv.push(now.map_or_else(|| Value::from_static_str(""), number));
        for &i in &group {
            let (item, state) = &items[i];
            let mut key = BytesMut::from(state_key(&shared.key_prefix, item).as_bytes());
            key.extend_from_slice(suffix);
            keys.push(Value::Bytes(key.freeze()));
            argv.push(number(item.period));
            argv.push(Value::Bytes(state.clone()));
        }
        let call = Call::of(Entry::Import, keys, argv);
        written += run_alone(shared, &call, deadline, |reply| {
            reply
                .as_u64()
                .ok_or_else(|| StoreError::Protocol("import script reply is not a count".into()))
        })
        .await?;
    }
    Ok(written)
}

/// Key of the mark region `from` leaves in another region's store.
fn seen_key(prefix: &KeyPrefix, from: &str) -> Value {
    Value::from(format!("{}sluice:region:{{{from}}}:seen", prefix.as_str()))
}

/// Leaves region `from`'s mark (`keys` published) for `ttl`, within `timeout`.
pub(crate) async fn mark_seen(
    shared: &Shared,
    from: &str,
    keys: u64,
    ttl: Duration,
    timeout: Duration,
) -> Result<(), StoreError> {
    let argv = vec![
        Value::from(keys.to_string()),
        number(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)),
    ];
    let call = Call::of(Entry::Seen, vec![seen_key(&shared.key_prefix, from)], argv);
    run_alone(shared, &call, Instant::now() + timeout, |_| Ok(())).await
}

/// Region `from`'s mark here: the keys of its last publication and the mark's time left
/// (`None`: no mark, it has not published within the stale time), within `timeout`.
pub(crate) async fn read_seen(
    shared: &Shared,
    from: &str,
    timeout: Duration,
) -> Result<Option<(u64, Duration)>, StoreError> {
    let call = Call::of(
        Entry::Seen,
        vec![seen_key(&shared.key_prefix, from)],
        vec![Value::from_static_str("")],
    );
    run_alone(shared, &call, Instant::now() + timeout, |reply| {
        let Value::Array(values) = reply else {
            return Err(StoreError::Protocol(
                "seen script reply is not an array".into(),
            ));
        };
        let keys = values.first().and_then(Value::as_u64);
        let left = values.get(1).and_then(Value::as_i64).unwrap_or(-2);
        Ok(keys
            .zip(u64::try_from(left).ok())
            .map(|(keys, left)| (keys, Duration::from_millis(left))))
    })
    .await
}
