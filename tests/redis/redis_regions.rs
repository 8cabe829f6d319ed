//! Aggregated limits (`scope: global`, `sharing: aggregate`) in the Lua script against
//! the Rust model (`sluice::algorithm::remote`): three regions' stores on one
//! redis-server, apart by key prefix; the other regions' states are published into
//! region a's store as the exchange does (`import.lua`), at the same injected times as
//! the Rust model sees them, with their links cut and healed; every field of every
//! decision must match.

use std::sync::Arc;

use bytes::Bytes;
use fred::prelude::KeysInterface;
use sluice::algorithm::remote::{decide_shared, taken_by_others, Remote};
use sluice::algorithm::{decide, expires_at, AlgorithmKind, Micros, Quota, State};
use sluice::regions::{RegionPlan, RegionWeights, Sharing};
use sluice::store::redis::links::RegionLinks;
use sluice::store::redis::script::limit_key;
use sluice::store::redis::{RedisMode, RedisOptions, RedisStore};
use sluice::store::{CounterKey, KeyPrefix, LimitCheck, StoreCheck};
use support::redis::{connected_store_with, store_options, RedisCluster, RedisServer};
use support::rng::Rng;

/// Options of region `name`'s store on `server`: its own key prefix.
fn options(server: &RedisServer, name: &str) -> RedisOptions {
    RedisOptions {
        key_prefix: KeyPrefix::new(&format!("{name}:")).expect("a prefix"),
        ..store_options(RedisMode::Standalone, server.url())
    }
}

/// One region of the sequence: its store, its own state in the Rust model, and the
/// state region a last received from it.
struct Region {
    name: &'static str,
    store: RedisStore,
    prefix: String,
    state: State,
    known_by_a: Option<State>,
    stale: bool,
}

fn check(key: CounterKey, limit: LimitCheck, cost: u64) -> StoreCheck {
    StoreCheck {
        key,
        limits: vec![limit].into(),
        cost,
        refund: false,
        max_wait: 0,
    }
}

/// `state` as the stores read it at `now`: fresh once expired.
fn live(kind: AlgorithmKind, state: &State, now: Micros, quota: &Quota) -> State {
    if expires_at(state, quota) <= now {
        State::fresh(kind)
    } else {
        state.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_checks_mirror_rust() {
    let server = RedisServer::start();
    let plan = Arc::new(RegionPlan::new("a", ["b", "c"]).expect("a plan"));
    let links = Arc::new(RegionLinks::new(plan));
    let metrics = Arc::new(sluice::telemetry::Metrics::new());
    let a = RedisStore::with_lanes(&options(&server, "a"), metrics, &[], Some(links.clone()))
        .expect("store a");
    let mut others = Vec::new();
    for name in ["b", "c"] {
        others.push(Region {
            name,
            store: connected_store_with(&options(&server, name)).await,
            prefix: format!("{name}:"),
            state: State::fresh(AlgorithmKind::FixedWindow),
            known_by_a: None,
            stale: true,
        });
    }
    let mut decisions = Vec::new();
    // Region a's decisions where the others took some of the limit, and those refused.
    let (mut shared_decisions, mut refused) = (0, 0);
    for seed in 1..=150u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let kind = if seed % 2 == 0 {
            AlgorithmKind::FixedWindow
        } else {
            AlgorithmKind::SlidingWindow
        };
        let period = [1_000_000, 3_000_000, 10 + rng.below(10_000)][rng.below(3) as usize];
        let quota = Quota {
            limit: 1 + rng.below(30),
            period,
            burst: 1,
            on_over_limit: Default::default(),
        };
        let mut weights = [0u16; sluice::regions::MAX_REGIONS];
        for weight in weights.iter_mut().take(3) {
            *weight = 1 + rng.below(4) as u16;
        }
        let weights = RegionWeights(weights);
        let shared = LimitCheck {
            algorithm: kind,
            quota,
            sharing: Sharing::Aggregate(weights),
        };
        let regional = LimitCheck {
            sharing: Sharing::Regional,
            ..shared
        };
        let key = CounterKey(u128::from(seed) << 64 | 0xA66);
        let mut own = State::fresh(kind);
        for region in &mut others {
            region.state = State::fresh(kind);
            region.known_by_a = None;
            region.stale = rng.below(2) == 0;
            links.set_stale(region.name, region.stale);
        }
        let mut now: Micros = 1_700_000_000_000_000 + rng.below(period);
        for step in 0..60 {
            now += rng.below(period / 2 + 2);
            let which = rng.below(2) as usize;
            match rng.below(10) {
                0 | 1 => {
                    // Region `which` publishes its state to region a.
                    let region = &mut others[which];
                    if expires_at(&region.state, &quota) <= now {
                        continue;
                    }
                    let client = region.store.client_for(key).expect("a node");
                    let prefix = KeyPrefix::new(&region.prefix).expect("a prefix");
                    let raw: Option<Bytes> =
                        client.get(limit_key(&prefix, key, 0)).await.expect("GET");
                    let Some(raw) = raw else { continue };
                    a.import_at(region.name, key, &regional, raw, now)
                        .await
                        .expect("import");
                    region.known_by_a = Some(region.state.clone());
                }
                2 => {
                    let region = &mut others[which];
                    region.stale = !region.stale;
                    links.set_stale(region.name, region.stale);
                }
                3..=5 => {
                    // A charge in region `which`, regional there.
                    let region = &mut others[which];
                    let cost = 1 + rng.below(3);
                    decisions.clear();
                    region
                        .store
                        .check_at(&[check(key, regional, cost)], true, now, &mut decisions)
                        .await
                        .expect("regional check");
                    let state = live(kind, &region.state, now, &quota);
                    let (expected, next) = decide(kind, &state, now, cost, &quota);
                    assert_eq!(
                        decisions,
                        [expected],
                        "seed {seed} step {step}: region {}",
                        region.name
                    );
                    region.state = next;
                }
                _ => {
                    // A charge in region a, counting the others' published usage.
                    let cost = 1 + rng.below(3);
                    decisions.clear();
                    a.check_at(&[check(key, shared, cost)], true, now, &mut decisions)
                        .await
                        .expect("aggregated check");
                    let remotes: Vec<Remote<'_>> = others
                        .iter()
                        .enumerate()
                        .map(|(index, region)| Remote {
                            state: region.known_by_a.as_ref(),
                            floor: if region.stale {
                                weights.fallback_share(quota.limit, index + 1)
                            } else {
                                0
                            },
                        })
                        .collect();
                    let state = live(kind, &own, now, &quota);
                    let (expected, next) =
                        decide_shared(kind, &state, &remotes, now, cost, &quota, false);
                    if taken_by_others(&remotes, now, &quota) > 0 {
                        shared_decisions += 1;
                        refused += u32::from(!expected.allowed);
                    }
                    assert_eq!(decisions, [expected], "seed {seed} step {step}: region a");
                    own = next;
                }
            }
        }
    }
    assert!(
        shared_decisions > 500 && refused > 100,
        "the sequences must exercise other regions' usage: {shared_decisions} decisions, {refused} refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_sent_twice_or_out_of_order_counts_once() {
    let server = RedisServer::start();
    let b = connected_store_with(&options(&server, "b")).await;
    let a = connected_store_with(&options(&server, "a")).await;
    let key = CounterKey(0xD0_0B1E);
    let period = 60_000_000;
    let now = 1_700_000_000_000_000 - 1_700_000_000_000_000 % period + 5;
    let limit = LimitCheck {
        algorithm: AlgorithmKind::FixedWindow,
        quota: Quota {
            limit: 100,
            period,
            burst: 100,
            on_over_limit: Default::default(),
        },
        sharing: Sharing::Regional,
    };
    let client = b.client_for(key).expect("a node");
    let b_key = limit_key(&KeyPrefix::new("b:").expect("prefix"), key, 0);
    let a_key = format!(
        "{}:from:b",
        limit_key(&KeyPrefix::new("a:").expect("prefix"), key, 0)
    );
    let mut decisions = Vec::new();
    b.check_at(&[check(key, limit, 3)], true, now, &mut decisions)
        .await
        .expect("charge");
    let older: Bytes = client.get(&b_key).await.expect("GET");
    b.check_at(&[check(key, limit, 4)], true, now + 1, &mut decisions)
        .await
        .expect("charge");
    let newer: Bytes = client.get(&b_key).await.expect("GET");
    let import = |state: Bytes| a.import_at("b", key, &limit, state, now + 2);
    assert_eq!(import(newer.clone()).await.expect("import"), 1);
    assert_eq!(
        import(newer.clone()).await.expect("import"),
        0,
        "sent twice: kept once"
    );
    assert_eq!(
        import(older).await.expect("import"),
        0,
        "late: the newer stays"
    );
    let kept: Bytes = client.get(&a_key).await.expect("GET");
    assert_eq!(kept, newer);
    let ttl: i64 = client.pttl(&a_key).await.expect("PTTL");
    assert!(ttl > 0, "a kept state expires with its window: {ttl}");
    // A later window's state replaces it.
    b.check_at(&[check(key, limit, 1)], true, now + period, &mut decisions)
        .await
        .expect("charge");
    let next_window: Bytes = client.get(&b_key).await.expect("GET");
    assert_eq!(
        a.import_at("b", key, &limit, next_window.clone(), now + period)
            .await
            .expect("import"),
        1
    );
    assert_eq!(
        client.get::<Bytes, _>(&a_key).await.expect("GET"),
        next_window
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_counts_the_other_regions_kept_beside_each_key() {
    let cluster = RedisCluster::start();
    let plan = Arc::new(RegionPlan::new("a", ["b"]).expect("a plan"));
    let links = Arc::new(RegionLinks::new(plan));
    links.set_stale("b", false);
    let metrics = Arc::new(sluice::telemetry::Metrics::new());
    let a_options = store_options(RedisMode::Cluster, cluster.url());
    let a = RedisStore::with_lanes(&a_options, metrics, &[], Some(links)).expect("store a");
    let b = connected_store_with(&RedisOptions {
        key_prefix: KeyPrefix::new("b:").expect("a prefix"),
        ..store_options(RedisMode::Cluster, cluster.url())
    })
    .await;
    let period = 60_000_000;
    let now = 1_700_000_000_000_000 - 1_700_000_000_000_000 % period + 5;
    let limit = |sharing| LimitCheck {
        algorithm: AlgorithmKind::SlidingWindow,
        quota: Quota {
            limit: 10,
            period,
            burst: 10,
            on_over_limit: Default::default(),
        },
        sharing,
    };
    let shared = limit(Sharing::Aggregate(RegionWeights(
        [1; sluice::regions::MAX_REGIONS],
    )));
    let mut decisions = Vec::new();
    // Keys on every shard: each is read beside its own key, in its own slot.
    for n in 0..30u128 {
        let key = CounterKey(n.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835));
        b.check_at(
            &[check(key, limit(Sharing::Regional), 7)],
            true,
            now,
            &mut decisions,
        )
        .await
        .expect("charge in b");
        let client = b.client_for(key).expect("a node");
        let raw: Bytes = client
            .get(limit_key(&KeyPrefix::new("b:").expect("prefix"), key, 0))
            .await
            .expect("GET");
        a.import_at("b", key, &limit(Sharing::Regional), raw, now)
            .await
            .expect("import");
        decisions.clear();
        for _ in 0..5 {
            a.check_at(&[check(key, shared, 1)], true, now + 1, &mut decisions)
                .await
                .expect("aggregated check");
        }
        let admitted = decisions.iter().filter(|d| d.allowed).count();
        assert_eq!(admitted, 3, "key {n}: 10 less b's 7");
    }
}
