//! What one key costs in Redis, per algorithm, measured with `MEMORY USAGE` (the
//! numbers in the README's Redis section come from this test's output).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::MemoryInterface;
use sluice::algorithm::{AlgorithmKind, Quota};
use sluice::store::redis::script::limit_key;
use sluice::store::redis::{RedisMode, RedisOptions, RedisStore};
use sluice::store::{CounterKey, LimitCheck, Store, StoreCheck};
use sluice::telemetry::Metrics;
use support::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_usage_per_key() {
    let server = RedisServer::start();
    let options = RedisOptions {
        mode: RedisMode::Standalone,
        url: server.url(),
        auth: None,
        tls: false,
        tls_files: Default::default(),
        timeout: Duration::from_secs(2),
        batch_window: Duration::from_micros(100),
        batch_max: 256,
        queue: 1024,
        key_prefix: Default::default(),
    };
    let store = RedisStore::new(&options, Arc::new(Metrics::new())).expect("store");
    let kinds = [
        (AlgorithmKind::FixedWindow, 1),
        (AlgorithmKind::SlidingWindow, 1),
        (AlgorithmKind::TokenBucket, 1),
        (AlgorithmKind::Gcra, 1),
        (AlgorithmKind::SlidingLog, 1),
        (AlgorithmKind::SlidingLog, 10),
        (AlgorithmKind::SlidingLog, 100),
    ];
    for (n, (kind, requests)) in kinds.into_iter().enumerate() {
        let key = CounterKey(0x5eed_0000 + n as u128);
        let check = StoreCheck {
            key,
            limits: vec![LimitCheck {
                algorithm: kind,
                quota: Quota {
                    limit: 1000,
                    period: 3_600_000_000,
                    burst: 1000,
                    on_over_limit: Default::default(),
                },
                sharing: sluice::regions::Sharing::Regional,
            }]
            .into(),
            cost: 1,
            refund: false,
            max_wait: 0,
        };
        for _ in 0..requests {
            let mut out = Vec::new();
            store
                .check(std::slice::from_ref(&check), &mut out)
                .await
                .expect("check");
            assert!(out[0].allowed);
            // Distinct instants, so the sliding log holds one run per request.
            tokio::time::sleep(Duration::from_micros(50)).await;
        }
        let bytes: Option<u64> = store
            .client_for(key)
            .expect("the node is known")
            .memory_usage(limit_key(&Default::default(), key, 0), Some(0))
            .await
            .expect("MEMORY USAGE");
        let bytes = bytes.expect("key exists");
        println!(
            "{:>14} after {requests:>3} requests: {bytes} bytes",
            kind.as_str()
        );
        assert!(
            bytes < 200 + 40 * requests as u64,
            "{kind:?}: {bytes} bytes"
        );
    }
}
