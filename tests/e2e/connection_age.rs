//! Balanced connections: with `--grpc-max-connection-age`, Sluice ends each gRPC
//! connection at that age with a graceful GOAWAY; a real Envoy in front reconnects, and
//! no call fails across the reconnections (the fail-closed listener would turn a failed
//! rate limit call into a 500).

use std::time::{Duration, Instant};

use support::e2e::envoy::Envoy;
use support::process::SluiceProcess;

/// The bootstrap's domain, with room for every request of the test.
const RULES: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_end_at_their_age_and_no_call_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("edge.yaml"), RULES).expect("write rules");
    let (_sluice, grpc, _http) = SluiceProcess::serve(
        dir.path(),
        &[
            "--grpc-max-connection-age",
            "500ms",
            "--grpc-max-connection-age-grace",
            "2s",
        ],
    );
    let envoy = Envoy::start_for(&grpc).await;
    let client = reqwest::Client::new();
    let connections_before = envoy.stat("cluster.sluice.upstream_cx_total").await;

    // Four callers for 3 s: some calls are in flight whenever a connection ends.
    let started = Instant::now();
    let callers = (0..4).map(|caller| {
        let client = client.clone();
        let url = envoy.url("/api/items");
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            while started.elapsed() < Duration::from_secs(3) {
                let response = client
                    .get(&url)
                    .header("x-user", format!("age-{caller}"))
                    .send()
                    .await
                    .expect("request through Envoy");
                statuses.push(response.status().as_u16());
            }
            statuses
        })
    });
    let mut calls = 0;
    for caller in callers {
        let statuses = caller.await.expect("caller");
        calls += statuses.len();
        assert!(
            statuses.iter().all(|s| *s == 200),
            "a call failed: {statuses:?}"
        );
    }
    let connections = envoy.stat("cluster.sluice.upstream_cx_total").await - connections_before;
    assert!(
        connections >= 3,
        "{connections} connections to Sluice over 3 s with a 0.5 s age: never reconnected"
    );
    assert_eq!(envoy.stat("cluster.backend.ratelimit.error").await, 0);
    assert_eq!(envoy.stat("cluster.sluice.upstream_rq_5xx").await, 0);
    eprintln!("ok: {calls} calls over {connections} connections, none failed");
}

/// A call that never ends (its request body never finishes) holds the connection past
/// the graceful GOAWAY; once the grace is over the socket is closed anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_held_by_a_call_is_closed_after_the_grace() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("edge.yaml"), RULES).expect("write rules");
    let (_sluice, grpc, _http) = SluiceProcess::serve(
        dir.path(),
        &[
            "--grpc-max-connection-age",
            "300ms",
            "--grpc-max-connection-age-grace",
            "700ms",
        ],
    );
    let tcp = tokio::net::TcpStream::connect(&grpc)
        .await
        .expect("connect");
    let (mut client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    let opened = Instant::now();
    let connection = tokio::spawn(connection);
    let request = http::Request::post(format!(
        "http://{grpc}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .expect("request");
    // Headers only: the body (and so the call) never ends.
    let (_response, _body) = client.send_request(request, false).expect("stream opened");
    let _ = tokio::time::timeout(Duration::from_secs(10), connection)
        .await
        .expect("the connection was closed");
    let lived = opened.elapsed();
    // Age 0.3 s (± 10 %) then 0.7 s of grace: closed after 1 s at the earliest, and
    // by 1.03 s at the latest plus scheduling.
    assert!(
        lived >= Duration::from_millis(950) && lived < Duration::from_secs(3),
        "the held connection lived {lived:?}"
    );
}
