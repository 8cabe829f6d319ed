//! Store health: one circuit breaker per Redis node (one for a single node or Sentinel
//! primary), so a failed cluster shard takes its failure mode without closing the door
//! on the others; a log line per breaker transition; and connection errors logged once
//! per change (credentials never appear: Redis does not echo them and URLs are masked).
//!
//! In a cluster the node of a slot comes from a snapshot of fred's routing table,
//! refreshed after errors and at most every [`ROUTING_REFRESH`] otherwise; until the
//! first snapshot, every slot shares one breaker named `cluster`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use fred::prelude::{Client, ClusterInterface, EventInterface};
use fred::types::cluster::ClusterRouting;

use super::client::classify;
use crate::store::breaker::{Breaker, BreakerSettings, BreakerState, Transition};
use crate::store::{StoreError, StoreStatus};
use crate::telemetry::{Metrics, NodeLabel, StateLabel};

/// Longest age of the routing snapshot when nothing fails.
pub const ROUTING_REFRESH: Duration = Duration::from_millis(250);

/// Breakers and routing of one Redis store.
pub struct Health {
    /// Whether slots map to different nodes.
    clustered: bool,
    /// Thresholds of every breaker.
    settings: BreakerSettings,
    /// Breaker per node name.
    breakers: Mutex<HashMap<Arc<str>, Arc<Breaker>>>,
    /// The single node's breaker (standalone, Sentinel): no map lookup per call.
    single: Arc<Breaker>,
    /// Snapshot of fred's slot map (cluster only).
    routing: ArcSwapOption<ClusterRouting>,
    /// When the snapshot was taken.
    routing_at: Mutex<Option<Instant>>,
    /// Breaker state gauge and transition counter.
    metrics: Arc<Metrics>,
}

/// Name of the single node's breaker, and of the shared one before a cluster's slot map
/// is known.
const SINGLE: &str = "redis";
const UNKNOWN_CLUSTER: &str = "cluster";

// === impl Health ===

impl Health {
    /// Health for a store; `clustered` when slots live on different nodes.
    pub fn new(clustered: bool, settings: BreakerSettings, metrics: Arc<Metrics>) -> Self {
        let single = Arc::new(Breaker::new(settings));
        let name: Arc<str> = Arc::from(if clustered { UNKNOWN_CLUSTER } else { SINGLE });
        metrics
            .breaker_state
            .get_or_create(&NodeLabel { node: name.clone() })
            .set(0);
        Self {
            clustered,
            settings,
            breakers: Mutex::new(HashMap::from([(name, single.clone())])),
            single,
            routing: ArcSwapOption::empty(),
            routing_at: Mutex::new(None),
            metrics,
        }
    }

    /// Whether a call touching `slots` may go to Redis now; otherwise the error that
    /// sends it to the failure mode at once.
    pub fn allow(&self, slots: impl Iterator<Item = u16>) -> Result<(), StoreError> {
        let now = Instant::now();
        if !self.clustered {
            return self.allow_one(SINGLE, &self.single, now);
        }
        let mut seen: Vec<Arc<str>> = Vec::new();
        for slot in slots {
            let (name, breaker) = self.breaker_for(slot);
            if seen.contains(&name) {
                continue;
            }
            self.allow_one(&name, &breaker, now)?;
            seen.push(name);
        }
        Ok(())
    }

    fn allow_one(&self, name: &str, breaker: &Breaker, now: Instant) -> Result<(), StoreError> {
        let (allowed, transition) = breaker.allow(now);
        if let Some(transition) = transition {
            self.report(name, transition, None);
        }
        if allowed {
            Ok(())
        } else {
            Err(StoreError::BreakerOpen(name.to_owned()))
        }
    }

    /// Records the outcome of one script call on `slot`.
    pub fn record(&self, slot: u16, outcome: Result<(), &StoreError>) {
        let now = Instant::now();
        let (name, breaker) = if self.clustered {
            self.breaker_for(slot)
        } else {
            (Arc::from(SINGLE), self.single.clone())
        };
        if let Some(transition) = breaker.record(outcome.is_ok(), now) {
            self.report(&name, transition, outcome.err());
        }
    }

    /// Refreshes the routing snapshot from `client` if it is stale or `failed`.
    pub fn refresh_routing(&self, client: &Client, failed: bool) {
        if !self.clustered {
            return;
        }
        let now = Instant::now();
        {
            let mut at = self
                .routing_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let fresh = at.is_some_and(|at| now.saturating_duration_since(at) < ROUTING_REFRESH);
            if fresh && !failed {
                return;
            }
            *at = Some(now);
        }
        if let Some(routing) = client.cached_cluster_state() {
            if !routing.slots().is_empty() {
                self.routing.store(Some(Arc::new(routing)));
            }
        }
    }

    /// The node owning `slot` and its breaker (created closed on first use).
    fn breaker_for(&self, slot: u16) -> (Arc<str>, Arc<Breaker>) {
        let routing = self.routing.load();
        let name = routing
            .as_ref()
            .and_then(|routing| routing.get_server(slot))
            .map(|server| server.to_string());
        let mut breakers = self.lock();
        let name: Arc<str> = match name {
            Some(name) => match breakers.get_key_value(name.as_str()) {
                Some((key, breaker)) => return (key.clone(), breaker.clone()),
                None => Arc::from(name),
            },
            None => return (Arc::from(UNKNOWN_CLUSTER), self.single.clone()),
        };
        let breaker = Arc::new(Breaker::new(self.settings));
        breakers.insert(name.clone(), breaker.clone());
        self.metrics
            .breaker_state
            .get_or_create(&NodeLabel { node: name.clone() })
            .set(0);
        (name, breaker)
    }

    /// One log line and the metrics of a transition.
    fn report(&self, node: &str, transition: Transition, error: Option<&StoreError>) {
        let state = transition.to;
        self.metrics
            .breaker_state
            .get_or_create(&NodeLabel {
                node: Arc::from(node),
            })
            .set(state as i64);
        self.metrics
            .breaker_transitions
            .get_or_create(&StateLabel {
                state: state.name(),
            })
            .inc();
        match state {
            BreakerState::Open => tracing::warn!(
                node,
                from = transition.from.name(),
                backoff_ms = transition.backoff.as_millis() as u64,
                error = %error.map_or_else(String::new, ToString::to_string),
                "redis circuit breaker opened: calls take their rule's failure mode without waiting"
            ),
            BreakerState::HalfOpen => {
                tracing::info!(
                    node,
                    "redis circuit breaker half-open: probing with one call"
                )
            }
            BreakerState::Closed => {
                tracing::info!(node, "redis circuit breaker closed: redis answers again")
            }
        }
    }

    /// `/status` view: health and every breaker.
    pub fn status(&self, connected: bool) -> StoreStatus {
        let now = Instant::now();
        let breakers = self.lock();
        let mut nodes: Vec<(&Arc<str>, &Arc<Breaker>)> = breakers.iter().collect();
        nodes.sort_by(|a, b| a.0.cmp(b.0));
        let views: Vec<_> = nodes
            .iter()
            .map(|(name, breaker)| (name, breaker.view(now)))
            .collect();
        // Breakers of nodes the slot map no longer names (after a failover) keep their
        // last state; only the known ones count towards health.
        let tracked = |name: &str| !self.clustered || name != UNKNOWN_CLUSTER || views.len() == 1;
        let relevant: Vec<_> = views.iter().filter(|(name, _)| tracked(name)).collect();
        let open = relevant
            .iter()
            .filter(|(_, view)| view.state != BreakerState::Closed)
            .count();
        let health = if !connected || (open > 0 && open == relevant.len()) {
            "down"
        } else if open > 0 {
            "degraded"
        } else {
            "ok"
        };
        let worst = relevant
            .iter()
            .map(|(_, view)| view.state)
            .max_by_key(|state| *state as u8)
            .unwrap_or(BreakerState::Closed);
        let nodes: Vec<serde_json::Value> = views
            .iter()
            .map(|(name, view)| {
                serde_json::json!({
                    "node": name.as_ref(),
                    "state": view.state.name(),
                    "failures": view.failures,
                    "retry_in_ms": view.retry_in.map(|d| d.as_millis() as u64),
                })
            })
            .collect();
        StoreStatus {
            health,
            breaker: serde_json::json!({
                "state": worst.name(),
                "failures_to_open": self.settings.failures,
                "window_ms": self.settings.window.as_millis() as u64,
                "nodes": nodes,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Breaker>>> {
        self.breakers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Logs the client's connection errors (refused, auth, TLS...), once per distinct
/// message per node until it changes or a minute passes, so an outage is visible in the
/// log without flooding it, and counts each in `sluice_store_errors_total{kind}` (a
/// wrong password shows as `auth` there even though calls only time out). Ends when the
/// client is dropped.
pub fn log_connection_errors(client: &Client, timeout: Duration, metrics: Arc<Metrics>) {
    let last: Arc<Mutex<HashMap<String, (String, Instant)>>> = Arc::default();
    let _task = client.on_error(move |(error, server)| {
        let last = last.clone();
        let metrics = metrics.clone();
        async move {
            let node = server.map_or_else(|| "redis".to_owned(), |server| server.to_string());
            let error = classify(&error, timeout);
            metrics.store_error(error.kind());
            let message = error.to_string();
            let now = Instant::now();
            let mut seen = last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let repeated = seen.get(&node).is_some_and(|(text, at)| {
                *text == message && now.saturating_duration_since(*at) < Duration::from_secs(60)
            });
            if !repeated {
                tracing::warn!(node = %node, error = %message, "redis connection error");
                seen.insert(node, (message, now));
            }
            Ok(())
        }
    });
}
