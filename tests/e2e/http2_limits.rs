//! Hostile connections against the `sluice` binary's gRPC port: thousands of idle TCP
//! connections, and an HTTP/2 "rapid reset" flood (CVE-2023-44487). Each time a fresh
//! client must still be answered quickly.

use std::time::{Duration, Instant};

use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rls::RateLimitRequest;
use support::e2e::sluice::{Sluice, Store};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const RULES: &str = "domain: h2\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n";
/// Idle connections the test opens (fewer if the open-file hard limit is lower).
const IDLE_CONNECTIONS: u64 = 10_000;
/// How long a fresh client may take to get its answer while under attack.
const FRESH_CLIENT_DEADLINE: Duration = Duration::from_secs(2);

async fn start() -> (tempfile::TempDir, Sluice) {
    let rules = tempfile::tempdir().expect("temp dir");
    std::fs::write(rules.path().join("h2.yaml"), RULES).expect("write rules");
    let sluice = Sluice::start(rules.path(), Store::Memory).await;
    (rules, sluice)
}

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "h2".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "fresh".into(),
            }],
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        }],
        hits_addend: 0,
    }
}

/// Connects a new client and makes one call; returns how long both took.
async fn fresh_call(port: u16) -> Duration {
    let started = Instant::now();
    let call = async {
        let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("fresh client connects");
        client
            .should_rate_limit(request())
            .await
            .expect("fresh client is answered");
    };
    tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("fresh call finishes");
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_do_not_stop_a_fresh_client() {
    let hard = sluice::listener::raise_open_file_limit().expect("raise open-file limit");
    let count = IDLE_CONNECTIONS.min(hard.saturating_sub(512));
    eprintln!("open-file limit {hard}: opening {count} idle connections");
    let (_rules, sluice) = start().await;
    let port = sluice.grpc_port;

    let started = Instant::now();
    let mut idle = Vec::with_capacity(count as usize);
    for _ in 0..count {
        idle.push(
            TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("idle connect"),
        );
    }
    eprintln!("{count} idle connections open in {:?}", started.elapsed());

    let took = fresh_call(port).await;
    eprintln!("fresh client answered in {took:?} beside {count} idle connections");
    assert!(took < FRESH_CLIENT_DEADLINE, "fresh client took {took:?}");

    // Connections that never start HTTP/2 are closed after the handshake timeout.
    tokio::time::sleep(sluice::listener::HANDSHAKE_TIMEOUT + Duration::from_secs(2)).await;
    let mut closed = 0;
    for stream in idle.iter_mut().take(200) {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            _ => {}
        }
    }
    assert_eq!(closed, 200, "idle connections closed by the server");
    let took = fresh_call(port).await;
    assert!(took < FRESH_CLIENT_DEADLINE, "fresh client took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_flood_is_cut_off() {
    let (_rules, sluice) = start().await;
    let port = sluice.grpc_port;
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (mut client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let driver = tokio::spawn(connection);

    let body = {
        use prost::Message;
        let message = request().encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        bytes::Bytes::from(framed)
    };
    let started = Instant::now();
    let mut sent = 0u32;
    let mut cut_off = None;
    while sent < 100_000 && started.elapsed() < Duration::from_secs(20) {
        let ready = match client.ready().await {
            Ok(ready) => ready,
            Err(error) => {
                cut_off = Some(error);
                break;
            }
        };
        client = ready;
        let request = http::Request::post(format!(
            "http://127.0.0.1:{port}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
        match client.send_request(request, false) {
            Ok((_response, mut stream)) => {
                let _ = stream.send_data(body.clone(), false);
                stream.send_reset(h2::Reason::CANCEL);
                sent += 1;
            }
            Err(error) => {
                cut_off = Some(error);
                break;
            }
        }
        if sent % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
    eprintln!(
        "rapid reset: {sent} streams opened and reset in {:?}; connection error: {cut_off:?}",
        started.elapsed()
    );
    assert!(
        cut_off.is_some(),
        "{sent} rapid resets and the connection is still open"
    );
    let took = fresh_call(port).await;
    eprintln!("fresh client answered in {took:?} after the flood");
    assert!(took < FRESH_CLIENT_DEADLINE, "fresh client took {took:?}");
    driver.abort();
}
