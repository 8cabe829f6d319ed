//! End-to-end over xDS: a real Envoy (`deploy/envoy/envoy.yaml`) asks a `sluice` whose
//! rules come from a management server (the tests' ADS server), as under Envoy Gateway.
//! A push turns Envoy's 200s into 429s; the next push turns them back.

use std::path::Path;
use std::time::{Duration, Instant};

use sluice::proto::rls_config::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use support::e2e::envoy::Envoy;
use support::process::SluiceProcess;
use support::xds::XdsServer;

/// Domain `edge` (the bootstrap's), `user` limited to `per_hour`.
fn rules(per_hour: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: "edge".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: per_hour,
                name: "api_per_user".into(),
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

async fn status(client: &reqwest::Client, envoy: &Envoy) -> u16 {
    client
        .get(envoy.url("/api/items"))
        .header("x-user", "carol")
        .send()
        .await
        .expect("request through Envoy")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_pushed_over_xds_limit_envoy_traffic() {
    let server = XdsServer::start(None);
    server.push("v1", &[rules(2)]);
    let url = server.addr.to_string();
    let (_sluice, grpc, _http) = SluiceProcess::serve_with_env(
        Path::new("/nonexistent"),
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ],
    );
    server
        .wait_for("ACK of v1", |r| r.version_info == "v1")
        .await;
    let envoy = Envoy::start_for(&grpc).await;
    let client = reqwest::Client::new();

    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(status(&client, &envoy).await);
    }
    assert_eq!(seen, [200, 200, 429], "v1 allows 2 an hour");

    // A push raising the limit turns the 429s back into 200s within a second.
    server.push("v2", &[rules(100)]);
    let pushed = Instant::now();
    while status(&client, &envoy).await != 200 {
        assert!(
            pushed.elapsed() < Duration::from_secs(1),
            "still refused 1 s after v2"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And a push lowering it again refuses at once: the count was kept.
    server.push("v3", &[rules(2)]);
    let pushed = Instant::now();
    while status(&client, &envoy).await != 429 {
        assert!(
            pushed.elapsed() < Duration::from_secs(1),
            "still allowed 1 s after v3"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(envoy.stat("cluster.backend.ratelimit.over_limit").await >= 2);
}
