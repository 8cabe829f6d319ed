//! The clients of each Redis node: one per backend (the main one and each lane's), all
//! known here by node name, so that a node whose connection stopped answering is
//! reconnected on every backend at once, and so that the store forgets a node (its
//! breaker and that breaker's metric series) as soon as no client of it is left.
//!
//! Why reconnect by hand: fred drops a connection only when the socket fails. A link
//! that takes bytes and never answers (a half-open TCP connection behind a dead
//! middlebox, a peer frozen with its socket open) leaves every call to time out on the
//! same connection forever, and the breaker's probes with them. A breaker that opens
//! on timeouts is the sign; [`Clients::reconnect`] is the cure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use fred::prelude::{Client, ClientLike};

use super::functions::NodeLua;

/// Longest wait for one forced reconnection; a node still unreachable after it is
/// reconnected by fred's own policy meanwhile, and may be forced again.
const RECONNECT_WAIT: Duration = Duration::from_secs(2);

/// One node and one backend's client of it.
pub(crate) struct Node {
    /// `host:port` (`redis` for a standalone server or a Sentinel primary): breakers,
    /// logs and `/status` name the node by it.
    pub(crate) name: Arc<str>,
    /// Its own client (its connections are its own: a dead node does not stall others).
    pub(crate) client: Client,
    /// How its calls are sent, shared with the other lanes' clients of the node.
    pub(crate) lua: Arc<NodeLua>,
    /// Set while a forced reconnection is under way: at most one at a time per client.
    reconnecting: Arc<AtomicBool>,
    /// Told when this client is dropped.
    clients: Arc<Clients>,
}

// === impl Node ===

impl Node {
    /// Registers `client` of node `name` with `clients`.
    pub(crate) fn new(
        name: Arc<str>,
        client: Client,
        lua: Arc<NodeLua>,
        clients: &Arc<Clients>,
    ) -> Arc<Self> {
        let node = Arc::new(Self {
            name,
            client,
            lua,
            reconnecting: Arc::default(),
            clients: clients.clone(),
        });
        let mut by_node = clients.lock();
        let list = by_node.entry(node.name.clone()).or_default();
        list.retain(|client| client.strong_count() > 0);
        list.push(Arc::downgrade(&node));
        node
    }

    /// Drops this client's connection and makes a new one, in the background; whether
    /// it did (not if one is under way, nor if the client is not connected: fred is
    /// then connecting already). Calls in flight on it fail; they are not sent again.
    fn reconnect(&self) -> bool {
        if !self.client.is_connected() || self.reconnecting.swap(true, Ordering::AcqRel) {
            return false;
        }
        let client = self.client.clone();
        let reconnecting = self.reconnecting.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(RECONNECT_WAIT, client.force_reconnection()).await;
            reconnecting.store(false, Ordering::Release);
        });
        true
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.clients.dropped(&self.name);
    }
}

/// What to do when the last client of a node is gone (the store's breakers implement
/// it: forget the node's breaker and its gauge).
pub(crate) trait Forget: Send + Sync {
    /// No client of `node` is left.
    fn forget(&self, node: &Arc<str>);
}

/// Every backend's clients, by node name (see the module documentation).
#[derive(Default)]
pub(crate) struct Clients {
    /// Weak: a client lives as long as some backend's topology (or a call) holds it.
    by_node: Mutex<HashMap<Arc<str>, Vec<Weak<Node>>>>,
    /// Told of nodes that have no client left; set once, when the store is made.
    forget: OnceLock<Weak<dyn Forget>>,
}

// === impl Clients ===

impl Clients {
    /// Who is told when a node has no client left.
    pub(crate) fn on_forget(&self, forget: Weak<dyn Forget>) {
        let _ = self.forget.set(forget);
    }

    /// Reconnects every backend's client of `node` that is connected (a forced
    /// reconnection each, in the background), with one log line if any was.
    pub(crate) fn reconnect(&self, node: &str) {
        let live: Vec<Arc<Node>> = self
            .lock()
            .get(node)
            .map(|list| list.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        let reconnected = live.iter().filter(|client| client.reconnect()).count();
        if reconnected > 0 {
            tracing::warn!(
                node,
                clients = reconnected,
                "redis node stopped answering on its connections: reconnecting"
            );
        }
        // `live` is dropped here, outside the lock: the last reference to a client
        // runs its `Drop`, which takes the lock.
    }

    /// A client of `node` was dropped: forgets the node if it was the last. Under the
    /// lock, so that a client of the same node made meanwhile is never forgotten.
    fn dropped(&self, node: &Arc<str>) {
        let mut by_node = self.lock();
        let Some(list) = by_node.get_mut(node) else {
            return;
        };
        list.retain(|client| client.strong_count() > 0);
        if !list.is_empty() {
            return;
        }
        by_node.remove(node);
        if let Some(forget) = self.forget.get().and_then(Weak::upgrade) {
            forget.forget(node);
        }
    }

    /// The map, whose lists stay valid across a panic.
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Vec<Weak<Node>>>> {
        self.by_node
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
