//! Rules over xDS: a real `sluice serve` process subscribed to a real management server
//! (the test's, over mutual TLS): pushes change the answers within a second, an
//! unchanged rule keeps its counter, an invalid push is NACKed and the old rules keep
//! serving, a killed server is reconnected to (with a rotated client certificate),
//! and readiness before the first push
//! follows `FORCE_START_WITHOUT_INITIAL_CONFIG`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rls::RateLimitRequest;
use sluice::proto::rls_config::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use support::pki::Ca;
use support::process::SluiceProcess;
use support::xds::{ServerTls, XdsServer};
use support::{fetch_metrics, user_request};
use tonic::transport::Channel;

/// The test PKI: one CA for both sides, the server's certificate for `localhost`.
struct Pki {
    dir: tempfile::TempDir,
    server: ServerTls,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::new("xds test ca");
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).expect("write ca");
        ca.client(&["sluice"]).write(dir.path(), "client");
        let leaf = ca.server(&["localhost"]);
        Self {
            server: ServerTls {
                cert_pem: leaf.cert_pem,
                key_pem: leaf.key_pem,
                client_ca_pem: ca.pem(),
            },
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// A Sluice subscribed to `server` as node `test-node`, with the reference's variables.
fn sluice(server: &XdsServer, pki: &Pki, force_start: bool) -> (SluiceProcess, String, String) {
    let url = server.addr.to_string();
    let (ca, cert, key) = (
        pki.path("ca.crt"),
        pki.path("client.crt"),
        pki.path("client.key"),
    );
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()),
        ("CONFIG_GRPC_XDS_NODE_ID", "test-node"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone:test,team=edge"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-tenant:blue"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "localhost"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "200ms"),
        (
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
            if force_start { "true" } else { "false" },
        ),
    ];
    SluiceProcess::serve_with_env(&PathBuf::from("/nonexistent"), &[], &env)
}

fn config(domain: &str, key: &str, per_hour: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: format!("{domain}-rules"),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: per_hour,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

fn request(domain: &str, user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        ..user_request(user)
    }
}

async fn client(grpc: &str) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect to sluice")
}

/// The answer's code, or the gRPC error's message.
async fn answer(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> Result<Code, String> {
    match client.should_rate_limit(request).await {
        Ok(response) => Ok(response.into_inner().overall_code()),
        Err(status) => Err(status.message().to_owned()),
    }
}

/// Retries `request` for up to 1 s until it is answered `want`.
async fn answered_within_a_second(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
    want: Code,
) {
    let started = Instant::now();
    loop {
        let got = answer(client, request.clone()).await;
        if got == Ok(want) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "wanted {want:?} within 1 s, got {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn status(http: &str) -> serde_json::Value {
    reqwest::get(format!("http://{http}/status"))
        .await
        .expect("GET /status")
        .json()
        .await
        .expect("status JSON")
}

async fn ready(http: &str) -> bool {
    reqwest::get(format!("http://{http}/readyz"))
        .await
        .expect("GET /readyz")
        .status()
        .is_success()
}

async fn eventually_ready(http: &str, want: bool) {
    let started = Instant::now();
    while ready(http).await != want {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "readiness never became {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Sluice serving v1 (`edge`: one `user` an hour) from an mTLS management server,
/// with alice's one call already counted.
struct Serving {
    pki: Pki,
    server: XdsServer,
    _sluice: SluiceProcess,
    http: String,
    rls: RateLimitServiceClient<Channel>,
}

async fn serving_v1_with_alice_counted() -> Serving {
    let pki = Pki::new();
    let server = XdsServer::start(Some(&pki.server));
    server.push("v1", &[config("edge", "user", 1)]);
    let (sluice, grpc, http) = sluice(&server, &pki, false);
    eventually_ready(&http, true).await;
    let mut rls = client(&grpc).await;
    assert_eq!(
        answer(&mut rls, request("edge", "alice")).await,
        Ok(Code::Ok)
    );
    Serving {
        pki,
        server,
        _sluice: sluice,
        http,
        rls,
    }
}

#[tokio::test]
async fn pushes_change_the_answers_and_unchanged_rules_keep_their_counters() {
    let pki = Pki::new();
    let server = XdsServer::start(Some(&pki.server));
    server.push("v1", &[config("edge", "user", 2)]);
    let (_sluice, grpc, http) = sluice(&server, &pki, false);
    eventually_ready(&http, true).await;

    // The subscription names the node, its metadata and the resource type.
    let subscription = server.requests().remove(0);
    let node = subscription.node.expect("node");
    assert_eq!(node.id, "test-node");
    let metadata = node.metadata.expect("metadata").fields;
    assert_eq!(metadata.len(), 2, "{metadata:?}");
    assert_eq!(subscription.type_url, sluice::xds::TYPE_URL);
    server
        .wait_for("ACK of v1", |r| {
            r.version_info == "v1" && !r.response_nonce.is_empty() && r.error_detail.is_none()
        })
        .await;

    let mut rls = client(&grpc).await;
    for want in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(answer(&mut rls, request("edge", "alice")).await, Ok(want));
    }

    // v2 keeps the edge rule as it was and adds a domain: alice's counter is kept.
    let pushed = Instant::now();
    server.push(
        "v2",
        &[config("edge", "user", 2), config("other", "user", 1)],
    );
    server
        .wait_for("ACK of v2", |r| r.version_info == "v2")
        .await;
    assert!(
        pushed.elapsed() < Duration::from_secs(1),
        "v2 took {:?}",
        pushed.elapsed()
    );
    assert_eq!(
        answer(&mut rls, request("other", "bob")).await,
        Ok(Code::Ok)
    );
    assert_eq!(
        answer(&mut rls, request("edge", "alice")).await,
        Ok(Code::OverLimit)
    );
    assert_eq!(
        answer(&mut rls, request("other", "bob")).await,
        Ok(Code::OverLimit)
    );

    // v3 is the whole set: the edge domain is gone, so nothing limits it any more.
    server.push("v3", &[config("other", "user", 1)]);
    answered_within_a_second(&mut rls, request("edge", "alice"), Code::Ok).await;
    server
        .wait_for("ACK of v3", |r| r.version_info == "v3")
        .await;

    let status = status(&http).await;
    assert_eq!(status["rules"]["source"], "xds");
    assert_eq!(status["xds"]["connected"], true);
    assert_eq!(status["xds"]["acked_version"], "v3");
    let metrics = fetch_metrics(&format!("http://{http}/metrics")).await;
    assert_eq!(
        metrics.get("sluice_xds_responses_total{result=\"ack\"}"),
        3.0
    );
    assert_eq!(metrics.get("sluice_xds_connected"), 1.0);
}

#[tokio::test]
async fn an_invalid_push_is_nacked_with_its_reason_and_the_old_rules_keep_serving() {
    // The certificates stay on disk while the test runs.
    let Serving {
        pki: _pki,
        server,
        _sluice,
        http,
        mut rls,
    } = serving_v1_with_alice_counted().await;

    let mut broken = config("edge", "user", 5);
    broken.name = "broken-edge".into();
    broken.descriptors[0]
        .rate_limit
        .as_mut()
        .expect("policy")
        .unit = RateLimitUnit::Unknown as i32;
    server.push("v2", &[broken]);
    let nack = server
        .wait_for("NACK of v2", |r| r.error_detail.is_some())
        .await;
    let reason = nack.error_detail.expect("detail").message;
    assert_eq!(reason, "broken-edge: invalid rate limit unit 'UNKNOWN'");
    assert_eq!(
        nack.version_info, "v1",
        "a NACK carries the last accepted version"
    );
    assert!(!nack.response_nonce.is_empty());

    // The old rules keep serving, and readiness stays.
    assert_eq!(
        answer(&mut rls, request("edge", "alice")).await,
        Ok(Code::OverLimit)
    );
    assert!(ready(&http).await);
    let status = status(&http).await;
    assert_eq!(status["xds"]["acked_version"], "v1");
    assert_eq!(status["xds"]["last_nack"]["version"], "v2");
    assert_eq!(status["xds"]["last_nack"]["reason"], reason.as_str());
    let metrics = fetch_metrics(&format!("http://{http}/metrics")).await;
    assert_eq!(
        metrics.get("sluice_xds_responses_total{result=\"nack\"}"),
        1.0
    );

    // A resource of another type is NACKed too.
    server.push_any(
        "v3",
        vec![prost_types::Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: Vec::new(),
        }],
    );
    let nack = server
        .wait_for("NACK of v3", |r| {
            r.error_detail
                .as_ref()
                .is_some_and(|d| d.message.contains("Cluster"))
        })
        .await;
    assert_eq!(nack.version_info, "v1");

    // A good push after the bad ones is taken.
    server.push("v4", &[config("edge", "user", 5)]);
    server
        .wait_for("ACK of v4", |r| {
            r.version_info == "v4" && r.error_detail.is_none()
        })
        .await;
}

#[tokio::test]
async fn a_killed_server_is_reconnected_to_and_the_rules_keep_serving_meanwhile() {
    let Serving {
        pki,
        server,
        _sluice,
        http,
        mut rls,
    } = serving_v1_with_alice_counted().await;

    let addr = server.addr;
    server.kill();
    let started = Instant::now();
    while status(&http).await["xds"]["connected"] != false {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never saw the disconnection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Disconnected: the last rules keep serving, and the service stays ready.
    assert_eq!(
        answer(&mut rls, request("edge", "alice")).await,
        Ok(Code::OverLimit)
    );
    assert!(ready(&http).await);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The client certificate is rotated meanwhile, to one of a CA the restarted server
    // alone trusts: the reconnection proves the new files are used.
    let rotated_ca = Ca::new("rotated xds test ca");
    rotated_ca
        .client(&["sluice"])
        .write(pki.dir.path(), "client");
    let rotated = ServerTls {
        cert_pem: pki.server.cert_pem.clone(),
        key_pem: pki.server.key_pem.clone(),
        client_ca_pem: rotated_ca.pem(),
    };
    let server = XdsServer::restart_on(addr, Some(&rotated));
    server.push(
        "v2",
        &[config("edge", "user", 1), config("other", "user", 1)],
    );
    let resubscription = server
        .wait_for("resubscription", |r| r.response_nonce.is_empty())
        .await;
    assert_eq!(
        resubscription.version_info, "v1",
        "it resubscribes with the version it has"
    );
    server
        .wait_for("ACK of v2", |r| r.version_info == "v2")
        .await;
    answered_within_a_second(&mut rls, request("other", "bob"), Code::Ok).await;
    assert_eq!(
        answer(&mut rls, request("edge", "alice")).await,
        Ok(Code::OverLimit)
    );
}

#[tokio::test]
async fn before_the_first_push_readiness_follows_force_start() {
    let pki = Pki::new();
    // A management server that has no snapshot yet.
    let server = XdsServer::start(Some(&pki.server));

    let (_waiting, grpc, http) = sluice(&server, &pki, false);
    server.wait_for("subscription", |_| true).await;
    assert!(
        !ready(&http).await,
        "not ready before the first configuration"
    );
    let mut rls = client(&grpc).await;
    let refused = answer(&mut rls, request("edge", "alice")).await;
    assert_eq!(refused, Err("no rate limit configuration loaded".into()));

    let (_forced, forced_grpc, forced_http) = sluice(&server, &pki, true);
    assert!(
        ready(&forced_http).await,
        "ready at once with FORCE_START_WITHOUT_INITIAL_CONFIG"
    );
    let mut forced = client(&forced_grpc).await;
    let refused = answer(&mut forced, request("edge", "alice")).await;
    assert_eq!(refused, Err("no rate limit configuration loaded".into()));

    server.push("v1", &[config("edge", "user", 1)]);
    eventually_ready(&http, true).await;
    answered_within_a_second(&mut rls, request("edge", "alice"), Code::Ok).await;
    answered_within_a_second(&mut forced, request("edge", "alice"), Code::Ok).await;
}
