//! `sluice bench` against a real Sluice server: every call is counted once whatever the
//! number of load threads, the open loop keeps its rate, OVER_LIMIT answers are told
//! apart from OK, failed calls are never throughput, every call carries the deadline
//! `--grpc-timeout` gives it, and bad flags or an unreachable target are errors, not
//! empty reports.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use clap::Parser;
use sluice::bench::{self, BenchArgs, BenchError, Report};
use sluice::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use sluice::proto::rls::{RateLimitRequest, RateLimitResponse};
use sluice::service::request::grpc_timeout;
use sluice::settings::{Cli, Command};
use support::TestServer;
use tonic::transport::server::TcpIncoming;

/// 50 calls an hour for the one key the load sends.
const RULES: &str = "domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 50}
";

async fn server() -> TestServer {
    TestServer::start(&[("bench.yaml".into(), RULES.into())], &[], &[]).await
}

/// `sluice bench` parsed from `flags`, whitespace-separated.
fn bench_args(flags: &str) -> BenchArgs {
    let argv = ["sluice", "bench"]
        .into_iter()
        .chain(flags.split_whitespace());
    match Cli::parse_from(argv).into_command() {
        Command::Bench(args) => *args,
        _ => unreachable!("parsed the bench command"),
    }
}

/// Runs the load off the test's runtime, which serves the target.
async fn run(args: BenchArgs) -> Result<Report, BenchError> {
    tokio::task::spawn_blocking(move || bench::run(&args))
        .await
        .expect("bench thread")
}

/// A run of `flags` against `server`, which must produce a report.
async fn bench_against(server: &TestServer, flags: &str) -> Report {
    let target = server.grpc;
    run(bench_args(&format!("--target {target} {flags}")))
        .await
        .expect("bench runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_every_thread_is_counted_once() {
    let server = server().await;
    let report = bench_against(
        &server,
        "--threads 2 --connections 3 --concurrency 5 \
         --duration 400ms --warmup 0s",
    )
    .await;
    assert_eq!(
        report.ok, 50,
        "the limit admits 50 calls in all: {report:?}"
    );
    assert!(report.over_limit > 0, "{report:?}");
    assert_eq!(report.requests, report.ok + report.over_limit, "{report:?}");
    assert!(report.errors == 0, "{report:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_loop_keeps_its_rate_over_several_threads() {
    let server = server().await;
    let report = bench_against(
        &server,
        "--threads 2 --connections 2 --concurrency 16 \
         --rate 2000 --duration 1s --warmup 200ms --keys uniform:1000",
    )
    .await;
    assert!(
        (1800..=2200).contains(&report.requests),
        "2000 calls in the measured second: {report:?}"
    );
    assert!(report.errors == 0, "{report:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_are_errors_not_throughput() {
    let server = server().await;
    // An empty domain is refused with INVALID_ARGUMENT, fast, on every call.
    let report = bench_against(
        &server,
        "--threads 2 --connections 2 --concurrency 4 \
         --duration 300ms --warmup 0s --domain=",
    )
    .await;
    assert!(report.errors > 0, "{report:?}");
    assert_eq!(report.requests, report.errors, "{report:?}");
    assert_eq!(
        report.errors_by_code.get("InvalidArgument"),
        Some(&report.errors),
        "{report:?}"
    );
    assert_eq!(report.rps, 0.0, "no call was answered: {report:?}");
    assert!(report.errors_per_sec > 0.0, "{report:?}");
    assert!(report.error_latency_ms.is_some(), "{report:?}");
    assert!(
        report.text().contains("answered 0 req/s"),
        "{}",
        report.text()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_target_is_an_error() {
    let closed = support::redis::free_port();
    let target = format!("127.0.0.1:{closed}");
    let error = run(bench_args(&format!(
        "--target {target} --threads 2 --duration 100ms"
    )))
    .await
    .expect_err("nothing listens there");
    assert!(matches!(error, BenchError::Connect { .. }), "{error}");
}

#[test]
fn more_threads_than_connections_is_refused() {
    let args = bench_args("--threads 3 --connections 2");
    let error = bench::run(&args).expect_err("three threads cannot share two connections");
    assert!(matches!(error, BenchError::Settings(_)), "{error}");
}

/// An OK answer (overall code 1).
fn answer_ok() -> tonic::Response<RateLimitResponse> {
    tonic::Response::new(RateLimitResponse {
        overall_code: 1,
        ..Default::default()
    })
}

/// An RLS server that answers OK and keeps each call's `grpc-timeout` (None: absent).
#[derive(Clone, Default)]
struct DeadlineRecorder(Arc<Mutex<Vec<Option<Duration>>>>);

#[tonic::async_trait]
impl RateLimitService for DeadlineRecorder {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let timeout = grpc_timeout(request.metadata());
        self.0.lock().expect("recorder").push(timeout);
        Ok(answer_ok())
    }
}

/// Serves `service` on a loopback port, listening before this returns (no connection
/// can race the server's start); its address.
fn serve(service: impl RateLimitService) -> SocketAddr {
    let incoming = TcpIncoming::bind(([127, 0, 0, 1], 0).into()).expect("bind");
    let target = incoming.local_addr().expect("local address");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(service))
            .serve_with_incoming(incoming),
    );
    target
}

/// The deadlines the calls of `flags` carried to a recording server.
async fn deadlines_of(flags: &str) -> Vec<Option<Duration>> {
    let recorder = DeadlineRecorder::default();
    let target = serve(recorder.clone());
    let report = run(bench_args(&format!("--target {target} {flags}")))
        .await
        .expect("bench runs");
    let deadlines = recorder.0.lock().expect("recorder").clone();
    assert!(report.ok > 0, "{report:?}");
    assert!(deadlines.len() as u64 >= report.requests, "{report:?}");
    deadlines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_carries_the_grpc_timeout_it_is_given() {
    let flags = "--threads 2 --connections 2 --concurrency 4 --duration 200ms --warmup 0s";
    let given = deadlines_of(&format!("{flags} --grpc-timeout 20ms")).await;
    assert!(
        given.iter().all(|d| *d == Some(Duration::from_millis(20))),
        "{:?}",
        &given[..given.len().min(5)]
    );
    let none = deadlines_of(flags).await;
    assert!(
        none.iter().all(Option::is_none),
        "{:?}",
        &none[..none.len().min(5)]
    );
}

/// An RLS server that holds every call until `stall` after the first one arrived, then
/// answers OK at once: a load generator held up in its warm-up.
struct Stalling {
    first: OnceLock<Instant>,
    stall: Duration,
}

#[tonic::async_trait]
impl RateLimitService for Stalling {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let until = *self.first.get_or_init(Instant::now) + self.stall;
        tokio::time::sleep_until(until.into()).await;
        Ok(answer_ok())
    }
}

/// The calls due in the warm-up are the warm-up's, even when a stall makes them start
/// after it: at 500 calls/s, 1 s measured after a warm-up the server stalls through,
/// about 500 calls count, not those plus the ~250 the warm-up owed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_due_in_the_warmup_never_count_when_they_start_late() {
    let target = serve(Stalling {
        first: OnceLock::new(),
        stall: Duration::from_millis(490),
    });
    let report = run(bench_args(&format!(
        "--target {target} --threads 2 --connections 2 --concurrency 64 \
         --rate 500 --duration 1s --warmup 500ms"
    )))
    .await
    .expect("bench runs");
    assert!(
        (450..=550).contains(&report.requests),
        "500 calls due in the measured second: {report:?}"
    );
    assert!(report.errors == 0, "{report:?}");
}
