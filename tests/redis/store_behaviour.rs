//! One behavioural suite, run through one generic helper against the memory store, a
//! real Redis and a real 3-master Redis Cluster: the answers must be identical.

use std::sync::Arc;

use sluice::algorithm::{AlgorithmKind, Decision, OnOverLimit, Quota};
use sluice::clock::SystemClock;
use sluice::rules::Entry;
use sluice::store::memory::MemoryStore;
use sluice::store::redis::script::limit_key;
use sluice::store::redis::RedisMode;
use sluice::store::{CounterKey, LimitCheck, Store, StoreCheck};
use support::redis::{connected_store, RedisCluster, RedisServer};

const KINDS: [AlgorithmKind; 5] = AlgorithmKind::ALL;

/// A day: windows and refill are so slow that the few milliseconds a test takes never
/// change an answer, so the stores' different clocks do not matter.
const DAY: u64 = 86_400_000_000;

fn limit(algorithm: AlgorithmKind, limit: u64, burst: u64) -> LimitCheck {
    LimitCheck {
        algorithm,
        quota: Quota {
            limit,
            period: DAY,
            burst,
            on_over_limit: Default::default(),
        },
        sharing: sluice::regions::Sharing::Regional,
    }
}

fn key(domain: &str, value: &str) -> CounterKey {
    CounterKey::new(domain, &[Entry { key: "k", value }], &[], [])
}

/// What the suite records of a decision: the time-independent fields.
fn brief(d: &Decision) -> (bool, u64, u64) {
    (d.allowed, d.remaining, d.used)
}

async fn one<S: Store>(store: &S, check: &StoreCheck) -> Vec<Decision> {
    let mut out = Vec::new();
    store
        .check(std::slice::from_ref(check), &mut out)
        .await
        .expect("store check");
    out
}

/// The suite: returns the transcript of every decision, and asserts the semantics.
async fn suite<S: Store>(store: &S, run: &str) -> Vec<(bool, u64, u64)> {
    let mut transcript = Vec::new();
    // Each algorithm alone: limit 5, seven requests of cost 1.
    for kind in KINDS {
        let check = StoreCheck {
            key: key(run, kind.as_str()),
            limits: vec![limit(kind, 5, 5)].into(),
            cost: 1,
            refund: false,
            max_wait: 0,
        };
        let mut allowed = 0;
        for _ in 0..7 {
            let d = one(store, &check).await;
            allowed += usize::from(d[0].allowed);
            transcript.push(brief(&d[0]));
        }
        assert_eq!(allowed, 5, "{kind:?}");
    }
    // Cost 0 checks without charging; cost 3 charges 3.
    for kind in KINDS {
        let k = key(run, &format!("cost-{}", kind.as_str()));
        let probe = StoreCheck {
            key: k,
            limits: vec![limit(kind, 10, 10)].into(),
            cost: 0,
            refund: false,
            max_wait: 0,
        };
        let heavy = StoreCheck {
            cost: 3,
            refund: false,
            ..probe.clone()
        };
        for _ in 0..3 {
            let d = one(store, &probe).await;
            assert!(d[0].allowed);
            assert_eq!(d[0].remaining, 10, "{kind:?} cost 0 charged");
            transcript.push(brief(&d[0]));
        }
        let answers: Vec<bool> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                let d = one(store, &heavy).await;
                transcript.push(brief(&d[0]));
                v.push(d[0].allowed);
            }
            v
        };
        assert_eq!(answers, [true, true, true, false], "{kind:?} cost 3");
    }
    // Several limits: all-or-nothing. Token bucket of 3 and a fixed window of 10: once
    // the bucket refuses, the fixed window is not charged either.
    for kind in KINDS {
        let k = key(run, &format!("multi-{}", kind.as_str()));
        let check = StoreCheck {
            key: k,
            limits: vec![limit(kind, 3, 3), limit(AlgorithmKind::FixedWindow, 10, 10)].into(),
            cost: 1,
            refund: false,
            max_wait: 0,
        };
        for i in 0..6 {
            let d = one(store, &check).await;
            assert_eq!(d.len(), 2);
            assert_eq!(d[0].allowed, i < 3, "{kind:?} request {i}");
            transcript.push(brief(&d[0]));
            transcript.push(brief(&d[1]));
        }
        let mut peeked = Vec::new();
        store.peek(&check, &mut peeked).await.expect("peek");
        assert_eq!(
            peeked[1].used, 4,
            "fixed window charged only for admitted requests (+1 peeked)"
        );
        transcript.extend(peeked.iter().map(brief));
    }
    // A single fixed window counts refused hits (the reference's behaviour).
    let check = StoreCheck {
        key: key(run, "fixed-refused"),
        limits: vec![limit(AlgorithmKind::FixedWindow, 2, 2)].into(),
        cost: 1,
        refund: false,
        max_wait: 0,
    };
    let mut used = Vec::new();
    for _ in 0..4 {
        let d = one(store, &check).await;
        used.push(d[0].used);
        transcript.push(brief(&d[0]));
    }
    assert_eq!(used, [1, 2, 3, 4]);
    // A negative hit gives back on every algorithm: used up at 5, 3 given back (never
    // refused), then exactly 3 more pass.
    for kind in KINDS {
        let check = |cost: u64, refund: bool| StoreCheck {
            key: key(run, &format!("refund-{}", kind.as_str())),
            limits: vec![limit(kind, 5, 5)].into(),
            cost,
            refund,
            max_wait: 0,
        };
        let mut admitted = Vec::new();
        for (cost, refund) in [
            (5, false),
            (3, true),
            (1, false),
            (1, false),
            (1, false),
            (1, false),
        ] {
            let d = one(store, &check(cost, refund)).await;
            admitted.push(d[0].allowed);
            transcript.push(brief(&d[0]));
        }
        assert_eq!(admitted, [true, true, true, true, true, false], "{kind:?}");
    }
    // Debt (on_over_limit: charge) beside a limit that refuses: a refused call still
    // charges the debt limit, and only it.
    let mut debt = limit(AlgorithmKind::TokenBucket, 3, 3);
    debt.quota.on_over_limit = OnOverLimit::Charge;
    let both = StoreCheck {
        key: key(run, "debt"),
        limits: vec![debt, limit(AlgorithmKind::FixedWindow, 10, 10)].into(),
        cost: 2,
        refund: false,
        max_wait: 0,
    };
    let mut used = Vec::new();
    for _ in 0..3 {
        let d = one(store, &both).await;
        used.push((d[0].allowed, d[0].used, d[1].used));
        transcript.push(brief(&d[0]));
        transcript.push(brief(&d[1]));
    }
    // Deficit 2 then 4 (refused, charged: debt), then 6; the window only the first 2.
    assert_eq!(used, [(true, 2, 2), (false, 4, 4), (false, 6, 4)]);
    // Many descriptors in one call (spread over every shard of a cluster), with repeats
    // of the same key decided in order.
    let checks: Vec<StoreCheck> = (0..40)
        .map(|i| StoreCheck {
            key: key(run, &format!("spread-{}", i % 25)),
            limits: vec![limit(KINDS[i % 5], 1, 1)].into(),
            cost: 1,
            refund: false,
            max_wait: 0,
        })
        .collect();
    let mut out = Vec::new();
    store.check(&checks, &mut out).await.expect("spread");
    assert_eq!(out.len(), 40);
    assert_eq!(out.iter().filter(|d| d.allowed).count(), 25);
    transcript.extend(out.iter().map(brief));
    transcript
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_redis_and_cluster_answer_alike() {
    let memory = MemoryStore::new(100_000, SystemClock::shared());
    let expected = suite(&memory, "suite").await;

    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    assert_eq!(
        suite(&redis, "suite").await,
        expected,
        "redis differs from memory"
    );

    // A server reached through its Unix socket: the same answers, and the same counters
    // as through TCP.
    let socket = RedisServer::start_with_unix_socket();
    let over_socket = connected_store(RedisMode::Standalone, socket.socket_url()).await;
    assert_eq!(
        suite(&over_socket, "suite").await,
        expected,
        "redis over a Unix socket differs from memory"
    );
    let over_tcp = connected_store(RedisMode::Standalone, socket.url()).await;
    let shared = StoreCheck {
        key: key("shared", "socket"),
        limits: vec![limit(AlgorithmKind::FixedWindow, 5, 5)].into(),
        cost: 1,
        refund: false,
        max_wait: 0,
    };
    one(&over_socket, &shared).await;
    let second = one(&over_tcp, &shared).await;
    assert_eq!(
        brief(&second[0]),
        (true, 3, 2),
        "one counter, by socket or TCP"
    );

    let cluster = RedisCluster::start();
    let clustered = connected_store(RedisMode::Cluster, cluster.url()).await;
    assert_eq!(
        suite(&clustered, "suite").await,
        expected,
        "cluster differs from memory"
    );
    // The cluster really spread the keys.
    let holders = cluster
        .nodes
        .iter()
        .filter(|node| node.cli(&["dbsize"]).trim() != "0")
        .count();
    assert_eq!(holders, 3, "every master holds some keys");
}

/// `user=alice_path_/login` and `user=alice, path=/login` are one key in the reference;
/// here they never share a counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separator_tricks_never_share_a_redis_counter() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let joined = CounterKey::new(
        "d",
        &[Entry {
            key: "user",
            value: "alice_path_/login",
        }],
        &[],
        [],
    );
    let split = CounterKey::new(
        "d",
        &[
            Entry {
                key: "user",
                value: "alice",
            },
            Entry {
                key: "path",
                value: "/login",
            },
        ],
        &[],
        [],
    );
    assert_ne!(
        limit_key(&Default::default(), joined, 0),
        limit_key(&Default::default(), split, 0)
    );
    let limits: Arc<[LimitCheck]> = vec![limit(AlgorithmKind::FixedWindow, 3, 3)].into();
    let drain = StoreCheck {
        key: joined,
        limits: limits.clone(),
        cost: 3,
        refund: false,
        max_wait: 0,
    };
    assert!(one(&redis, &drain).await[0].allowed);
    assert!(!one(&redis, &drain).await[0].allowed);
    let victim = StoreCheck {
        key: split,
        limits,
        cost: 1,
        refund: false,
        max_wait: 0,
    };
    let d = one(&redis, &victim).await;
    assert!(d[0].allowed);
    assert_eq!(d[0].remaining, 2);
    let keys = server.cli(&["--scan", "--pattern", "sluice:*"]);
    assert_eq!(keys.lines().count(), 2, "two distinct keys: {keys}");
    assert!(
        keys.contains(&limit_key(&Default::default(), joined, 0))
            && keys.contains(&limit_key(&Default::default(), split, 0))
    );
}
