//! The RLS service: validates a request, decides it with the [`Limiter`] against the
//! live rules, and assembles the answer. Shared by the gRPC endpoint and `POST /json`.
//! Error-to-status mapping lives in [`errors`] alone.

mod builder;
pub(crate) mod debug;
mod delayed;
pub(crate) mod errors;
pub mod request;
pub mod response;
pub(crate) mod sketch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::limiter::explain::Explanation;
use crate::limiter::{Deadlines, Limiter, LimiterError};
use crate::proto::rls::rate_limit_service_server::RateLimitService;
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::rules::live::LiveRules;
use crate::store::Store;
use crate::telemetry::Metrics;
pub(crate) use builder::ServiceBuilder;
use debug::DebugReports;
pub(crate) use errors::ServiceError;
pub(crate) use request::RequestBounds;
pub use response::{HeaderMode, ResponseOptions};

/// Share of the caller's deadline (`grpc-timeout`) that store calls may use; the rest
/// is for the failure mode, the answer and the network back to the caller.
pub(crate) const STORE_SHARE: f64 = 0.5;

/// Answers rate limit requests.
pub struct Service<S> {
    /// Decides descriptors against the store.
    limiter: Limiter<S>,
    /// The rule set in force.
    rules: Arc<LiveRules>,
    /// Response shaping.
    options: ResponseOptions,
    /// Request size limits.
    bounds: RequestBounds,
    /// Call-level statistics.
    metrics: Arc<Metrics>,
    /// Shadow and hot-key reports, when `--debug-endpoints` is on.
    debug: Option<Arc<DebugReports>>,
}

// === impl Service ===

impl<S: Store> Service<S> {
    /// Builds a service over `store` under `rules` (see [`ServiceBuilder`]).
    pub fn builder(store: S, rules: Arc<LiveRules>) -> ServiceBuilder<S> {
        ServiceBuilder::new(store, rules)
    }

    /// The debug reports, when enabled.
    pub(crate) fn debug_reports(&self) -> Option<&Arc<DebugReports>> {
        self.debug.as_ref()
    }

    /// The limiter (and through it the store).
    pub fn limiter(&self) -> &Limiter<S> {
        &self.limiter
    }

    /// The live rules.
    pub fn rules(&self) -> &Arc<LiveRules> {
        &self.rules
    }

    /// Decides one request.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, ServiceError> {
        self.should_rate_limit_within(request, None).await
    }

    /// Decides one request whose caller waits at most `timeout` (its `grpc-timeout`):
    /// store calls get [`STORE_SHARE`] of it, so the failure mode still answers in time.
    pub(crate) async fn should_rate_limit_within(
        &self,
        request: &RateLimitRequest,
        timeout: Option<Duration>,
    ) -> Result<RateLimitResponse, ServiceError> {
        let started = Instant::now();
        let deadlines = Deadlines {
            store: timeout.map(|timeout| {
                tokio::time::Instant::from_std(started) + timeout.mul_f64(STORE_SHARE)
            }),
            answer: timeout.map(|timeout| tokio::time::Instant::from_std(started) + timeout),
        };
        let span = tracing::debug_span!(
            "rls.request",
            domain = %request.domain,
            descriptors = request.descriptors.len(),
        );
        let result = self.decide(request, deadlines).instrument(span).await;
        self.metrics
            .request_duration
            .observe(started.elapsed().as_secs_f64());
        if let Err(error) = &result {
            self.metrics.call_error(error.stat());
        }
        result
    }

    /// Explains `request` (which rule, why, what the store would decide), charging nothing.
    pub(crate) async fn explain(
        &self,
        request: &RateLimitRequest,
    ) -> Result<Vec<Explanation>, ServiceError> {
        let check = request::to_check_request(request, &self.bounds)?;
        let rule_set = self.rules.current().ok_or(ServiceError::NoRules)?;
        self.limiter
            .explain(&rule_set.rules, &check)
            .await
            .map_err(ServiceError::Store)
    }

    /// `GET /usage`: the usage of one descriptor (`None` before rules are loaded).
    pub(crate) async fn usage(
        &self,
        domain: &str,
        entries: &[crate::rules::Entry<'_>],
    ) -> Result<Option<crate::limiter::usage::Usage>, crate::store::StoreError> {
        let Some(rule_set) = self.rules.current() else {
            return Ok(None);
        };
        self.limiter
            .usage(&rule_set.rules, domain, entries)
            .await
            .map(Some)
    }

    async fn decide(
        &self,
        request: &RateLimitRequest,
        deadlines: Deadlines,
    ) -> Result<RateLimitResponse, ServiceError> {
        let check = request::to_check_request(request, &self.bounds)?;
        let rule_set = self.rules.current().ok_or(ServiceError::NoRules)?;
        let mut verdicts = self
            .limiter
            .check_within(&rule_set.rules, &check, deadlines)
            .await
            .map_err(|error| match error {
                LimiterError::Store(error) => ServiceError::Store(error),
                refused @ LimiterError::RefundOnLedger { .. } => {
                    ServiceError::InvalidArgument(refused.to_string())
                }
            })?;
        if let Some(wait) = delayed::longest_wait(&verdicts) {
            // Boxed: only a delayed answer pays for the wait's future.
            Box::pin(delayed::wait(
                self.limiter.delays(),
                &mut verdicts,
                wait,
                deadlines.answer,
            ))
            .await;
        }
        if let Some(debug) = &self.debug {
            debug.observe(&check, &verdicts, self.options.global_shadow_mode);
        }
        let built = response::build(&check, &verdicts, &self.options);
        if built.shadowed {
            self.metrics.global_shadow_mode.inc();
        }
        Ok(built.response)
    }
}

/// The gRPC face of a [`Service`].
pub(crate) struct GrpcService<S>(pub Arc<Service<S>>);

#[tonic::async_trait]
impl<S: Store> RateLimitService for GrpcService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // Only the deadline is read from the headers: they and the extensions are freed
        // before the call waits on its store, not held across a Redis round trip. In a
        // block of its own: a local that lives across an await keeps its room in the
        // request's future even once dropped (96 bytes of headers here).
        let (timeout, message) = {
            let (metadata, _extensions, message) = request.into_parts();
            (request::grpc_timeout(&metadata), message)
        };
        self.0
            .should_rate_limit_within(&message, timeout)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }
}
