//! Exact under concurrency: four Sluice servers on one Redis (and, separately, a
//! 3-master cluster), 5 000 concurrent gRPC calls round-robin across them on one key
//! with a limit of 1 000: exactly 1 000 are admitted for every algorithm but the sliding
//! window counter, whose deviation is reported against its bound (within one aligned
//! window it never exceeds the limit). Repeated with hits_addend 3 and with 1 000
//! distinct keys.
//!
//! The unit is a day, not a minute: token bucket and GCRA refill continuously, and at
//! 1 000 per minute they would mint about 17 units per second of test; a day keeps the
//! expected count exact (and no window boundary falls inside the test, except at
//! midnight UTC).

mod support;

use std::sync::Arc;

use futures::future::join_all;
use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rls::RateLimitRequest;
use support::redis::{RedisCluster, RedisServer};
use support::TestServer;
use tonic::transport::Channel;

const ALGORITHMS: [&str; 5] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "gcra",
];
const CALLS: usize = 5_000;
const CONCURRENCY: usize = 256;

fn rules() -> String {
    let mut yaml = String::from("domain: exact\ndescriptors:\n");
    for algorithm in ALGORITHMS {
        yaml.push_str(&format!(
            "  - key: {algorithm}\n    rate_limit: {{unit: day, requests_per_unit: 1000, algorithm: {algorithm}}}\n"
        ));
        yaml.push_str(&format!(
            "  - key: few_{algorithm}\n    rate_limit: {{unit: day, requests_per_unit: 2, algorithm: {algorithm}}}\n"
        ));
    }
    yaml
}

async fn servers(
    store: &str,
    url: &str,
) -> (Vec<TestServer>, Vec<RateLimitServiceClient<Channel>>) {
    let rules = rules();
    let flags = [
        "--store",
        store,
        "--redis-url",
        url,
        "--redis-timeout",
        "2s",
    ];
    support::instances(4, ("exact.yaml", &rules), &flags).await
}

/// Fires `CALLS` calls (`key_of(i)` names call i's descriptor value) round-robin over
/// the clients, `CONCURRENCY` at a time; returns the number admitted.
async fn admitted(
    clients: &[RateLimitServiceClient<Channel>],
    key: &str,
    hits_addend: u32,
    key_of: Arc<dyn Fn(usize) -> String + Send + Sync>,
) -> usize {
    let mut ok = 0;
    for chunk in (0..CALLS).collect::<Vec<_>>().chunks(CONCURRENCY) {
        let calls = chunk.iter().map(|&i| {
            let mut client = clients[i % clients.len()].clone();
            let request = RateLimitRequest {
                domain: "exact".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.into(),
                        value: key_of(i),
                    }],
                    limit: None,
                    hits_addend: None,
                }],
                hits_addend,
            };
            async move {
                let response = client.should_rate_limit(request).await.expect("rpc");
                response.into_inner().overall_code == Code::Ok as i32
            }
        });
        ok += join_all(calls).await.into_iter().filter(|ok| *ok).count();
    }
    ok
}

async fn exactness(store: &str, url: &str, run: &str) {
    let (servers, clients) = servers(store, url).await;
    for algorithm in ALGORITHMS {
        let one_key = {
            let run = run.to_owned();
            Arc::new(move |_| format!("{run}-one")) as Arc<dyn Fn(usize) -> String + Send + Sync>
        };
        let single = admitted(&clients, algorithm, 1, one_key).await;
        let tripled = {
            let run = run.to_owned();
            admitted(
                &clients,
                algorithm,
                3,
                Arc::new(move |_| format!("{run}-three")),
            )
            .await
        };
        let distinct = {
            let run = run.to_owned();
            admitted(
                &clients,
                &format!("few_{algorithm}"),
                1,
                Arc::new(move |i| format!("{run}-{}", i % 1000)),
            )
            .await
        };
        println!(
            "{store} {algorithm}: one key {single}/1000, hits_addend 3 {tripled}/333, 1000 keys x limit 2: {distinct}/2000"
        );
        // Every algorithm, the sliding window included, is exact here: all calls fall in
        // one aligned window, where its estimate never exceeds the limit (bound: ≤ limit
        // per aligned window, < 2 × limit over a rolling one).
        assert_eq!(single, 1000, "{store} {algorithm} one key");
        assert_eq!(tripled, 333, "{store} {algorithm} hits_addend 3");
        assert_eq!(distinct, 2000, "{store} {algorithm} distinct keys");
    }
    for server in servers {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    exactness("redis", &redis.url(), "single").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_on_a_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    exactness("redis-cluster", &cluster.url(), "cluster").await;
}
