//! A stand-in rate limit service that records every `ShouldRateLimit` call it gets and
//! answers each as the test decides: what Envoy puts on the wire, seen from the service.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use sluice::proto::rls::{RateLimitRequest, RateLimitResponse};
use sluice::service::request::grpc_timeout;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;

/// How the service answers a call.
pub type Answer = fn(&RateLimitRequest) -> Code;

/// One call as it arrived.
#[derive(Clone, Debug)]
pub struct Call {
    /// The request message.
    pub request: RateLimitRequest,
    /// Its `grpc-timeout` (the deadline Envoy gave it), if any.
    pub timeout: Option<Duration>,
}

/// A running recording service on a loopback port; stopped on drop.
pub struct RecordingRls {
    /// Its gRPC port (the one Envoy's rate limit cluster points at).
    pub port: u16,
    calls: Arc<Mutex<Vec<Call>>>,
    task: JoinHandle<()>,
}

impl RecordingRls {
    /// Serves on a free port, answering each call with `answer`'s code.
    pub fn start(answer: Answer) -> Self {
        let incoming = TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind the recording service's port");
        let port = incoming.local_addr().expect("local address").port();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let service = Recorder {
            calls: Arc::clone(&calls),
            answer,
        };
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(service))
                .serve_with_incoming(incoming)
                .await;
        });
        Self { port, calls, task }
    }

    /// Every call so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("calls").clone()
    }

    /// Waits until `count` calls have arrived and returns them all; panics after `within`
    /// with the calls seen.
    pub async fn wait_for_calls(&self, count: usize, within: Duration) -> Vec<Call> {
        let deadline = Instant::now() + within;
        loop {
            let calls = self.calls();
            if calls.len() >= count {
                return calls;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {count} rate limit calls within {within:?}: {calls:#?}",
                calls.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for RecordingRls {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Recorder {
    calls: Arc<Mutex<Vec<Call>>>,
    answer: Answer,
}

#[tonic::async_trait]
impl RateLimitService for Recorder {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let timeout = grpc_timeout(request.metadata());
        let request = request.into_inner();
        let code = (self.answer)(&request);
        self.calls
            .lock()
            .expect("calls")
            .push(Call { request, timeout });
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: code as i32,
            ..Default::default()
        }))
    }
}
