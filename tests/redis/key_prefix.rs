//! `--cache-key-prefix` (the reference's `CACHE_KEY_PREFIX`) on a real Redis: two
//! deployments with different prefixes on one server never share a counter, every key
//! either writes (checks of every algorithm, leases) starts with its prefix, and in a
//! Redis Cluster the prefix does not move a key's slot (the digest stays the hash tag).

use std::sync::Arc;

use sluice::algorithm::{AlgorithmKind, Quota};
use sluice::rules::Entry;
use sluice::store::redis::{RedisMode, RedisStore};
use sluice::store::{CounterKey, KeyPrefix, LeaseRequest, LimitCheck, Store, StoreCheck};
use support::redis::{connected_store_with, store_options, RedisCluster, RedisServer};

/// A day: no window ends during the test.
const DAY: u64 = 86_400_000_000;

/// A store at `url` whose keys start with `prefix`.
async fn store(mode: RedisMode, url: String, prefix: &str) -> RedisStore {
    let mut options = store_options(mode, url);
    options.key_prefix = KeyPrefix::new(prefix).expect("a prefix");
    connected_store_with(&options).await
}

/// A check of `value`'s counter under `algorithm`, limit 2 a day.
fn check(value: &str, algorithm: AlgorithmKind) -> StoreCheck {
    let limits: Arc<[LimitCheck]> = vec![LimitCheck {
        algorithm,
        quota: Quota {
            limit: 2,
            period: DAY,
            burst: 2,
            on_over_limit: Default::default(),
        },
        sharing: sluice::regions::Sharing::Regional,
    }]
    .into();
    StoreCheck {
        key: CounterKey::new("d", &[Entry { key: "user", value }], &[], []),
        limits,
        cost: 1,
        refund: false,
        max_wait: 0,
    }
}

/// Whether `store` admits `check`.
async fn admits(store: &RedisStore, check: &StoreCheck) -> bool {
    let mut decisions = Vec::new();
    store
        .check(std::slice::from_ref(check), &mut decisions)
        .await
        .expect("store check");
    decisions[0].allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_with_other_prefixes_count_apart_on_one_redis() {
    let server = RedisServer::start();
    let a = store(RedisMode::Standalone, server.url(), "tenant-a:").await;
    let b = store(RedisMode::Standalone, server.url(), "tenant-b:").await;
    for algorithm in AlgorithmKind::ALL {
        let check = check(algorithm.as_str(), algorithm);
        assert!(admits(&a, &check).await && admits(&a, &check).await);
        assert!(!admits(&a, &check).await, "{algorithm:?}: a is over");
        assert!(
            admits(&b, &check).await,
            "{algorithm:?}: b has its own counter"
        );
    }
    let lease = LeaseRequest {
        check: check("leased", AlgorithmKind::TokenBucket),
        units: 1,
        lifetime: 1_000_000,
        give_back: None,
    };
    assert!(a.lease(&lease).await.expect("lease").decision.allowed);

    let keys = server.cli(&["--scan"]);
    let keys: Vec<&str> = keys.lines().collect();
    let of = |prefix: &str| keys.iter().filter(|key| key.starts_with(prefix)).count();
    // Five algorithms each, and a's leased counter.
    assert_eq!(of("tenant-a:sluice:{"), 6, "{keys:?}");
    assert_eq!(of("tenant-b:sluice:{"), 5, "{keys:?}");
    assert_eq!(keys.len(), 11, "no key without a prefix: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_keeps_each_key_in_its_digests_cluster_slot() {
    let cluster = RedisCluster::start();
    let store = store(RedisMode::Cluster, cluster.url(), "tenant-a:").await;
    for n in 0..30 {
        let check = check(&format!("user{n}"), AlgorithmKind::FixedWindow);
        assert!(admits(&store, &check).await, "user{n}");
    }
    let mut holders = 0;
    for node in &cluster.nodes {
        let keys = node.cli(&["--scan"]);
        holders += usize::from(!keys.trim().is_empty());
        for key in keys.lines() {
            assert!(key.starts_with("tenant-a:sluice:{"), "{key}");
        }
    }
    assert_eq!(holders, 3, "the keys spread over every master");
}
