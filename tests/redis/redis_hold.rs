//! Concurrency limits in Redis: the hold script against the Rust algorithm on the same
//! seeded sequences and injected clock, and exactness with two instances sharing one
//! Redis (and a Redis Cluster): never more slots held than `max_in_flight`.

use std::sync::Arc;

use sluice::algorithm::concurrency::{slot_id, SlotOp};
use sluice::algorithm::{Decision, Micros, Quota};
use sluice::clock::{Clock, ManualClock};
use sluice::store::memory::MemoryStore;
use sluice::store::redis::{RedisMode, RedisStore};
use sluice::store::{CounterKey, HoldCall, Store};
use support::redis::{connected_store, RedisCluster, RedisServer};
use support::rng::Rng;

/// The function library (`FCALL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hold_script_mirrors_rust_on_random_sequences() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    mirror(&redis).await;
    assert!(server.command_calls("fcall") > 0, "no FCALL sent");
}

/// The script (`EVALSHA`), as sent to a Redis that refuses functions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hold_script_mirrors_rust_through_evalsha() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url_without_functions()).await;
    mirror(&redis).await;
    assert!(server.command_calls("evalsha") > 0, "no EVALSHA sent");
}

/// Acquires, probes and releases of a few slots, time moving by fractions of
/// `max_hold` (sometimes back): every decision of the script equals the memory store's.
async fn mirror(redis: &RedisStore) {
    let t0: Micros = 1_800_000_000_000_000;
    for seed in 1..=200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let clock = Arc::new(ManualClock::new(t0 + rng.below(10_000_000)));
        let memory = MemoryStore::new(10_000, clock.clone());
        let period = match rng.below(4) {
            0 => 1 + rng.below(10),
            1 => 1_000_000,
            2 => 2_500_000 + rng.below(1_000),
            _ => 60_000_000,
        };
        // 0 now and then: every acquire refused, every release taken.
        let quota = Quota {
            limit: rng.below(6),
            period,
            burst: 0,
            on_over_limit: Default::default(),
        };
        let key = CounterKey(u128::from(seed) << 64 | u128::from(rng.below(u64::MAX)));
        for step in 0..80 {
            let permille = match rng.below(5) {
                0 => 0,
                1 => 1000,
                2 => rng.below(300) as i128,
                3 => -(rng.below(500) as i128),
                _ => rng.below(50) as i128,
            };
            let now = i128::from(Clock::now(&*clock)) + i128::from(period) * permille / 1000;
            clock.set(now.max(0) as Micros);
            let op = match rng.below(5) {
                0 | 1 => SlotOp::Acquire,
                2 => SlotOp::Probe,
                _ => SlotOp::Release,
            };
            let call = HoldCall {
                key,
                quota,
                slot: slot_id(&format!("request-{}", rng.below(8))),
                op,
            };
            let expected: Decision = memory.hold(&call).await.expect("memory");
            let actual = redis
                .hold_at(&call, Clock::now(&*clock))
                .await
                .expect("redis");
            assert_eq!(
                expected, actual,
                "seed {seed} step {step}: {quota:?} {op:?}"
            );
        }
    }
}

/// `calls` acquires of distinct slots, sent at once, half through each store: how many
/// were admitted.
async fn acquire_at_once(
    stores: [&RedisStore; 2],
    key: CounterKey,
    from: usize,
    calls: usize,
) -> usize {
    let quota = Quota {
        limit: 7,
        period: 60_000_000,
        burst: 0,
        on_over_limit: Default::default(),
    };
    let answers = futures::future::join_all((from..from + calls).map(|n| {
        let store = stores[n % 2];
        async move {
            let call = HoldCall {
                key,
                quota,
                slot: slot_id(&format!("request-{n}")),
                op: SlotOp::Acquire,
            };
            store.hold(&call).await.expect("hold answers").allowed
        }
    }))
    .await;
    answers.into_iter().filter(|allowed| *allowed).count()
}

/// Releases of the slots `from..from + calls`, half through each store.
async fn release(stores: [&RedisStore; 2], key: CounterKey, from: usize, calls: usize) {
    let quota = Quota {
        limit: 7,
        period: 60_000_000,
        burst: 0,
        on_over_limit: Default::default(),
    };
    for n in from..from + calls {
        let call = HoldCall {
            key,
            quota,
            slot: slot_id(&format!("request-{n}")),
            op: SlotOp::Release,
        };
        let answer = stores[n % 2].hold(&call).await.expect("release answers");
        assert!(answer.allowed, "a release is never refused");
    }
}

/// 200 acquires at once through two instances: exactly 7 admitted. The refused ones'
/// releases (Envoy sends them too) free nothing; the admitted ones' free theirs.
async fn exact_across_instances(first: &RedisStore, second: &RedisStore) {
    let stores = [first, second];
    let key = CounterKey(0x5107_0000_0000_0000_0000_0000_0000_0001);
    assert_eq!(acquire_at_once(stores, key, 0, 200).await, 7);
    // Every request's release: 193 free nothing, 7 free a slot each.
    release(stores, key, 0, 200).await;
    assert_eq!(acquire_at_once(stores, key, 1_000, 200).await, 7);
    // One slot back, one more admitted, and no more.
    release(stores, key, 1_000, 200).await;
    assert_eq!(acquire_at_once(stores, key, 2_000, 7).await, 7);
    assert_eq!(acquire_at_once(stores, key, 3_000, 1).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_never_hold_more_than_max_in_flight() {
    let server = RedisServer::start();
    let first = connected_store(RedisMode::Standalone, server.url()).await;
    let second = connected_store(RedisMode::Standalone, server.url()).await;
    exact_across_instances(&first, &second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_a_cluster_never_hold_more_than_max_in_flight() {
    let cluster = RedisCluster::start();
    let first = connected_store(RedisMode::Cluster, cluster.url()).await;
    let second = connected_store(RedisMode::Cluster, cluster.url()).await;
    exact_across_instances(&first, &second).await;
}
