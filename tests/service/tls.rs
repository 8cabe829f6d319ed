//! gRPC over TLS and mTLS: a client with a good certificate gets answers; no
//! certificate, a certificate from another CA, or a SAN outside the allow-list is
//! refused; certificate files swapped on disk are served to the next connection.
//! Certificates are generated at test time.

use std::path::Path;
use std::time::Duration;

use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rls::RateLimitRequest;
use support::pki::{write_atomic, Ca, Leaf};
use support::TestServer;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const RULES: &str = "domain: tls\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

fn rules() -> Vec<(String, String)> {
    vec![("tls.yaml".into(), RULES.into())]
}

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "tls".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "alice".into(),
            }],
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        }],
        hits_addend: 0,
    }
}

/// Server and client PKI written into one temp directory.
struct Pki {
    dir: tempfile::TempDir,
    server_ca: Ca,
    client_ca: Ca,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let server_ca = Ca::new("sluice test server CA");
        let client_ca = Ca::new("sluice test client CA");
        server_ca.server(&["localhost"]).write(dir.path(), "server");
        write_atomic(&dir.path().join("client-ca.pem"), &client_ca.pem());
        Self {
            dir,
            server_ca,
            client_ca,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    /// `serve` flags for TLS, client CA and SAN list.
    fn flags(&self, sans: &str) -> Vec<String> {
        vec![
            "--grpc-tls-cert".into(),
            self.path("server.crt"),
            "--grpc-tls-key".into(),
            self.path("server.key"),
            "--grpc-tls-client-ca".into(),
            self.path("client-ca.pem"),
            "--grpc-tls-client-san".into(),
            sans.into(),
        ]
    }
}

async fn start(flags: &[String], env: &[(String, String)]) -> TestServer {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    TestServer::start(&rules(), env, &flags).await
}

/// One fresh TLS connection and one call; `Err` carries why it failed.
async fn call(
    server: &TestServer,
    trusted_ca: &str,
    identity: Option<&Leaf>,
) -> Result<Code, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(trusted_ca))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
    }
    let endpoint = Endpoint::from_shared(format!("https://{}", server.grpc))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    let response = RateLimitServiceClient::new(channel)
        .should_rate_limit(request())
        .await
        .map_err(|status| format!("{status:?}"))?;
    Ok(response.into_inner().overall_code())
}

#[tokio::test]
async fn good_client_certificate_gets_answers() {
    let pki = Pki::new();
    let server = start(&pki.flags("ratelimit-client.internal,10.0.0.9"), &[]).await;
    let client = pki.client_ca.client(&["ratelimit-client.internal"]);
    let ca = pki.server_ca.pem();
    assert_eq!(call(&server, &ca, Some(&client)).await, Ok(Code::Ok));
    assert_eq!(call(&server, &ca, Some(&client)).await, Ok(Code::Ok));
    assert_eq!(call(&server, &ca, Some(&client)).await, Ok(Code::OverLimit));
    // An IP SAN from the list is accepted too.
    let by_ip = pki.client_ca.client(&["10.0.0.9"]);
    assert_eq!(call(&server, &ca, Some(&by_ip)).await, Ok(Code::OverLimit));
}

#[tokio::test]
async fn clients_without_an_acceptable_certificate_are_refused() {
    let pki = Pki::new();
    let server = start(&pki.flags("ratelimit-client.internal"), &[]).await;
    let ca = pki.server_ca.pem();

    let none = call(&server, &ca, None).await;
    assert!(none.is_err(), "no client certificate: {none:?}");

    let stranger = Ca::new("another CA").client(&["ratelimit-client.internal"]);
    let wrong_ca = call(&server, &ca, Some(&stranger)).await;
    assert!(
        wrong_ca.is_err(),
        "certificate from another CA: {wrong_ca:?}"
    );

    let intruder = pki.client_ca.client(&["intruder.internal"]);
    let wrong_san = call(&server, &ca, Some(&intruder)).await;
    assert!(wrong_san.is_err(), "SAN outside the list: {wrong_san:?}");

    // A plaintext client is not served either.
    let mut plain = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .expect("tcp connect");
    let plain = tokio::time::timeout(Duration::from_secs(5), plain.should_rate_limit(request()))
        .await
        .expect("plaintext call ends");
    assert!(plain.is_err(), "plaintext: {plain:?}");

    // The server still serves good clients afterwards.
    let good = pki.client_ca.client(&["ratelimit-client.internal"]);
    assert_eq!(call(&server, &ca, Some(&good)).await, Ok(Code::Ok));
}

#[tokio::test]
async fn reference_environment_variables_enable_mtls() {
    let pki = Pki::new();
    let env = vec![
        ("GRPC_SERVER_USE_TLS".to_owned(), "true".to_owned()),
        ("GRPC_SERVER_TLS_CERT".to_owned(), pki.path("server.crt")),
        ("GRPC_SERVER_TLS_KEY".to_owned(), pki.path("server.key")),
        (
            "GRPC_CLIENT_TLS_CACERT".to_owned(),
            pki.path("client-ca.pem"),
        ),
        (
            "GRPC_CLIENT_TLS_SAN".to_owned(),
            "envoy.internal".to_owned(),
        ),
    ];
    let server = start(&[], &env).await;
    let ca = pki.server_ca.pem();
    let good = pki.client_ca.client(&["envoy.internal"]);
    assert_eq!(call(&server, &ca, Some(&good)).await, Ok(Code::Ok));
    let other = pki.client_ca.client(&["other.internal"]);
    assert!(call(&server, &ca, Some(&other)).await.is_err());
}

#[tokio::test]
async fn certificate_swapped_on_disk_is_served_to_the_next_connection() {
    let pki = Pki::new();
    let server = start(&pki.flags(""), &[]).await;
    let client = pki.client_ca.client(&["any.internal"]);
    let old_ca = pki.server_ca.pem();
    let new_ca = Ca::new("rotated server CA");
    assert_eq!(call(&server, &old_ca, Some(&client)).await, Ok(Code::Ok));
    assert!(call(&server, &new_ca.pem(), Some(&client)).await.is_err());

    // Rotate: a certificate from a new CA replaces the old one.
    new_ca
        .server(&["localhost"])
        .write(pki.dir.path(), "server");
    assert_eq!(
        call(&server, &new_ca.pem(), Some(&client)).await,
        Ok(Code::Ok),
        "the next connection gets the new certificate"
    );
    assert!(call(&server, &old_ca, Some(&client)).await.is_err());

    // A broken file is refused; the certificate in force keeps serving.
    write_atomic(&pki.dir.path().join("server.crt"), "not a certificate");
    assert_eq!(
        call(&server, &new_ca.pem(), Some(&client)).await,
        Ok(Code::OverLimit)
    );
}

#[test]
fn tls_settings_that_cannot_work_are_refused_at_start() {
    use clap::Parser;
    use sluice::settings::{Cli, Command, Settings};
    let resolve = |argv: &[&str], env: &[(&str, &str)]| {
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("argv").into_command() else {
            panic!("serve");
        };
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::resolve(&args, &|name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .map(|settings| settings.grpc_tls)
    };
    let none = resolve(&["sluice", "serve"], &[]).expect("plaintext");
    assert_eq!(none, None);
    assert!(resolve(&["sluice", "serve", "--grpc-tls-cert", "c.pem"], &[]).is_err());
    assert!(resolve(
        &[
            "sluice",
            "serve",
            "--grpc-tls-cert",
            "c",
            "--grpc-tls-key",
            "k",
            "--grpc-tls-client-san",
            "x"
        ],
        &[]
    )
    .is_err());
    let error = resolve(&["sluice", "serve"], &[("GRPC_SERVER_USE_TLS", "true")])
        .expect_err("TLS without files");
    // A combination of settings, not a value: no `invalid value ""`.
    assert_eq!(
        error.to_string(),
        "GRPC_SERVER_USE_TLS: TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
    );
    // Without GRPC_SERVER_USE_TLS the reference ignores its TLS file variables.
    assert_eq!(
        resolve(&["sluice", "serve"], &[("GRPC_SERVER_TLS_CERT", "c")]).expect("ignored"),
        None
    );
    let tls = resolve(
        &[
            "sluice",
            "serve",
            "--grpc-tls-cert",
            "c",
            "--grpc-tls-key",
            "k",
            "--grpc-tls-client-ca",
            "ca",
            "--grpc-tls-client-san",
            "a, b",
        ],
        &[],
    )
    .expect("resolve")
    .expect("tls");
    assert_eq!(tls.client_sans, vec!["a".to_owned(), "b".to_owned()]);
}

#[tokio::test]
async fn a_server_whose_tls_files_do_not_load_does_not_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    write_atomic(Path::new(&path("bad.crt")), "garbage");
    write_atomic(Path::new(&path("bad.key")), "garbage");
    let config = tempfile::tempdir().expect("config dir");
    let argv = [
        "sluice",
        "serve",
        "--config",
        config.path().to_str().expect("utf-8 path"),
        "--grpc-tls-cert",
        &path("bad.crt"),
        "--grpc-tls-key",
        &path("bad.key"),
    ];
    let settings = support::settings_from(&argv, &[]);
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let result = sluice::server::run(
        sluice::server::Listeners {
            grpc,
            http,
            prometheus: None,
        },
        settings,
        std::future::pending(),
    )
    .await;
    let error = result
        .expect_err("bad TLS files refuse to start")
        .to_string();
    assert!(error.contains("bad.crt"), "{error}");
}
