//! OTLP trace export, live (README, "Logs and traces"): the real binary, built with the
//! `otel` feature (`scripts/test` turns every feature on), runs `sluice serve
//! --otlp-endpoint` against a real OTLP/gRPC receiver: the collector's `TraceService`,
//! served here by tonic from the OpenTelemetry protocol crate. Calls produce
//! `rls.request` spans (with their domain) and `store.check` spans (with the store),
//! under service `sluice`, and the spans still batched when Sluice gets SIGTERM are
//! flushed before it exits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use support::process::SluiceProcess;
use support::redis::free_port;

/// One exported span: its service, its resource's attributes, name and string
/// attributes.
#[derive(Clone, Debug)]
struct Span {
    service: String,
    resource: Vec<(String, String)>,
    name: String,
    attributes: Vec<(String, String)>,
}

impl Span {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The receiver: keeps every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("spans").clone()
    }

    /// Keeps the spans of one export request.
    fn record(&self, request: ExportTraceServiceRequest) {
        let mut spans = self.spans.lock().expect("spans");
        for resource_spans in request.resource_spans {
            let resource = text(
                resource_spans
                    .resource
                    .as_ref()
                    .map_or(&[][..], |r| &r.attributes),
            );
            let service = resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(Span {
                        service: service.clone(),
                        resource: resource.clone(),
                        name: span.name,
                        attributes: text(&span.attributes),
                    });
                }
            }
        }
    }
}

fn text(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.record(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A receiver listening on a free port, and that port.
fn receiver() -> (Receiver, u16) {
    let receiver = Receiver::default();
    let port = free_port();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(receiver.clone()))
        .serve(([127, 0, 0, 1], port).into());
    tokio::spawn(server);
    (receiver, port)
}

/// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf bodies) on a free port, and that
/// port.
async fn http_receiver() -> (Receiver, u16) {
    use prost::Message;
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let keep = receiver.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                let request =
                    ExportTraceServiceRequest::decode(body).expect("an OTLP/HTTP protobuf body");
                keep.record(request);
                let response = ExportTraceServiceResponse::default().encode_to_vec();
                ([("content-type", "application/x-protobuf")], response)
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (receiver, port)
}

/// A rule directory for domain `bench`.
fn rules() -> tempfile::TempDir {
    let config = tempfile::tempdir().expect("temp dir");
    support::write_file(
        config.path(),
        "rules.yaml",
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000}\n",
    );
    config
}

/// Sends `n` calls to Sluice at `grpc`.
async fn calls(grpc: &str, n: usize) {
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect to sluice");
    for n in 0..n {
        client
            .should_rate_limit(support::user_request(&format!("u{n}")))
            .await
            .expect("a call");
    }
}

/// Stops Sluice with SIGTERM (the batched spans are flushed on the way out).
async fn stop(mut sluice: SluiceProcess) {
    sluice.terminate();
    let exit = tokio::task::spawn_blocking(move || sluice.wait_exit(Duration::from_secs(15)))
        .await
        .expect("wait task");
    assert!(exit.success(), "exit {exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_tracing_variables_name_the_service_and_sample() {
    let (receiver, port) = receiver();
    let config = rules();
    let dir = config.path().to_str().expect("UTF-8");
    let endpoint = format!("127.0.0.1:{port}");
    let mut env = vec![
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("TRACING_SERVICE_NAME", "ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-7"),
        ("TRACING_SAMPLING_RATE", "1"),
    ];
    let args = [
        "serve",
        "--config",
        dir,
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ];
    let (sluice, grpc, _) = SluiceProcess::start(&args, &env);
    calls(&grpc, 5).await;
    stop(sluice).await;
    let spans = receiver.spans();
    assert_eq!(
        spans.iter().filter(|s| s.name == "rls.request").count(),
        5,
        "{spans:?}"
    );
    for span in &spans {
        assert_eq!(span.service, "ratelimit");
        for (key, value) in [
            ("service.namespace", "envoy-gateway-system"),
            ("service.instance.id", "pod-7"),
        ] {
            assert!(
                span.resource.contains(&(key.to_owned(), value.to_owned())),
                "{span:?}"
            );
        }
    }

    // A sampling rate of 0 keeps no trace.
    env.retain(|(name, _)| *name != "TRACING_SAMPLING_RATE");
    env.push(("TRACING_SAMPLING_RATE", "0"));
    let (sluice, grpc, _) = SluiceProcess::start(&args, &env);
    calls(&grpc, 5).await;
    stop(sluice).await;
    assert_eq!(receiver.spans().len(), spans.len(), "sampled out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_and_the_last_are_flushed_at_exit() {
    let (receiver, port) = receiver();
    let config = rules();
    let endpoint = format!("http://127.0.0.1:{port}");
    let (sluice, grpc, _) = SluiceProcess::serve(config.path(), &["--otlp-endpoint", &endpoint]);
    calls(&grpc, 20).await;
    // The batch exporter sends every few seconds: stop Sluice now, and the spans still
    // batched must arrive before it exits.
    stop(sluice).await;

    let spans = receiver.spans();
    let requests: Vec<&Span> = spans.iter().filter(|s| s.name == "rls.request").collect();
    let checks: Vec<&Span> = spans.iter().filter(|s| s.name == "store.check").collect();
    assert_eq!(requests.len(), 20, "rls.request spans: {spans:?}");
    assert_eq!(checks.len(), 20, "store.check spans");
    assert!(spans.iter().all(|s| s.service == "sluice"), "{spans:?}");
    assert!(requests
        .iter()
        .all(|s| s.attribute("domain") == Some("bench")));
    assert!(requests
        .iter()
        .all(|s| s.attribute("descriptors") == Some("1")));
    assert!(checks
        .iter()
        .all(|s| s.attribute("store") == Some("memory")));
}

/// Without `TRACING_EXPORTER_PROTOCOL`, the reference exports over OTLP/HTTP: so does
/// Sluice, to the endpoint's `/v1/traces` (Envoy Gateway sets no protocol).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_is_the_default_protocol_of_the_reference_variables() {
    let (receiver, port) = http_receiver().await;
    let config = rules();
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
    ];
    let (sluice, grpc, _) = SluiceProcess::serve_with_env(config.path(), &[], &env);
    calls(&grpc, 3).await;
    stop(sluice).await;
    let spans = receiver.spans();
    assert_eq!(
        spans.iter().filter(|s| s.name == "rls.request").count(),
        3,
        "{spans:?}"
    );
    assert!(spans.iter().all(|s| s.service == "envoy-ratelimit"));
}
