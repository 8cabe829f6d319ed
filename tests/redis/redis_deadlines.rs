//! A Redis store call is answered by its deadline even while Redis answers nothing,
//! whether the job waits for room among the batches in flight (the batcher answers it)
//! or its batch is out (the script call runs under its earliest job's deadline). A
//! batcher that missed one would leave its caller waiting for as long as Redis stays
//! silent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::algorithm::{AlgorithmKind, Quota};
use sluice::store::redis::{RedisMode, RedisStore};
use sluice::store::{CounterKey, LimitCheck, Store, StoreCheck, StoreError};
use sluice::telemetry::Metrics;
use support::redis::{store_options, RedisServer};

/// The store's call deadline in this test.
const TIMEOUT: Duration = Duration::from_millis(400);

/// Room for a debug build on a loaded two-core machine past the deadline.
const SLACK: Duration = Duration::from_millis(150);

/// Batches in flight at most (the batcher's `MAX_IN_FLIGHT`).
const IN_FLIGHT: u32 = 64;

/// With one check per batch: the first wave takes every batch in flight, and the second,
/// sent halfway to the first's deadline, waits for room. When room comes its calls have
/// half their time left: a script call that ran for the whole store timeout would
/// answer them late, so each runs under its job's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_to_a_silent_redis_is_answered_by_its_deadline() {
    let server = RedisServer::start();
    let mut options = store_options(RedisMode::Standalone, server.url());
    options.timeout = TIMEOUT;
    options.batch_window = Duration::ZERO;
    options.batch_max = 1;
    let store = Arc::new(RedisStore::new(&options, Arc::new(Metrics::new())).expect("store"));
    let ready = Instant::now() + Duration::from_secs(5);
    while !store.is_connected() {
        assert!(Instant::now() < ready, "redis store did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    server.cli(&["client", "pause", "5000", "all"]);
    let mut calls = spawn_calls(&store, 0..IN_FLIGHT + 36);
    tokio::time::sleep(TIMEOUT / 2).await;
    calls.extend(spawn_calls(&store, 1_000..1_000 + IN_FLIGHT));
    let mut slowest = Duration::ZERO;
    let mut timeouts = 0;
    for call in calls {
        // Bounded here too: a call the batcher never answers must fail the test, not
        // hang it.
        let (elapsed, result) = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("a call was never answered")
            .expect("call task");
        slowest = slowest.max(elapsed);
        match result {
            Err(StoreError::Timeout(_)) => timeouts += 1,
            Err(_) => {}
            Ok(()) => panic!("a paused Redis answered a call"),
        }
    }
    assert!(
        slowest <= TIMEOUT + SLACK,
        "a call waited {slowest:?}; its deadline was {TIMEOUT:?} after it started"
    );
    assert!(timeouts > 0, "no call timed out: the pause was not seen");
    eprintln!("calls to a paused Redis: slowest {slowest:?}, {timeouts} timeouts");
}

/// One check call per key number in `keys`, each timed from its start.
fn spawn_calls(
    store: &Arc<RedisStore>,
    keys: std::ops::Range<u32>,
) -> Vec<tokio::task::JoinHandle<(Duration, Result<(), StoreError>)>> {
    keys.map(|n| {
        let store = store.clone();
        tokio::spawn(async move {
            let check = StoreCheck {
                key: CounterKey(u128::from(n) << 32 | 7),
                limits: vec![LimitCheck {
                    algorithm: AlgorithmKind::TokenBucket,
                    quota: Quota {
                        limit: 10,
                        period: 1_000_000,
                        burst: 10,
                        on_over_limit: Default::default(),
                    },
                    sharing: sluice::regions::Sharing::Regional,
                }]
                .into(),
                cost: 1,
                refund: false,
                max_wait: 0,
            };
            let started = Instant::now();
            let mut decisions = Vec::new();
            let result = store
                .check(std::slice::from_ref(&check), &mut decisions)
                .await;
            (started.elapsed(), result)
        })
    })
    .collect()
}
