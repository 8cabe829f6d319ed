//! Store health: one circuit breaker per Redis node (one for a single node or Sentinel
//! primary), so a failed cluster shard takes its failure mode without closing the door
//! on the others; a log line per breaker transition; and connection errors logged once
//! per change (credentials never appear: Redis does not echo them and URLs are masked).
//! Which node serves a call comes from [`super::nodes`]. A breaker that opens on
//! timeouts has every client of its node reconnected ([`Clients::reconnect`]): a
//! connection that takes calls and never answers is not dropped otherwise. A node's
//! breaker, and its gauge, go when the last client of the node does ([`Forget`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arc_swap::ArcSwap;

use super::clients::{Clients, Forget};
use super::nodes::{Connectivity, Topology};
use crate::store::breaker::{Breaker, BreakerSettings, BreakerState, BreakerView, Transition};
use crate::store::{StoreError, StoreStatus};
use crate::telemetry::{Metrics, NodeLabel, StateLabel};

/// The breakers of one Redis store.
pub(crate) struct Health {
    /// Thresholds of every breaker.
    settings: BreakerSettings,
    /// Breaker per node name, created closed on first use. Read on every call without a
    /// lock; replaced whole (copied) only when a node is added or dropped.
    breakers: ArcSwap<HashMap<Arc<str>, Arc<Breaker>>>,
    /// Serialises those replacements.
    writer: Mutex<()>,
    /// Breaker state gauge and transition counter.
    metrics: Arc<Metrics>,
    /// Every backend's clients of each node, reconnected when its breaker opens on
    /// timeouts.
    clients: Arc<Clients>,
}

// === impl Health ===

impl Health {
    /// No breaker yet; each node's is made on its first call.
    pub(crate) fn new(
        settings: BreakerSettings,
        metrics: Arc<Metrics>,
        clients: Arc<Clients>,
    ) -> Self {
        Self {
            settings,
            breakers: ArcSwap::default(),
            writer: Mutex::new(()),
            metrics,
            clients,
        }
    }

    /// Which of the checks on `nodes` (a check's index and its node) may not go to
    /// Redis now, each with the error that sends it to the failure mode at once; empty
    /// (no allocation) when all may.
    pub(crate) fn refused<'a>(
        &self,
        nodes: impl Iterator<Item = (usize, &'a Arc<str>)>,
    ) -> Vec<(usize, StoreError)> {
        // A closed breaker lets every call through and keeps no state for it, so the
        // common case reads neither the clock nor a list; nodes whose breaker is open or
        // half-open are asked once per call (asking again could take a second probe).
        let mut now = None;
        let mut asked: Vec<(&Arc<str>, bool)> = Vec::new();
        let mut refused = Vec::new();
        for (check, node) in nodes {
            let allowed = match asked.iter().find(|(name, _)| *name == node) {
                Some((_, allowed)) => *allowed,
                None => {
                    let verdict = self.with_breaker(node, |breaker| {
                        (breaker.state() != BreakerState::Closed)
                            .then(|| breaker.allow(*now.get_or_insert_with(Instant::now)))
                    });
                    let Some((allowed, transition)) = verdict else {
                        continue;
                    };
                    if let Some(transition) = transition {
                        self.report(node, transition, None);
                    }
                    asked.push((node, allowed));
                    allowed
                }
            };
            if !allowed {
                refused.push((check, StoreError::BreakerOpen(node.to_string())));
            }
        }
        refused
    }

    /// Records the outcome of one script call on `node`. When that opens its breaker
    /// (or a probe fails) on a timeout, every client of the node is reconnected: the
    /// node may be healthy behind a connection that no longer carries answers, and
    /// fred keeps a connection until its socket fails.
    pub(crate) fn record(&self, node: &Arc<str>, outcome: Result<(), &StoreError>) {
        let now = Instant::now();
        if let Some(transition) =
            self.with_breaker(node, |breaker| breaker.record(outcome.is_ok(), now))
        {
            if transition.to == BreakerState::Open && matches!(outcome, Err(StoreError::Timeout(_)))
            {
                self.clients.reconnect(node);
            }
            self.report(node, transition, outcome.err());
        }
    }

    /// `f` of the breaker of `node`, made (closed) on first use.
    fn with_breaker<T>(&self, node: &Arc<str>, f: impl FnOnce(&Breaker) -> T) -> T {
        if let Some(breaker) = self.breakers.load().get(node) {
            return f(breaker);
        }
        f(&self.add_breaker(node))
    }

    /// A closed breaker for `node` (or the one another call made meanwhile).
    fn add_breaker(&self, node: &Arc<str>) -> Arc<Breaker> {
        let _writer = self.write();
        let current = self.breakers.load_full();
        if let Some(breaker) = current.get(node) {
            return breaker.clone();
        }
        let breaker = Arc::new(Breaker::new(self.settings));
        let mut next = HashMap::clone(&current);
        next.insert(node.clone(), breaker.clone());
        self.breakers.store(Arc::new(next));
        self.metrics
            .breaker_state
            .get_or_create(&NodeLabel { node: node.clone() })
            .set(0);
        breaker
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

    /// `/status` view: health and the breaker of every node of `topology`, and `lua`, how
    /// the store runs its scripts.
    pub(crate) fn status(
        &self,
        topology: &Topology,
        connectivity: Connectivity,
        lua: &'static str,
    ) -> StoreStatus {
        let now = Instant::now();
        let breakers = self.breakers.load_full();
        let mut views: Vec<(Arc<str>, BreakerView)> = topology
            .nodes()
            .iter()
            .map(|node| {
                let view = breakers.get(&node.name).map_or(
                    BreakerView {
                        state: BreakerState::Closed,
                        failures: 0,
                        retry_in: None,
                    },
                    |breaker| breaker.view(now),
                );
                (node.name.clone(), view)
            })
            .collect();
        drop(breakers);
        views.sort_by(|a, b| a.0.cmp(&b.0));
        let open = views
            .iter()
            .filter(|(_, view)| view.state != BreakerState::Closed)
            .count();
        // A cluster with one primary down still serves the other shards: degraded.
        let health = if connectivity == Connectivity::None || (open > 0 && open == views.len()) {
            "down"
        } else if open > 0 || connectivity == Connectivity::Some {
            "degraded"
        } else {
            "ok"
        };
        let worst = views
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
            lua: Some(lua),
            regions: serde_json::Value::Null,
        }
    }

    /// Held while the breaker map is replaced.
    fn write(&self) -> MutexGuard<'_, ()> {
        self.writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Forget for Health {
    /// The last client of `node` is gone (it left a cluster's topology, or the store
    /// is dropped): its breaker and its gauge go too.
    fn forget(&self, node: &Arc<str>) {
        let _writer = self.write();
        let current = self.breakers.load_full();
        if !current.contains_key(node) {
            return;
        }
        let mut kept = HashMap::clone(&current);
        kept.remove(node);
        self.breakers.store(Arc::new(kept));
        self.metrics
            .breaker_state
            .remove(&NodeLabel { node: node.clone() });
    }
}
