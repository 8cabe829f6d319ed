//! Token leasing on a real Redis (DESIGN §6, layer 3).
//!
//! 1. The lease script at an injected clock: a lease charges its units (plus, for
//!    token bucket and GCRA, the refill of its lifetime), a return gives back exactly
//!    what is safe, and the sliding log cannot lease.
//! 2. Accuracy: four Sluice servers on one Redis (and on a 3-master cluster), 5 000 concurrent calls on one key of
//!    a 1 000-per-day limit leased 10 units at a time: admitted ≤ 1 000 and
//!    admitted ≥ 1 000 − the exported bound, for every leasable algorithm; most
//!    decisions are made from leases.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use sluice::algorithm::{AlgorithmKind, Decision, Quota};
use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::RateLimitRequest;
use sluice::store::redis::RedisStore;
use sluice::store::{CounterKey, LeaseRequest, LimitCheck, StoreCheck};
use sluice::telemetry::Metrics;
use support::redis::{RedisCluster, RedisServer};
use support::TestServer;

const LEASABLE: [&str; 4] = ["fixed_window", "sliding_window", "token_bucket", "gcra"];

async fn connected(url: &str) -> RedisStore {
    let settings = support::settings_from(
        &["sluice", "serve", "--store", "redis", "--redis-url", url],
        &[],
    );
    let store = RedisStore::new(&settings.redis, Arc::new(Metrics::new())).expect("store");
    for _ in 0..200 {
        if store.is_connected() {
            return store;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("redis store did not connect");
}

fn check(key: u128, algorithm: AlgorithmKind, cost: u64) -> StoreCheck {
    StoreCheck {
        key: CounterKey(key),
        limits: vec![LimitCheck {
            algorithm,
            quota: Quota {
                limit: 100,
                period: 3_600_000_000,
                burst: 100,
                on_over_limit: Default::default(),
            },
            sharing: sluice::regions::Sharing::Regional,
        }]
        .into(),
        cost,
        refund: false,
        max_wait: 0,
    }
}

async fn peek_remaining(store: &RedisStore, check: &StoreCheck, now: u64) -> u64 {
    let mut decisions: Vec<Decision> = Vec::new();
    store
        .check_at(std::slice::from_ref(check), false, now, &mut decisions)
        .await
        .expect("peek");
    decisions[0].remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_script_charges_and_returns_what_is_safe() {
    let redis = RedisServer::start();
    let store = connected(&redis.url()).await;
    // Ten minutes into an hour window.
    let t0 = 1_700_000_000_000_000 / 3_600_000_000 * 3_600_000_000 + 600_000_000;
    let lifetime = 250_000;
    for (i, kind) in [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
    ]
    .into_iter()
    .enumerate()
    {
        let key = 1_000 + i as u128;
        let grant = store
            .lease_at(
                &LeaseRequest {
                    check: check(key, kind, 1),
                    units: 10,
                    lifetime,
                    give_back: None,
                },
                t0,
            )
            .await
            .expect("lease");
        assert!(grant.decision.allowed, "{kind:?}");
        assert_eq!(grant.decision.remaining, 99, "{kind:?}: the request alone");
        assert_eq!(grant.units, 10, "{kind:?}");
        assert_eq!(grant.store_now, t0);
        let windowed = matches!(
            kind,
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
        );
        assert_eq!(
            grant.window_left,
            if windowed { 3_000_000_000 } else { 0 },
            "{kind:?}"
        );
        // 1 + 10 charged; token bucket and GCRA also hold the lifetime's refill.
        let probe = check(key, kind, 1);
        let held = peek_remaining(&store, &probe, t0).await;
        assert_eq!(held, if windowed { 88 } else { 87 }, "{kind:?} after lease");

        // Nothing used: giving the 10 back at once restores everything but the request.
        let back = store
            .lease_at(
                &LeaseRequest {
                    check: check(key, kind, 0),
                    units: 0,
                    lifetime,
                    give_back: Some((10, t0, lifetime)),
                },
                t0,
            )
            .await
            .expect("return");
        assert_eq!(back.units, 0);
        assert_eq!(
            peek_remaining(&store, &probe, t0).await,
            98,
            "{kind:?} after return"
        );

        // A lease that is refused charges nothing (not even a fixed window).
        let refused = store
            .lease_at(
                &LeaseRequest {
                    check: check(key, kind, 1),
                    units: 99,
                    lifetime,
                    give_back: None,
                },
                t0,
            )
            .await
            .expect("lease");
        assert!(refused.decision.allowed);
        assert_eq!(refused.units, 0, "{kind:?}: 99 more do not fit");
        assert_eq!(peek_remaining(&store, &probe, t0).await, 97, "{kind:?}");
    }

    // Token bucket: a return long after the grant gives back only what has not been
    // refilled since (here: nothing, 50 units refill in half an hour).
    let key = 2_000;
    let kind = AlgorithmKind::TokenBucket;
    let lease = |give_back, cost, units| LeaseRequest {
        check: check(key, kind, cost),
        units,
        lifetime,
        give_back,
    };
    let grant = store
        .lease_at(&lease(None, 60, 30), t0)
        .await
        .expect("lease");
    assert_eq!(grant.units, 30);
    let later = t0 + 1_800_000_000;
    let before = peek_remaining(&store, &check(key, kind, 1), later).await;
    store
        .lease_at(&lease(Some((30, t0, lifetime)), 0, 0), later)
        .await
        .expect("return");
    assert_eq!(
        peek_remaining(&store, &check(key, kind, 1), later).await,
        before,
        "a late return gives nothing back"
    );

    // The sliding log cannot lease.
    let error = store
        .lease_at(
            &LeaseRequest {
                check: check(3_000, AlgorithmKind::SlidingLog, 1),
                units: 5,
                lifetime,
                give_back: None,
            },
            t0,
        )
        .await
        .expect_err("sliding log refuses");
    assert!(error.to_string().contains("cannot lease"), "{error}");
}

const CALLS: usize = 5_000;
const CONCURRENCY: usize = 256;

fn rules() -> String {
    let mut yaml = String::from("domain: lease\ndescriptors:\n");
    for algorithm in LEASABLE {
        yaml.push_str(&format!(
            "  - key: {algorithm}\n    rate_limit: {{unit: day, requests_per_unit: 1000, algorithm: {algorithm}, lease: 10}}\n"
        ));
    }
    yaml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_lease_within_the_bound() {
    let redis = RedisServer::start();
    accuracy("redis", &redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_lease_within_the_bound_on_a_cluster() {
    let cluster = RedisCluster::start();
    accuracy("redis-cluster", &cluster.url()).await;
}

async fn accuracy(store: &str, url: &str) {
    let rules = rules();
    let flags = [
        "--store",
        store,
        "--redis-url",
        url,
        "--redis-timeout",
        "2s",
        "--replicas",
        "4",
    ];
    let (servers, clients) = support::instances(4, ("lease.yaml", &rules), &flags).await;
    for algorithm in LEASABLE {
        let mut admitted = 0;
        for chunk in (0..CALLS).collect::<Vec<_>>().chunks(CONCURRENCY) {
            let calls = chunk.iter().map(|&i| {
                let mut client = clients[i % clients.len()].clone();
                let request = RateLimitRequest {
                    domain: "lease".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: algorithm.into(),
                            value: "one".into(),
                        }],
                        limit: None,
                        hits_addend: None,
                        is_negative_hits: false,
                    }],
                    hits_addend: 1,
                };
                async move {
                    let response = client.should_rate_limit(request).await.expect("rpc");
                    response.into_inner().overall_code == Code::Ok as i32
                }
            });
            admitted += join_all(calls).await.into_iter().filter(|ok| *ok).count();
        }
        let rule = format!("lease.{algorithm}");
        let mut bound = 0.0;
        let mut leased = 0.0;
        for server in &servers {
            let metrics = server.metrics().await;
            bound = metrics.get(&format!(
                "sluice_lease_early_refusal_bound_units{{rule=\"{rule}\"}}"
            ));
            leased += metrics.get("sluice_local_decisions_total{layer=\"lease\"}");
        }
        println!(
            "{store} {algorithm}: admitted {admitted}/1000, bound {bound}, lease decisions so far {leased}"
        );
        assert!(admitted <= 1000, "{algorithm}: never beyond the limit");
        assert!(bound >= 30.0, "{algorithm}: bound is (4 - 1) x 10 at least");
        assert!(
            admitted as f64 >= 1000.0 - bound,
            "{algorithm}: admitted {admitted} < 1000 - {bound}"
        );
        assert!(leased > 0.0, "{algorithm}: leases answered");
        // Expired leases give their units back within lease_ttl + the return interval.
        tokio::time::sleep(Duration::from_millis(400)).await;
        for server in &servers {
            let outstanding = server.metrics().await.get(&format!(
                "sluice_lease_outstanding_units{{rule=\"{rule}\"}}"
            ));
            assert_eq!(outstanding, 0.0, "{algorithm}: units still leased");
        }
    }
    for server in servers {
        server.stop().await;
    }
}

/// Token bucket and GCRA refill while leases live: over the whole run (from the first
/// call sent to the last answer, which contains every admission), admitted units stay
/// within `burst + rate × duration`, the algorithms' own guarantee. Without the
/// lease's refill reserve, units used after they were charged could exceed it by up
/// to `rate × lease_ttl` per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refilling_buckets_never_admit_beyond_their_guarantee() {
    let redis = RedisServer::start();
    let url = redis.url();
    let rules = "domain: refill\ndescriptors:\n  - key: token_bucket\n    rate_limit: {unit: second, requests_per_unit: 200, algorithm: token_bucket, lease: 10}\n  - key: gcra\n    rate_limit: {unit: second, requests_per_unit: 200, algorithm: gcra, lease: 10}\n";
    let flags = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--redis-timeout",
        "2s",
        "--replicas",
        "4",
    ];
    let (servers, clients) = support::instances(4, ("refill.yaml", rules), &flags).await;
    for algorithm in ["token_bucket", "gcra"] {
        let admitted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let started = std::time::Instant::now();
        let stop = started + Duration::from_millis(1_500);
        let tasks: Vec<_> = (0..64)
            .map(|caller| {
                let mut client = clients[caller % clients.len()].clone();
                let admitted = admitted.clone();
                tokio::spawn(async move {
                    while std::time::Instant::now() < stop {
                        let request = RateLimitRequest {
                            domain: "refill".into(),
                            descriptors: vec![RateLimitDescriptor {
                                entries: vec![Entry {
                                    key: algorithm.into(),
                                    value: "one".into(),
                                }],
                                limit: None,
                                hits_addend: None,
                                is_negative_hits: false,
                            }],
                            hits_addend: 1,
                        };
                        let response = client.should_rate_limit(request).await.expect("rpc");
                        if response.into_inner().overall_code == Code::Ok as i32 {
                            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("caller");
        }
        let seconds = started.elapsed().as_secs_f64();
        let admitted = admitted.load(std::sync::atomic::Ordering::Relaxed) as f64;
        let guarantee = 200.0 + 200.0 * seconds;
        println!("{algorithm}: admitted {admitted} in {seconds:.3} s, guarantee {guarantee:.0}");
        assert!(
            admitted <= guarantee,
            "{algorithm}: admitted {admitted} > burst + rate x {seconds:.3} s = {guarantee:.0}"
        );
        // Early refusal stays within the exported bound: (4 - 1) x 10 + 4 x 200/s x
        // 50 ms = 70 units (a lease lives at most the 50 ms the bucket takes to refill
        // its 10 units, so its reserve is at most 10), counting the refill of the run
        // less half a second of client-side start and finish.
        let bound = servers[0].metrics().await.get(&format!(
            "sluice_lease_early_refusal_bound_units{{rule=\"refill.{algorithm}\"}}"
        ));
        assert_eq!(bound, 70.0, "{algorithm}: exported bound");
        let floor = 200.0 + 200.0 * (seconds - 0.5) - bound;
        println!("{algorithm}: floor {floor:.0}");
        assert!(admitted >= floor, "{algorithm}: {admitted} < {floor:.0}");
    }
    for server in servers {
        server.stop().await;
    }
}

/// Two servers on `redis` for domain `back`: `k` is 20 a day, leased 10 at a time for
/// 1 s.
async fn two_leasing_servers(redis: &RedisServer) -> Vec<TestServer> {
    let url = redis.url();
    let rules = "domain: back\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 20, lease: 10, lease_ttl: 1s}\n";
    let mut servers = Vec::new();
    for _ in 0..2 {
        servers.push(
            TestServer::start(
                &[("back.yaml".to_owned(), rules.to_owned())],
                &[],
                &[
                    "--store",
                    "redis",
                    "--redis-url",
                    &url,
                    "--redis-timeout",
                    "2s",
                    "--replicas",
                    "2",
                ],
            )
            .await,
        );
    }
    servers
}

/// One hit on `back`'s `k=v`.
fn back_request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "back".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        }],
        hits_addend: 1,
    }
}

/// Whether a call was answered OK.
fn ok(response: tonic::Response<sluice::proto::rls::RateLimitResponse>) -> bool {
    response.into_inner().overall_code == Code::Ok as i32
}

/// An instance that stops getting traffic gives its unused units back once its lease
/// expires, so another instance can use the whole limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_are_returned_to_other_instances() {
    let redis = RedisServer::start();
    let servers = two_leasing_servers(&redis).await;
    let request = back_request;
    let mut first = servers[0].client().await;
    assert!(ok(first.should_rate_limit(request()).await.expect("rpc")));
    let held = servers[0]
        .metrics()
        .await
        .get("sluice_lease_outstanding_units{rule=\"back.k\"}");
    assert_eq!(held, 10.0, "the first instance leased 10 units");
    // 1 s lease + 50 ms return interval, with margin. (A shorter lease could expire
    // between the call and the metrics read on a loaded machine.)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = servers[0]
        .metrics()
        .await
        .get("sluice_lease_outstanding_units{rule=\"back.k\"}");
    assert_eq!(held, 0.0, "returned after expiry");
    let mut second = servers[1].client().await;
    let mut admitted = 0;
    for _ in 0..30 {
        if ok(second.should_rate_limit(request()).await.expect("rpc")) {
            admitted += 1;
        }
    }
    assert_eq!(
        admitted, 19,
        "the second instance gets all but the first's one"
    );
    for server in servers {
        server.stop().await;
    }
}

/// A refusal made while another instance holds lease units stands no longer than a
/// lease (and one return round) in the refused instance's blocked-until cache: once
/// the units come back, the store is asked again and admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_under_leases_stands_no_longer_than_a_lease() {
    let redis = RedisServer::start();
    let servers = two_leasing_servers(&redis).await;
    let mut first = servers[0].client().await;
    assert!(ok(first
        .should_rate_limit(back_request())
        .await
        .expect("rpc")));
    // The first holds 10 units: the second gets the other 9, then is refused.
    let mut second = servers[1].client().await;
    let mut refused = false;
    for _ in 0..20 {
        if !ok(second.should_rate_limit(back_request()).await.expect("rpc")) {
            refused = true;
            break;
        }
    }
    assert!(
        refused,
        "the second instance was refused while the first held units"
    );
    // 1 s lease + 50 ms return interval, with margin: the first's 10 units are back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        ok(second.should_rate_limit(back_request()).await.expect("rpc")),
        "asked the store again once the lease ended, which admits"
    );
    for server in servers {
        server.stop().await;
    }
}
