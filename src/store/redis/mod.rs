//! The Redis store: counters shared by every Sluice instance, in one Redis node, a
//! Sentinel-managed primary, or a Redis Cluster.
//!
//! Every decision runs in one Lua script ([`script`]) that mirrors `src/algorithm/`
//! exactly, reads Redis `TIME` as its only clock, decides every limit of a descriptor
//! before writing anything (all-or-nothing), and sets a TTL no longer than the state
//! needs on every key it writes. Keys are `sluice:{<digest hex>}:<limit index>`: the
//! hash tag is our digest of the unambiguous descriptor encoding, so client bytes never
//! choose the slot and all limits of a descriptor share one. Calls go through the
//! [`batcher`]; the client ([`client`]) never re-sends an in-flight call. A circuit
//! breaker per node ([`health`]) answers calls at once while that node keeps failing.

pub mod batcher;
pub mod client;
pub mod health;
pub mod lease;
pub mod script;
pub mod tls;

use std::sync::Arc;
use std::time::Instant;

use fred::prelude::{Client, ClientLike};
use tokio::sync::{mpsc, oneshot};

pub use client::{mask_url, RedisMode, RedisOptions};
pub use tls::{RedisTls, RedisTlsError};

use crate::algorithm::{Decision, Micros};
use crate::store::breaker::BreakerSettings;
use crate::store::{LeaseGrant, LeaseRequest, Store, StoreCheck, StoreError, StoreStatus};
use crate::telemetry::Metrics;
use batcher::{Job, Shared};

/// Counters in Redis (see the module documentation).
pub struct RedisStore {
    /// Queue of the batcher; bounded, never awaited on when full.
    jobs: mpsc::Sender<Job>,
    /// Client, settings and metrics shared with the batcher.
    shared: Arc<Shared>,
    /// Deployment kind, for [`Store::kind`].
    mode: RedisMode,
}

impl RedisStore {
    /// Builds the client and starts connecting and batching in the background (must be
    /// called inside a tokio runtime). Never waits for Redis: until it is reachable,
    /// calls fail with a [`StoreError`].
    pub fn new(options: &RedisOptions, metrics: Arc<Metrics>) -> Result<Self, StoreError> {
        let client = client::connect(options)?;
        health::log_connection_errors(&client, options.timeout, metrics.clone());
        let clustered = options.mode == RedisMode::Cluster;
        let shared = Arc::new(Shared {
            client,
            clustered,
            health: health::Health::new(clustered, BreakerSettings::default(), metrics.clone()),
            timeout: options.timeout,
            window: options.batch_window,
            max: options.batch_max.max(1),
            metrics,
        });
        let (jobs, queue) = mpsc::channel(options.queue.max(1));
        tokio::spawn(batcher::collect(queue, shared.clone()));
        Ok(Self {
            jobs,
            shared,
            mode: options.mode,
        })
    }

    /// The fred client (tests read keys and `MEMORY USAGE` through it).
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// Whether the connection to Redis is up now (for `/status`).
    pub fn is_connected(&self) -> bool {
        self.shared.client.is_connected()
    }

    /// Decides `checks` in one script call at an injected time `now` instead of Redis
    /// `TIME`, bypassing the batcher. For tests that compare the script with the Rust
    /// algorithms on the same clock; production calls never inject time.
    pub async fn check_at(
        &self,
        checks: &[StoreCheck],
        commit: bool,
        now: Micros,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let call = script::Call::new(checks, commit, Some(now));
        let mut results = batcher::run_calls(&self.shared, std::slice::from_ref(&call)).await;
        let result = results
            .pop()
            .unwrap_or_else(|| Err(StoreError::Protocol("no reply".into())))?;
        decisions.extend(result);
        Ok(())
    }

    /// A lease call at an injected time `now` instead of Redis `TIME` (tests only).
    pub async fn lease_at(
        &self,
        request: &LeaseRequest,
        now: Micros,
    ) -> Result<LeaseGrant, StoreError> {
        lease::run(&self.shared, request, Some(now)).await
    }

    /// Queues `checks` for the batcher and waits for their decisions; fails at once when
    /// the breaker of a node they live on is open.
    async fn submit(
        &self,
        checks: Vec<StoreCheck>,
        commit: bool,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let op = if commit { "check" } else { "peek" };
        let started = Instant::now();
        let result = match self.shared.health.allow(checks.iter().map(|check| {
            if self.shared.clustered {
                batcher::slot_of(check)
            } else {
                0
            }
        })) {
            Ok(()) => self.round_trip(checks, commit).await,
            Err(error) => Err(error),
        };
        let metrics = &self.shared.metrics;
        metrics.store_duration(op, started.elapsed());
        match result {
            Ok(found) => {
                decisions.extend(found);
                Ok(())
            }
            Err(error) => {
                metrics.store_error(error.kind());
                Err(error)
            }
        }
    }

    async fn round_trip(
        &self,
        checks: Vec<StoreCheck>,
        commit: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        let (reply, answer) = oneshot::channel();
        // The batch has its own deadline; this one also covers the time in the queue.
        let wait = self.shared.timeout + self.shared.window;
        let job = Job {
            checks,
            commit,
            reply,
            deadline: Instant::now() + wait,
        };
        self.jobs.try_send(job).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => {
                StoreError::Unavailable("redis batch queue is full".into())
            }
            mpsc::error::TrySendError::Closed(_) => {
                StoreError::Unavailable("redis batcher stopped".into())
            }
        })?;
        match tokio::time::timeout(wait, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Unavailable("redis batch was dropped".into())),
            Err(_) => Err(StoreError::Timeout(self.shared.timeout)),
        }
    }
}

impl Store for RedisStore {
    async fn check(
        &self,
        checks: &[StoreCheck],
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        if checks.is_empty() {
            return Ok(());
        }
        self.submit(checks.to_vec(), true, decisions).await
    }

    async fn peek(
        &self,
        check: &StoreCheck,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.submit(vec![check.clone()], false, decisions).await
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
        let started = Instant::now();
        let slot = if self.shared.clustered {
            batcher::slot_of(&request.check)
        } else {
            0
        };
        let result = match self.shared.health.allow(std::iter::once(slot)) {
            Ok(()) => {
                let result = lease::run(&self.shared, request, None).await;
                self.shared.health.record(slot, result.as_ref().map(|_| ()));
                self.shared
                    .health
                    .refresh_routing(&self.shared.client, result.is_err());
                result
            }
            Err(error) => Err(error),
        };
        let metrics = &self.shared.metrics;
        metrics.store_duration("lease", started.elapsed());
        if let Err(error) = &result {
            metrics.store_error(error.kind());
        }
        result
    }

    fn status(&self) -> StoreStatus {
        self.shared.health.status(self.shared.client.is_connected())
    }

    fn kind(&self) -> &'static str {
        match self.mode {
            RedisMode::Standalone => "redis",
            RedisMode::Cluster => "redis-cluster",
            RedisMode::Sentinel => "redis-sentinel",
        }
    }
}
