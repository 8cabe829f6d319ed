//! End-to-end mTLS: a real Envoy whose rate limit cluster has an upstream TLS context
//! (client certificate, server CA, server SAN check) calls Sluice over mTLS, and an
//! HTTP client of Envoy sees real OK / OVER_LIMIT answers (`failure_mode_deny`, so a
//! failed TLS call would show as 500). Certificates are generated at test time.

use support::e2e::envoy::spawn_ready;
use support::e2e::{envoy_bin, free_ports};
use support::pki::{write_atomic, Ca};
use support::TestServer;

const RULES: &str = "domain: mtls\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";

/// The bootstrap: ingress (rate limit filter, fail closed) → backend listener
/// (direct_response, so the route goes through a cluster Envoy does rate-limit).
fn bootstrap(admin: u16, ingress: u16, backend: u16, sluice: u16, dir: &str) -> String {
    format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: {ingress}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - request_headers: {{header_name: x-user, descriptor_key: user}}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: mtls
              failure_mode_deny: true
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: rls}}
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  - name: backend
    address: {{socket_address: {{address: 127.0.0.1, port_value: {backend}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                direct_response: {{status: 200, body: {{inline_string: "backend ok\n"}}}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
  - name: rls
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: ratelimit.internal
        common_tls_context:
          alpn_protocols: ["h2"]
          tls_certificates:
          - certificate_chain: {{filename: "{dir}/envoy.crt"}}
            private_key: {{filename: "{dir}/envoy.key"}}
          validation_context:
            trusted_ca: {{filename: "{dir}/server-ca.pem"}}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{exact: ratelimit.internal}}
    load_assignment:
      cluster_name: rls
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {sluice}}}}}}}
  - name: backend
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {backend}}}}}}}
"#
    )
}

async fn stat(client: &reqwest::Client, admin: u16, name: &str) -> u64 {
    let text = client
        .get(format!("http://127.0.0.1:{admin}/stats?filter=^{name}$"))
        .send()
        .await
        .expect("GET /stats")
        .text()
        .await
        .expect("stats body");
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}: ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_calls_sluice_over_mtls() {
    // Fails at once, naming the install step, when Envoy is missing.
    let _ = envoy_bin();
    let dir = tempfile::tempdir().expect("temp dir");
    let server_ca = Ca::new("sluice e2e server CA");
    let client_ca = Ca::new("sluice e2e client CA");
    server_ca
        .server(&["ratelimit.internal"])
        .write(dir.path(), "sluice");
    client_ca
        .client(&["envoy.internal"])
        .write(dir.path(), "envoy");
    write_atomic(&dir.path().join("server-ca.pem"), &server_ca.pem());
    write_atomic(&dir.path().join("client-ca.pem"), &client_ca.pem());
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();

    let sluice = TestServer::start(
        &[("mtls.yaml".to_owned(), RULES.to_owned())],
        &[],
        &[
            "--grpc-tls-cert",
            &path("sluice.crt"),
            "--grpc-tls-key",
            &path("sluice.key"),
            "--grpc-tls-client-ca",
            &path("client-ca.pem"),
            "--grpc-tls-client-san",
            "envoy.internal",
        ],
    )
    .await;

    let [admin, ingress, backend] = free_ports();
    let dir_text = dir.path().to_string_lossy().into_owned();
    let bootstrap = bootstrap(admin, ingress, backend, sluice.grpc.port(), &dir_text);
    let envoy = spawn_ready(dir.path(), &bootstrap, admin).await;

    let client = reqwest::Client::new();
    let mut codes = Vec::new();
    for _ in 0..5 {
        let response = client
            .get(format!("http://127.0.0.1:{ingress}/"))
            .header("x-user", "alice")
            .send()
            .await
            .expect("request through Envoy");
        codes.push(response.status().as_u16());
    }
    assert_eq!(
        codes,
        vec![200, 200, 200, 429, 429],
        "Envoy log:\n{}",
        envoy.log_excerpt()
    );
    assert!(stat(&client, admin, "cluster.rls.ssl.handshake").await >= 1);
    assert_eq!(
        stat(&client, admin, "cluster.backend.ratelimit.ok").await,
        3
    );
    assert_eq!(
        stat(&client, admin, "cluster.backend.ratelimit.over_limit").await,
        2
    );
}
