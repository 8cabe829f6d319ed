//! Envoy Gateway's exact container contract: `sluice` started with no argument and the
//! whole environment Envoy Gateway gives its rate limit deployment (rules over xDS with
//! mutual TLS, mTLS on the gRPC port with one certificate for both ends, Redis,
//! Prometheus on `PROMETHEUS_ADDR`, the tracing variables) serves mTLS gRPC from the
//! pushed rules with counters in Redis, `/healthcheck`, and the metrics.

use std::time::Duration;

use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rls_config::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use support::e2e::free_ports;
use support::pki::{Ca, Leaf};
use support::process::SluiceProcess;
use support::redis::RedisServer;
use support::xds::{ServerTls, XdsServer};
use support::{fetch_metrics, user_request};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

fn rules() -> RateLimitConfig {
    RateLimitConfig {
        name: "default/eg/rule-0".into(),
        domain: "default/eg".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: 2,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

/// One call over a new mTLS connection as `identity` (none: no client certificate).
async fn call(grpc_port: u16, ca: &str, identity: Option<&Leaf>) -> Result<Code, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("envoy-ratelimit.envoy-gateway-system.svc");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
    }
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{grpc_port}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let request = sluice::proto::rls::RateLimitRequest {
        domain: "default/eg".into(),
        ..user_request("alice")
    };
    RateLimitServiceClient::new(channel)
        .should_rate_limit(request)
        .await
        .map(|response| response.into_inner().overall_code())
        .map_err(|status| format!("{status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_under_envoy_gateways_environment_alone() {
    // Envoy Gateway's PKI: one CA, one certificate for the rate limit service's gRPC
    // port and its xDS client, one for Envoy Gateway's xDS server.
    let certs = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("envoy gateway test ca");
    std::fs::write(certs.path().join("ca.crt"), ca.pem()).expect("write ca");
    ca.server_and_client(&["envoy-ratelimit.envoy-gateway-system.svc"])
        .write(certs.path(), "tls");
    let envoy_side = ca.client(&["envoy"]);
    let gateway = ca.server(&["127.0.0.1"]);
    let xds = XdsServer::start(Some(&ServerTls {
        cert_pem: gateway.cert_pem,
        key_pem: gateway.key_pem,
        client_ca_pem: ca.pem(),
    }));
    xds.push("1", &[rules()]);
    let redis = RedisServer::start();

    let cert = |name: &str| certs.path().join(name).display().to_string();
    let (tls_crt, tls_key, ca_crt) = (cert("tls.crt"), cert("tls.key"), cert("ca.crt"));
    let xds_url = xds.addr.to_string();
    let redis_url = redis.url().trim_start_matches("redis://").to_owned();
    let [port, grpc_port, prometheus_port] = free_ports();
    let (port_text, grpc_text) = (port.to_string(), grpc_port.to_string());
    let prometheus_addr = format!(":{prometheus_port}");
    let env = [
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", &xds_url),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &tls_crt),
        ("GRPC_SERVER_TLS_KEY", &tls_key),
        ("GRPC_SERVER_TLS_CA_CERT", &ca_crt),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &tls_crt),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &tls_key),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &ca_crt),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &redis_url),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", &prometheus_addr),
        ("TRACING_ENABLED", "true"),
        ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
        ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-0"),
        ("TRACING_SAMPLING_RATE", "0.5"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
        // Not Envoy Gateway's: free ports instead of 8080 and 8081, and JSON logs for
        // the harness.
        ("PORT", &port_text),
        ("GRPC_PORT", &grpc_text),
        ("LOG_FORMAT", "json"),
    ];
    let (_sluice, _grpc, http) = SluiceProcess::start(&[], &env);

    // Envoy Gateway's probe.
    let probe = reqwest::get(format!("http://{http}/healthcheck"))
        .await
        .expect("GET /healthcheck");
    assert_eq!(probe.status(), 200);
    xds.wait_for("ACK of version 1", |r| {
        r.version_info == "1" && r.node.as_ref().is_some_and(|n| n.id == "envoy-ratelimit")
    })
    .await;

    // mTLS gRPC: Envoy's certificate is answered from the pushed rules; no certificate
    // is refused.
    let ca_pem = ca.pem();
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(call(grpc_port, &ca_pem, Some(&envoy_side)).await);
    }
    assert_eq!(answers, [Ok(Code::Ok), Ok(Code::Ok), Ok(Code::OverLimit)]);
    assert!(
        call(grpc_port, &ca_pem, None).await.is_err(),
        "no client certificate"
    );

    // The counters are in Redis.
    let keys = redis.cli(&["--scan", "--pattern", "*sluice*"]);
    assert!(!keys.trim().is_empty(), "no Sluice key in Redis");

    // Prometheus on PROMETHEUS_ADDR, with the xDS stream's state.
    let metrics = fetch_metrics(&format!("http://127.0.0.1:{prometheus_port}/metrics")).await;
    assert_eq!(metrics.get("sluice_xds_connected"), 1.0);
    assert_eq!(
        metrics.get("sluice_xds_responses_total{result=\"ack\"}"),
        1.0
    );
}
