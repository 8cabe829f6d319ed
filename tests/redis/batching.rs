//! Batching, proven by Redis itself: concurrent calls on distinct keys share script
//! calls, counted from `INFO commandstats` (`FCALL` and `EVALSHA`) on each node.
//!
//! A standalone server takes one script call per batch, whatever the keys. A Redis
//! Cluster runs a script on the keys of one slot only, so a batch makes one call per
//! slot it touches, all of a node's calls pipelined on its connection: calls whose keys
//! share a slot share a script call, on each shard.

use std::sync::Arc;

use sluice::algorithm::{AlgorithmKind, Quota};
use sluice::rules::Entry;
use sluice::store::redis::script::limit_key;
use sluice::store::redis::{RedisMode, RedisStore};
use sluice::store::{CounterKey, KeyPrefix, LimitCheck, Store, StoreCheck};
use support::redis::{connected_store, RedisCluster, RedisServer};

/// Concurrent calls on a standalone server.
const CALLS: usize = 64;
/// Concurrent calls per shard of the cluster.
const CALLS_PER_SHARD: usize = 16;
/// The most script calls a burst of concurrent calls may take, at most `batch_max`
/// (256) of them: one batch, plus one in case the collector took the first call alone
/// before the others were queued (it sends a lone call at once).
const MOST_SCRIPT_CALLS: u64 = 2;

/// A day: no window turns while the test runs.
const DAY: u64 = 86_400_000_000;

fn check(domain: &str, value: &str) -> StoreCheck {
    StoreCheck {
        key: CounterKey::new(domain, &[Entry { key: "k", value }], &[], []),
        limits: vec![LimitCheck {
            algorithm: AlgorithmKind::FixedWindow,
            quota: Quota {
                limit: 1_000,
                period: DAY,
                burst: 1_000,
                on_over_limit: Default::default(),
            },
            sharing: sluice::regions::Sharing::Regional,
        }]
        .into(),
        cost: 1,
        refund: false,
        max_wait: 0,
    }
}

fn slot_of(check: &StoreCheck) -> u16 {
    fred::util::redis_keyslot(limit_key(&KeyPrefix::default(), check.key, 0).as_bytes())
}

/// `count` checks of `domain` on distinct keys that all hash to `slot` (found by trying
/// values in turn: one in 16 384 lands there).
fn checks_in_slot(domain: &str, slot: u16, count: usize) -> Vec<StoreCheck> {
    (0u64..)
        .map(|i| check(domain, &i.to_string()))
        .filter(|check| slot_of(check) == slot)
        .take(count)
        .collect()
}

/// Runs `checks` as concurrent calls of their own, each admitted. On this
/// current-thread runtime every call is queued before the batcher's collector runs.
async fn concurrently(store: &Arc<RedisStore>, checks: Vec<StoreCheck>) {
    let mut calls = tokio::task::JoinSet::new();
    for check in checks {
        let store = store.clone();
        calls.spawn(async move {
            let mut decisions = Vec::new();
            store
                .check(std::slice::from_ref(&check), &mut decisions)
                .await
                .expect("store check");
            assert!(decisions.iter().all(|d| d.allowed), "{decisions:?}");
        });
    }
    while let Some(call) = calls.join_next().await {
        call.expect("call task");
    }
}

#[tokio::test]
async fn concurrent_calls_on_one_server_share_one_script_call() {
    let redis = RedisServer::start();
    let store = Arc::new(connected_store(RedisMode::Standalone, redis.url()).await);
    // The first call loads the function library (and may meet NOSCRIPT once).
    concurrently(&store, vec![check("warm", "up")]).await;
    redis.cli(&["config", "resetstat"]);
    let checks = (0..CALLS)
        .map(|i| check("batching", &i.to_string()))
        .collect();
    concurrently(&store, checks).await;
    let script_calls = redis.script_calls();
    assert!(
        (1..=MOST_SCRIPT_CALLS).contains(&script_calls),
        "{CALLS} concurrent calls took {script_calls} script calls"
    );
    eprintln!("standalone: {CALLS} concurrent calls, {script_calls} script call(s)");
}

#[tokio::test]
async fn concurrent_calls_on_each_shard_share_one_script_call_per_slot() {
    let cluster = RedisCluster::start();
    let store = Arc::new(connected_store(RedisMode::Cluster, cluster.url()).await);
    // One slot in each third of the slot space: one per primary of a 3-master cluster.
    let slots = [100u16, 8_000, 16_000];
    let shards: Vec<usize> = slots.iter().map(|&slot| cluster.primary_of(slot)).collect();
    let mut distinct = shards.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "slots {slots:?} on primaries {shards:?}");
    let batches: Vec<Vec<StoreCheck>> = slots
        .iter()
        .map(|&slot| checks_in_slot("batching", slot, CALLS_PER_SHARD))
        .collect();
    // Warm every node up (library loaded), then count from zero.
    for batch in &batches {
        concurrently(&store, vec![check_in(batch)]).await;
    }
    for &shard in &shards {
        cluster.nodes[shard].cli(&["config", "resetstat"]);
    }
    concurrently(&store, batches.into_iter().flatten().collect()).await;
    for (slot, &shard) in slots.iter().zip(&shards) {
        let script_calls = cluster.nodes[shard].script_calls();
        assert!(
            (1..=MOST_SCRIPT_CALLS).contains(&script_calls),
            "{CALLS_PER_SHARD} concurrent calls in slot {slot} took {script_calls} script calls"
        );
        eprintln!(
            "cluster node {shard}: {CALLS_PER_SHARD} concurrent calls in slot {slot}, \
             {script_calls} script call(s)"
        );
    }
}

/// A check in the slot of `batch` on a key of its own (so that the batch's counts
/// start at zero).
fn check_in(batch: &[StoreCheck]) -> StoreCheck {
    let slot = slot_of(&batch[0]);
    checks_in_slot("warm", slot, 1).remove(0)
}
