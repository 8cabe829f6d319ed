//! The Redis store: counters shared by every Sluice instance, in one Redis node, a
//! Sentinel-managed primary, or a Redis Cluster.
//!
//! Every decision runs in one Lua call ([`script`]; a function library on Redis 7 and
//! later, [`functions`]) that mirrors `src/algorithm/`
//! exactly, reads Redis `TIME` as its only clock, decides every limit of a descriptor
//! before writing anything (all-or-nothing), and sets a TTL no longer than the state
//! needs on every key it writes. Keys are `<prefix>sluice:{<digest hex>}:<limit index>`
//! (the prefix is the deployment's `--cache-key-prefix`, empty by default): the
//! hash tag is our digest of the unambiguous descriptor encoding, so client bytes never
//! choose the slot and all limits of a descriptor share one. Calls go through the
//! [`batcher`]; the client ([`client`]) never re-sends an in-flight call. A circuit
//! breaker per node ([`health`]) answers calls at once while that node keeps failing.

pub(crate) mod batcher;
pub(crate) mod call;
pub(crate) mod client;
pub(crate) mod clients;
pub(crate) mod exchange;
pub(crate) mod functions;
pub(crate) mod health;
pub(crate) mod hold;
pub(crate) mod lease;
pub mod links;
pub(crate) mod nodes;
pub mod script;
pub(crate) mod sentinel;
pub(crate) mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

pub use client::{mask_url, RedisMode, RedisOptions};
pub(crate) use tls::RedisTls;

use crate::algorithm::Decision;
use crate::lanes;
use crate::store::breaker::BreakerSettings;
use crate::store::redis::links::{Published, RegionLinks};
use crate::store::{
    HoldCall, LeaseGrant, LeaseRequest, Store, StoreCheck, StoreError, StoreStatus,
};
use crate::telemetry::Metrics;
use batcher::Job;
use call::Shared;
use nodes::{Connectivity, Nodes};

/// Counters in Redis (see the module documentation).
pub struct RedisStore {
    /// Batcher and clients on the runtime that made the store: calls from any thread
    /// other than a lane's go here.
    main: Backend,
    /// One per serving lane, on that lane's runtime: lane `i`'s calls go to `lanes[i]`,
    /// so a call is batched, sent and answered without leaving its thread.
    lanes: Vec<Backend>,
    /// Deployment kind, for [`Store::kind`].
    mode: RedisMode,
    /// Every node's `FCALL` or `EVALSHA` state, which every backend's clients share
    /// (read here for `/status`).
    scripting: Arc<functions::Scripting>,
    /// Every backend's clients, by node.
    clients: Arc<clients::Clients>,
}

/// One runtime's batcher and clients.
struct Backend {
    /// Queue of the batcher; bounded, never awaited on when full.
    jobs: mpsc::Sender<Job>,
    /// Clients, settings and metrics shared with the batcher.
    shared: Arc<Shared>,
}

impl RedisStore {
    /// Builds the client and starts connecting and batching in the background (must be
    /// called inside a tokio runtime). Never waits for Redis: until it is reachable,
    /// calls fail with a [`StoreError`].
    pub fn new(options: &RedisOptions, metrics: Arc<Metrics>) -> Result<Self, StoreError> {
        Self::with_lanes(options, metrics, &[], None)
    }

    /// [`RedisStore::new`], plus a batcher and clients of their own for each serving
    /// lane, made on the lane's runtime (`lanes[i]` is lane `i`'s, see
    /// [`crate::listener::lanes`]). The circuit breakers stay shared: every lane's
    /// outcomes count for a node. With `regions`, aggregated limits count the other
    /// regions' published usage, and their charged keys are recorded there to publish.
    pub fn with_lanes(
        options: &RedisOptions,
        metrics: Arc<Metrics>,
        lanes: &[tokio::runtime::Handle],
        regions: Option<Arc<RegionLinks>>,
    ) -> Result<Self, StoreError> {
        let clients = Arc::new(clients::Clients::default());
        let health = Arc::new(health::Health::new(
            BreakerSettings::default(),
            metrics.clone(),
            clients.clone(),
        ));
        let forget: Arc<dyn clients::Forget> = health.clone();
        clients.on_forget(Arc::downgrade(&forget));
        let scripting = Arc::new(functions::Scripting::new());
        let main = Backend::start(options, &health, &scripting, &clients, &metrics, &regions)?;
        let lanes = lanes
            .iter()
            .map(|lane| {
                let _on_lane = lane.enter();
                Backend::start(options, &health, &scripting, &clients, &metrics, &regions)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            main,
            lanes,
            mode: options.mode,
            scripting,
            clients,
        })
    }

    /// The backend of the calling thread's lane, or the main one.
    fn backend(&self) -> &Backend {
        lanes::current()
            .and_then(|lane| self.lanes.get(lane))
            .unwrap_or(&self.main)
    }

    #[cfg(feature = "test-hooks")]
    /// The client of the node that holds `key`'s counters, if that node is known (tests
    /// read keys and `MEMORY USAGE` through it).
    pub fn client_for(&self, key: crate::store::CounterKey) -> Option<fred::prelude::Client> {
        let slot = script::slot(key);
        self.main
            .shared
            .nodes
            .topology()
            .route(slot)
            .map(|node| node.client.clone())
    }

    /// Whether every node is known and connected now, by every lane's clients (for
    /// `/status`).
    pub fn is_connected(&self) -> bool {
        self.connectivity() == Connectivity::All
    }

    /// The least connected of its backends (each lane has its own clients).
    fn connectivity(&self) -> Connectivity {
        std::iter::once(&self.main)
            .chain(&self.lanes)
            .map(|backend| backend.shared.nodes.connectivity())
            .min()
            .unwrap_or(Connectivity::None)
    }

    /// Readies every backend's clients (one per lane, and the main one) for their first
    /// call, within `limit`: connected, and the Lua code loaded on every node. Without
    /// it, the first burst of requests waits on connections and `FUNCTION LOAD` behind
    /// the first call, passes the store deadline, opens the breaker, and takes the
    /// failure mode (admitted past the limit under `open`).
    pub(crate) async fn warm_up(&self, limit: Duration) {
        let backends = std::iter::once(&self.main).chain(&self.lanes);
        futures::future::join_all(backends.map(|backend| call::warm_up(&backend.shared, limit)))
            .await;
    }

    #[cfg(feature = "test-hooks")]
    /// Decides `checks` in one script call at an injected time `now` instead of Redis
    /// `TIME`, bypassing the batcher. For tests that compare the script with the Rust
    /// algorithms on the same clock; production calls never inject time.
    pub async fn check_at(
        &self,
        checks: &[StoreCheck],
        commit: bool,
        now: crate::algorithm::Micros,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let shared = &self.main.shared;
        shared.nodes.wait_known(shared.timeout).await;
        let call = script::Call::new(
            &shared.key_prefix,
            checks,
            commit,
            Some(now),
            shared.regions.as_deref(),
        );
        let mut results = call::run_calls(shared, std::slice::from_ref(&call)).await;
        let result = results
            .pop()
            .unwrap_or_else(|| Err(StoreError::Protocol("no reply".into())))?;
        decisions.extend(result);
        Ok(())
    }

    #[cfg(feature = "test-hooks")]
    /// A lease call at an injected time `now` instead of Redis `TIME` (tests only).
    pub async fn lease_at(
        &self,
        request: &LeaseRequest,
        now: crate::algorithm::Micros,
    ) -> Result<LeaseGrant, StoreError> {
        let shared = &self.main.shared;
        shared.nodes.wait_known(shared.timeout).await;
        lease::run(shared, request, Some(now)).await
    }

    #[cfg(feature = "test-hooks")]
    /// A concurrency limit's call at an injected time `now` instead of Redis `TIME`
    /// (tests only).
    pub async fn hold_at(
        &self,
        call: &HoldCall,
        now: crate::algorithm::Micros,
    ) -> Result<Decision, StoreError> {
        let shared = &self.main.shared;
        shared.nodes.wait_known(shared.timeout).await;
        hold::run(shared, call, Some(now)).await
    }
}

#[cfg(feature = "test-hooks")]
/// Test hooks of the region exchange: another region's state kept here as its
/// publication would keep it, at an injected time.
impl RedisStore {
    /// Keeps `state` (a window algorithm's stored string) as region `from`'s state of
    /// the single `limit` of `key`, as a publication does, at `now`; the number of keys
    /// written (0: the state held is newer).
    pub async fn import_at(
        &self,
        from: &str,
        key: crate::store::CounterKey,
        limit: &crate::store::LimitCheck,
        state: bytes::Bytes,
        now: crate::algorithm::Micros,
    ) -> Result<u64, StoreError> {
        let published = Published {
            key: key.for_limit(0),
            algorithm: limit.algorithm,
            period: limit.quota.period,
        };
        let suffix = format!(":from:{from}");
        self.import_states(
            suffix.as_bytes(),
            &[(published, state)],
            Some(now),
            Duration::from_secs(1),
        )
        .await
    }
}

/// The region exchange ([`exchange`]), on the main backend's clients: off the request
/// path, each call within `timeout`.
impl RedisStore {
    /// The stored states of `items` (`None` where there is none).
    pub(crate) async fn export_states(
        &self,
        items: &[Published],
        timeout: Duration,
    ) -> Result<Vec<Option<bytes::Bytes>>, StoreError> {
        let shared = &self.main.shared;
        shared.nodes.wait_known(timeout).await;
        exchange::export(shared, items, timeout).await
    }

    /// Keeps another region's published `states` at the keys with `suffix`; the
    /// number of keys written. `now` overrides Redis `TIME` (tests).
    pub(crate) async fn import_states(
        &self,
        suffix: &[u8],
        states: &[(Published, bytes::Bytes)],
        now: Option<crate::algorithm::Micros>,
        timeout: Duration,
    ) -> Result<u64, StoreError> {
        let shared = &self.main.shared;
        shared.nodes.wait_known(timeout).await;
        exchange::import(shared, suffix, states, now, timeout).await
    }

    /// Reconnects every node's clients: after an exchange call timed out, since a link
    /// that swallows every byte keeps its connections open, and the exchange's few calls
    /// a second never open a breaker (which reconnects on the request path).
    pub(crate) fn reconnect(&self) {
        for node in self.main.shared.nodes.topology().nodes() {
            self.clients.reconnect(&node.name);
        }
    }

    /// Leaves region `from`'s mark: `keys` published, for `ttl`.
    pub(crate) async fn mark_seen(
        &self,
        from: &str,
        keys: u64,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let shared = &self.main.shared;
        shared.nodes.wait_known(timeout).await;
        exchange::mark_seen(shared, from, keys, ttl, timeout).await
    }

    /// Region `from`'s mark here: the keys of its last publication and the mark's time
    /// left, if it has published within the stale time.
    pub(crate) async fn read_seen(
        &self,
        from: &str,
        timeout: Duration,
    ) -> Result<Option<(u64, Duration)>, StoreError> {
        let shared = &self.main.shared;
        shared.nodes.wait_known(timeout).await;
        exchange::read_seen(shared, from, timeout).await
    }
}

impl Backend {
    /// Connects the clients and starts the batcher on the current runtime.
    fn start(
        options: &RedisOptions,
        health: &Arc<health::Health>,
        scripting: &Arc<functions::Scripting>,
        clients: &Arc<clients::Clients>,
        metrics: &Arc<Metrics>,
        regions: &Option<Arc<RegionLinks>>,
    ) -> Result<Self, StoreError> {
        let shared = Arc::new(Shared {
            nodes: Nodes::connect(options, metrics.clone(), scripting.clone(), clients.clone())?,
            health: health.clone(),
            timeout: options.timeout,
            window: options.batch_window,
            max: options.batch_max.max(1),
            metrics: metrics.clone(),
            key_prefix: options.key_prefix.clone(),
            regions: regions.clone(),
        });
        let (jobs, queue) = mpsc::channel(options.queue.max(1));
        tokio::spawn(batcher::collect(queue, shared.clone()));
        Ok(Self { jobs, shared })
    }

    /// Queues `checks` for the batcher and waits for their decisions. A check whose node
    /// has no route or an open breaker fails at once; the others are still sent, and the
    /// call then fails [`StoreError::Partly`]. Not an `async fn`: that would keep its
    /// arguments twice in every request's future (as arguments and as the locals they
    /// move into).
    #[allow(clippy::manual_async_fn)] // an async fn is what this avoids
    fn submit<'s, 'd>(
        &'s self,
        checks: Vec<StoreCheck>,
        commit: bool,
        decisions: &'d mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + use<'s, 'd> {
        async move {
            if checks.is_empty() {
                return Ok(());
            }
            let op = if commit { "check" } else { "peek" };
            let started = Instant::now();
            self.shared.nodes.wait_known(self.shared.timeout).await;
            let refused = self.refused(&checks);
            let result = if refused.is_empty() {
                // The caller's vector travels with the job and comes back filled: no
                // answer vector per request, no copy.
                let (filled, outcome) = self
                    .round_trip(checks, commit, std::mem::take(decisions))
                    .await;
                *decisions = filled;
                outcome
            } else if refused.len() == checks.len() {
                Err(refused
                    .into_iter()
                    .map(|(_, error)| error)
                    .next()
                    .unwrap_or_else(|| StoreError::Unavailable("no check to send".into())))
            } else {
                Box::pin(self.send_the_rest(checks, refused, commit, decisions)).await
            };
            let metrics = &self.shared.metrics;
            metrics.store_duration(op, started.elapsed());
            if let Err(error) = &result {
                metrics.store_error(error.kind());
            }
            result
        }
    }

    /// The checks (by index) that may not go to Redis now, each with its error: its slot
    /// has no node, or that node's breaker is open. Empty (no allocation) when all may.
    fn refused(&self, checks: &[StoreCheck]) -> Vec<(usize, StoreError)> {
        let topology = self.shared.nodes.topology();
        let slot_of = |check: &StoreCheck| batcher::slot_of(&self.shared.nodes, check);
        let mut unrouted = Vec::new();
        let routed = checks.iter().enumerate().filter_map(|(index, check)| {
            let node = topology.route(slot_of(check));
            if node.is_none() {
                unrouted.push((index, call::unrouted(slot_of(check))));
            }
            node.map(|node| (index, &node.name))
        });
        let mut refused = self.shared.health.refused(routed);
        if !unrouted.is_empty() || !refused.is_empty() {
            // An open breaker may be a primary that has been replaced, an unrouted slot a
            // topology change: look again.
            self.shared.nodes.suspect();
            refused.append(&mut unrouted);
            refused.sort_by_key(|(index, _)| *index);
        }
        refused
    }

    /// Sends the checks not `refused` (a shard down) and answers for all: their
    /// decisions in place, placeholders for the failed, [`StoreError::Partly`] naming
    /// every failed check. The rare path of a cluster with a node down.
    async fn send_the_rest(
        &self,
        checks: Vec<StoreCheck>,
        refused: Vec<(usize, StoreError)>,
        commit: bool,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let mut sent = Vec::with_capacity(checks.len() - refused.len());
        let mut sent_index = Vec::with_capacity(sent.capacity());
        for (index, check) in checks.iter().enumerate() {
            if refused.binary_search_by_key(&index, |(at, _)| *at).is_err() {
                sent.push(check.clone());
                sent_index.push(index);
            }
        }
        let (filled, outcome) = self.round_trip(sent, commit, Vec::new()).await;
        let mut failed: Vec<usize> = refused.iter().map(|(index, _)| *index).collect();
        match outcome {
            Ok(()) => {}
            Err(StoreError::Partly { failed: more, .. }) => {
                failed.extend(more.iter().map(|at| sent_index[*at]));
            }
            Err(_) => failed.extend(&sent_index),
        }
        failed.sort_unstable();
        // Every check's decisions in order: the sent ones' from `filled`, placeholders
        // for the refused.
        let mut from = filled.into_iter();
        for (index, check) in checks.iter().enumerate() {
            let n = check.limits.len();
            if refused.binary_search_by_key(&index, |(at, _)| *at).is_ok() {
                decisions.extend(std::iter::repeat_n(Decision::default(), n));
            } else {
                // A reply cut short (an error) leaves placeholders too.
                let end = decisions.len() + n;
                decisions.extend(from.by_ref().take(n));
                decisions.resize(end, Decision::default());
            }
        }
        let error = refused.into_iter().map(|(_, error)| error).next();
        if failed.len() == checks.len() {
            return Err(error.unwrap_or(StoreError::Unavailable("every check failed".into())));
        }
        Err(StoreError::Partly {
            failed,
            error: Box::new(error.unwrap_or(StoreError::Unavailable("a shard failed".into()))),
        })
    }

    /// Queues one job and waits for its answer: the decisions vector (back whatever
    /// the outcome) and the outcome.
    async fn round_trip(
        &self,
        checks: Vec<StoreCheck>,
        commit: bool,
        decisions: Vec<Decision>,
    ) -> batcher::JobAnswer {
        let (reply, answer) = oneshot::channel();
        // The batcher answers by this deadline (the batch has its own; this one also
        // covers the time in the queue): no timer per call here.
        let job = Job {
            checks,
            commit,
            decisions,
            reply: Some(reply),
            deadline: Instant::now() + self.shared.timeout + self.shared.window,
        };
        if let Err(error) = self.jobs.try_send(job) {
            let (job, why) = match error {
                mpsc::error::TrySendError::Full(job) => (job, "redis batch queue is full"),
                mpsc::error::TrySendError::Closed(job) => (job, "redis batcher stopped"),
            };
            return (job.decisions, Err(StoreError::Unavailable(why.into())));
        }
        answer.await.unwrap_or_else(|_| {
            (
                Vec::new(),
                Err(StoreError::Unavailable("redis batch was dropped".into())),
            )
        })
    }
}

impl Store for RedisStore {
    // Not `async fn`s: the future is `submit`'s own, with nothing around it.
    fn check(
        &self,
        checks: &[StoreCheck],
        decisions: &mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.backend().submit(checks.to_vec(), true, decisions)
    }

    fn peek(
        &self,
        check: &StoreCheck,
        decisions: &mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.backend().submit(vec![check.clone()], false, decisions)
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
        let started = Instant::now();
        let backend = self.backend();
        let shared = &backend.shared;
        shared.nodes.wait_known(shared.timeout).await;
        let refused = backend.refused(std::slice::from_ref(&request.check));
        let result = match refused.into_iter().next() {
            // Boxed: the lease call's state is several kilobytes, and this future is
            // part of every request's future, which would otherwise carry that size
            // (allocated and moved per request) for a call made once per lease.
            None => Box::pin(lease::run(shared, request, None)).await,
            Some((_, error)) => Err(error),
        };
        shared.metrics.store_duration("lease", started.elapsed());
        if let Err(error) = &result {
            shared.metrics.store_error(error.kind());
        }
        result
    }

    async fn hold(&self, call: &HoldCall) -> Result<Decision, StoreError> {
        let started = Instant::now();
        let backend = self.backend();
        let shared = &backend.shared;
        shared.nodes.wait_known(shared.timeout).await;
        let slot = script::slot(call.key);
        let result = match shared.nodes.topology().route(slot) {
            None => Err(call::unrouted(slot)),
            // Boxed, as a lease call: every request's future would carry its size.
            Some(_) => Box::pin(hold::run(shared, call, None)).await,
        };
        shared.metrics.store_duration("hold", started.elapsed());
        if let Err(error) = &result {
            shared.metrics.store_error(error.kind());
        }
        result
    }

    fn status(&self) -> StoreStatus {
        let shared = &self.main.shared;
        StoreStatus {
            regions: shared
                .regions
                .as_ref()
                .map_or(serde_json::Value::Null, |links| {
                    links.status(&*crate::clock::SystemClock::shared())
                }),
            ..shared.health.status(
                &shared.nodes.topology(),
                self.connectivity(),
                self.scripting.name(),
            )
        }
    }

    fn kind(&self) -> &'static str {
        match self.mode {
            RedisMode::Standalone => "redis",
            RedisMode::Cluster => "redis-cluster",
            RedisMode::Sentinel => "redis-sentinel",
        }
    }
}
