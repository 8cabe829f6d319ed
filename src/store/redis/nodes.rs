//! Where each call goes: the fred client of the node that owns its hash slot.
//!
//! A standalone server or a Sentinel-managed primary is one node with one client (a
//! Sentinel primary's is replaced when the sentinels name another, see [`super::sentinel`]). A Redis
//! Cluster gets one client per primary, and Sluice routes by slot itself, from its own
//! copy of `CLUSTER SLOTS`. fred's clustered client cannot do this part: whenever one
//! connection breaks it rebuilds its connection to every primary of its slot map and
//! fails as a whole while any of them is unreachable, so one dead primary stopped every
//! shard until its replica was promoted. Here a dead primary fails only its own slots.
//!
//! The slot map is refreshed every [`REFRESH_EVERY`], and soon after a call fails or is
//! redirected ([`Nodes::suspect`]), but at most once per [`REFRESH_GAP`]. It is asked
//! of the known primaries first, then of the seed nodes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use fred::prelude::{Client, ClientLike, Config, EventInterface, Server, ServerConfig};
use fred::types::cluster::ClusterRouting;
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::runtime::Handle;
use tokio::sync::{watch, Notify};

use super::client::{self, log_connection_errors, RedisMode, RedisOptions};
use super::clients::{Clients, Node};
use super::functions::{NodeLua, Scripting};
use super::sentinel::{self, Primary};
use crate::store::StoreError;
use crate::telemetry::Metrics;

/// Longest age of a cluster's slot map when nothing fails.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Shortest time between two refreshes of the slot map.
pub(crate) const REFRESH_GAP: Duration = Duration::from_millis(25);

/// Deadline of one `CLUSTER SLOTS` question, connection included.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// Marks a slot no primary serves in [`Topology::owners`].
const UNOWNED: u16 = u16::MAX;

/// How much of the store is connected, worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Connectivity {
    /// No node is connected (or none is known yet).
    None,
    /// Some nodes are, or some slots have no node: their checks take the failure mode.
    Some,
    /// Every node is, and every slot has one.
    All,
}

/// Which node serves each slot, at one moment.
pub(crate) struct Topology {
    /// The nodes.
    nodes: Vec<Arc<Node>>,
    /// Per slot, the index of its node in `nodes`; empty when one node serves all.
    owners: Box<[u16]>,
}

impl Topology {
    /// The node serving `slot`, if any is known.
    pub(crate) fn route(&self, slot: u16) -> Option<&Arc<Node>> {
        if self.owners.is_empty() {
            return self.nodes.first();
        }
        let owner = *self.owners.get(usize::from(slot))?;
        self.nodes.get(usize::from(owner))
    }

    /// Every node.
    pub(crate) fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// The node named `name`, if it is known.
    fn node(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes.iter().find(|node| &*node.name == name)
    }
}

/// The nodes of one Redis store, kept current (see the module documentation).
pub(crate) struct Nodes {
    /// The current topology.
    topology: ArcSwap<Topology>,
    /// Wakes the refresher (cluster) or the sentinel follower early.
    wake: Option<Arc<Notify>>,
    /// Whether slots live on different nodes (a cluster).
    clustered: bool,
    /// Whether a slot map has been read (always, for a single node).
    known: watch::Sender<bool>,
    /// Makes the clients of new nodes.
    factory: NodeFactory,
    /// Held while a new topology is made from the current one, so that two changes
    /// (a refresh and a `MOVED`) never overwrite each other.
    writer: Mutex<()>,
    /// Refreshes so far: which primary to ask first.
    asked: AtomicUsize,
    /// The runtime the clients run on (a lane's): told to quit there when the nodes are
    /// dropped, since a client's router is a task of that runtime. If it has stopped,
    /// so have the connections.
    runtime: Handle,
}

impl Nodes {
    /// Starts the clients (in the background) and, for a cluster, the refresher; must be
    /// called inside a tokio runtime. Never waits for Redis: until a cluster's slot map
    /// is known, no slot has a node.
    pub(crate) fn connect(
        options: &RedisOptions,
        metrics: Arc<Metrics>,
        scripting: Arc<Scripting>,
        clients: Arc<Clients>,
    ) -> Result<Arc<Self>, StoreError> {
        let config = client::config(options)?;
        let factory = NodeFactory {
            config,
            options: options.clone(),
            metrics,
            scripting,
            clients,
        };
        if options.mode == RedisMode::Sentinel {
            return Ok(Self::follow_sentinels(factory));
        }
        if options.mode != RedisMode::Cluster {
            let node = factory.node(Arc::from("redis"), None)?;
            return Ok(Arc::new(Self {
                topology: ArcSwap::from_pointee(Topology {
                    nodes: vec![node],
                    owners: Box::default(),
                }),
                wake: None,
                clustered: false,
                known: watch::Sender::new(true),
                factory,
                writer: Mutex::new(()),
                asked: AtomicUsize::new(0),
                runtime: Handle::current(),
            }));
        }
        let wake = Arc::new(Notify::new());
        let nodes = Arc::new(Self {
            topology: ArcSwap::from_pointee(Topology {
                nodes: Vec::new(),
                owners: vec![UNOWNED; SLOTS].into_boxed_slice(),
            }),
            wake: Some(wake.clone()),
            clustered: true,
            known: watch::Sender::new(false),
            factory,
            writer: Mutex::new(()),
            asked: AtomicUsize::new(0),
            runtime: Handle::current(),
        });
        tokio::spawn(refresh(Arc::downgrade(&nodes), wake));
        Ok(nodes)
    }

    /// No node until the sentinels name the primary; the follower keeps it current.
    fn follow_sentinels(factory: NodeFactory) -> Arc<Self> {
        let (sentinels, service) = match &factory.config.server {
            ServerConfig::Sentinel {
                hosts,
                service_name,
            } => (hosts.clone(), service_name.clone()),
            _ => (Vec::new(), String::new()),
        };
        let watch = sentinel::Watch {
            sentinels,
            service,
            config: factory.config.clone(),
            options: factory.options.clone(),
        };
        let wake = Arc::new(Notify::new());
        let nodes = Arc::new(Self {
            topology: ArcSwap::from_pointee(Topology {
                nodes: Vec::new(),
                owners: Box::default(),
            }),
            wake: Some(wake.clone()),
            clustered: false,
            known: watch::Sender::new(false),
            factory,
            writer: Mutex::new(()),
            asked: AtomicUsize::new(0),
            runtime: Handle::current(),
        });
        tokio::spawn(sentinel::follow(Arc::downgrade(&nodes), watch, wake));
        nodes
    }

    /// The current topology.
    pub(crate) fn topology(&self) -> Guard<Arc<Topology>> {
        self.topology.load()
    }

    /// The current topology, to hold across awaits.
    pub(crate) fn topology_now(&self) -> Arc<Topology> {
        self.topology.load_full()
    }

    /// Waits, at most `limit`, until a cluster's first slot map is read (calls made at
    /// startup wait for it as they would for a connection, instead of failing at once).
    pub(crate) async fn wait_known(&self, limit: Duration) {
        if *self.known.borrow() {
            return;
        }
        // Boxed: the wait (a timer and a watch) is rare, and inline it would grow every
        // store call's future.
        let mut known = self.known.subscribe();
        let wait = tokio::time::timeout(limit, async move {
            let _ = known.wait_for(|known| *known).await;
        });
        let _ = Box::pin(wait).await;
    }

    /// Whether slots live on different nodes.
    pub(crate) fn clustered(&self) -> bool {
        self.clustered
    }

    /// A call on `slot` was answered `MOVED` to `server`: the slot map says so at once
    /// for that slot (with a client for `server` if it is new), so the call can be sent
    /// there, and the whole map is read again soon. `None` for a single node, or when
    /// no client can be made.
    pub(crate) fn moved(&self, slot: u16, server: Server) -> Option<Arc<Node>> {
        if !self.clustered {
            return None;
        }
        self.suspect();
        let _writer = lock(&self.writer);
        let current = self.topology.load_full();
        let mut nodes = current.nodes.clone();
        let index = self.find_or_add(&mut nodes, server)?;
        let node = nodes[index].clone();
        let mut owners = current.owners.clone();
        *owners.get_mut(usize::from(slot))? = u16::try_from(index).ok()?;
        self.topology.store(Arc::new(Topology { nodes, owners }));
        Some(node)
    }

    /// A call was answered `ASK` to `server` (its slot is being migrated there): the
    /// node to send it to, with `ASKING`. The slot map is unchanged; a `server` not
    /// known yet gets a client, kept with the others until the next refresh. `None` for
    /// a single node, or when no client can be made.
    pub(crate) fn migrating_to(&self, server: Server) -> Option<Arc<Node>> {
        if !self.clustered {
            return None;
        }
        let name = server.to_string();
        if let Some(node) = self.topology().node(&name) {
            return Some(node.clone());
        }
        let _writer = lock(&self.writer);
        let current = self.topology.load_full();
        let mut nodes = current.nodes.clone();
        let index = self.find_or_add(&mut nodes, server)?;
        let node = nodes[index].clone();
        let owners = current.owners.clone();
        self.topology.store(Arc::new(Topology { nodes, owners }));
        Some(node)
    }

    /// The index in `nodes` of the node at `server`, with a new client appended if none
    /// is there; `None` when the client cannot be made.
    fn find_or_add(&self, nodes: &mut Vec<Arc<Node>>, server: Server) -> Option<usize> {
        let name = server.to_string();
        if let Some(index) = nodes.iter().position(|node| *node.name == *name) {
            return Some(index);
        }
        nodes.push(self.factory.node(Arc::from(name), Some(server)).ok()?);
        Some(nodes.len() - 1)
    }

    /// A call failed or was redirected: the slot map (or the Sentinel primary) may be
    /// stale, look again soon.
    pub(crate) fn suspect(&self) {
        if let Some(wake) = &self.wake {
            wake.notify_one();
        }
    }

    /// How many of the nodes are connected: all (and every slot has one), some, or none.
    pub(crate) fn connectivity(&self) -> Connectivity {
        let topology = self.topology();
        let up = topology
            .nodes
            .iter()
            .filter(|node| node.client.is_connected())
            .count();
        if up == 0 {
            Connectivity::None
        } else if up == topology.nodes.len() && !topology.owners.contains(&UNOWNED) {
            Connectivity::All
        } else {
            Connectivity::Some
        }
    }
}

impl Primary for Nodes {
    /// The sentinels name `server` as the primary (`how`: a notice or an answer): unless
    /// it is the one served already, a client for it is made and connected (for at most
    /// [`sentinel::POLL_EVERY`]: one not connected by then still takes calls, which wait
    /// for it within their deadline), then takes every call, and the old one is closed.
    /// The new node has a breaker of its own: the old primary's failures do not keep
    /// calls from the new one.
    async fn follow_primary(&self, server: Server, how: &'static str) {
        let name = server.to_string();
        let current = self.topology.load_full();
        if current.nodes.iter().any(|node| *node.name == *name) {
            return;
        }
        let node = match self.factory.node(Arc::from(name.as_str()), Some(server)) {
            Ok(node) => node,
            Err(error) => {
                tracing::warn!(primary = %name, %error, "redis sentinel primary skipped");
                return;
            }
        };
        let _ = tokio::time::timeout(sentinel::POLL_EVERY, node.client.wait_for_connect()).await;
        let old = {
            let _writer = lock(&self.writer);
            let old = self.topology.load_full();
            self.topology.store(Arc::new(Topology {
                nodes: vec![node],
                owners: Box::default(),
            }));
            old
        };
        self.known.send_replace(true);
        let from = old.nodes.first().map(|node| node.name.clone());
        tracing::info!(
            from = from.as_deref().unwrap_or("none"),
            to = %name,
            how,
            "redis sentinel primary followed"
        );
        let gone = old.nodes.clone();
        if !gone.is_empty() {
            tokio::spawn(async move {
                // A batch may still hold the old topology.
                tokio::time::sleep(REFRESH_EVERY).await;
                for node in gone {
                    // A hung primary answers no QUIT: do not wait for it.
                    let _ = tokio::time::timeout(Duration::from_secs(1), node.client.quit()).await;
                }
            });
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let nodes = self.topology.load().nodes.clone();
        // Spawned where the clients run: a runtime that has stopped drops the task.
        self.runtime.spawn(async move {
            for node in nodes {
                close(&node.client).await;
            }
        });
    }
}

/// Builds the client of a node.
struct NodeFactory {
    /// The parsed URL: credentials, TLS, database, and for a cluster the seeds.
    config: Config,
    /// Timeouts and the rest.
    options: RedisOptions,
    /// Where connection errors are counted.
    metrics: Arc<Metrics>,
    /// Where each node's [`NodeLua`] comes from (told of every connection its client
    /// makes, see [`NodeLua::connected`]).
    scripting: Arc<Scripting>,
    /// Where every backend's clients are registered.
    clients: Arc<Clients>,
}

impl NodeFactory {
    /// A node named `name`: at `server` (a cluster primary) or where the URL points.
    fn node(&self, name: Arc<str>, server: Option<Server>) -> Result<Arc<Node>, StoreError> {
        let config = match server {
            Some(server) => client::node_config(&self.config, server),
            None => self.config.clone(),
        };
        let client = client::connect(config, &self.options)?;
        log_connection_errors(&client, self.options.timeout, self.metrics.clone());
        let lua = self.scripting.node(&name);
        tokio::spawn(tell_connections(
            client.reconnect_rx(),
            lua.clone(),
            name.clone(),
        ));
        Ok(Node::new(name, client, lua, &self.clients))
    }
}

/// Tells `lua` of every connection the client of `node` makes (`connections`, fred's
/// notifications), until the client is dropped. Missed notifications (the channel
/// lagged) were connections too. fred's own `on_reconnect` listener would stop at the
/// first lag.
async fn tell_connections(
    mut connections: tokio::sync::broadcast::Receiver<Server>,
    lua: Arc<NodeLua>,
    node: Arc<str>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match connections.recv().await {
            Ok(_) | Err(RecvError::Lagged(_)) => lua.connected(&node),
            Err(RecvError::Closed) => return,
        }
    }
}

/// Keeps a cluster's topology current until the store is dropped.
async fn refresh(nodes: Weak<Nodes>, wake: Arc<Notify>) {
    let Some(seeds) = nodes
        .upgrade()
        .map(|nodes| client::seeds(&nodes.factory.config))
    else {
        return;
    };
    loop {
        let Some(strong) = nodes.upgrade() else {
            return;
        };
        let refreshed = refresh_once(&strong, &seeds).await;
        drop(strong);
        tokio::time::sleep(REFRESH_GAP).await;
        let wait = if refreshed {
            REFRESH_EVERY
        } else {
            REFRESH_GAP
        };
        let _ = tokio::time::timeout(wait, wake.notified()).await;
    }
}

/// Asks the known primaries, then the seeds, for the slot map, and installs the first
/// answer. Returns whether one came.
async fn refresh_once(nodes: &Nodes, seeds: &[Server]) -> bool {
    let factory = &nodes.factory;
    let current = nodes.topology.load_full();
    // Start with a different primary each time: one that lags behind a failover (or is
    // paused by it) must not be the only one asked.
    let start = nodes.asked.fetch_add(1, Ordering::Relaxed);
    let count = current.nodes().len();
    for offset in 0..count {
        let node = &current.nodes()[(start + offset) % count];
        if let Some(routing) = ask(&node.client, &node.name).await {
            install(nodes, &routing);
            return true;
        }
    }
    for seed in seeds {
        let config = client::node_config(&factory.config, seed.clone());
        let Ok(client) = client::connect(config, &factory.options) else {
            continue;
        };
        let connected = tokio::time::timeout(ASK_TIMEOUT, client.wait_for_connect()).await;
        let routing = match connected {
            Ok(Ok(())) => ask(&client, &seed.host).await,
            _ => None,
        };
        close(&client).await;
        if let Some(routing) = routing {
            install(nodes, &routing);
            return true;
        }
    }
    false
}

/// `CLUSTER SLOTS` through `client`; `host` stands for the node in entries that leave
/// it out.
async fn ask(client: &Client, host: &str) -> Option<ClusterRouting> {
    let command = CustomCommand::new_static("CLUSTER", ClusterHash::Random, false);
    let reply = tokio::time::timeout(
        ASK_TIMEOUT,
        client.custom::<Value, _>(command, vec!["SLOTS"]),
    )
    .await
    .ok()?
    .ok()?;
    let host = host.rsplit_once(':').map_or(host, |(host, _)| host);
    let routing = ClusterRouting::from_cluster_slots(reply, host).ok()?;
    (!routing.slots().is_empty()).then_some(routing)
}

/// Makes `routing` the topology: nodes that stay keep their client, new primaries get
/// one, and the clients of nodes that no longer serve a slot are closed a little later
/// (a batch may still hold the old topology).
fn install(nodes: &Nodes, routing: &ClusterRouting) {
    let _writer = lock(&nodes.writer);
    let current = nodes.topology.load_full();
    let factory = &nodes.factory;
    let mut next: Vec<Arc<Node>> = Vec::new();
    let mut index: HashMap<Server, u16> = HashMap::new();
    let mut owners = vec![UNOWNED; SLOTS].into_boxed_slice();
    for range in routing.slots() {
        let owner = match index.get(&range.primary) {
            Some(&owner) => owner,
            None => {
                let name: Arc<str> = Arc::from(range.primary.to_string());
                let node = match current.node(&name) {
                    Some(node) => node.clone(),
                    None => match factory.node(name, Some(range.primary.clone())) {
                        Ok(node) => node,
                        Err(error) => {
                            tracing::warn!(node = %range.primary, %error, "redis cluster node skipped");
                            continue;
                        }
                    },
                };
                let owner = u16::try_from(next.len()).unwrap_or(UNOWNED);
                next.push(node);
                index.insert(range.primary.clone(), owner);
                owner
            }
        };
        let end = usize::from(range.end).min(SLOTS - 1);
        for slot in usize::from(range.start)..=end {
            owners[slot] = owner;
        }
    }
    let same = next.len() == current.nodes.len()
        && next
            .iter()
            .zip(&current.nodes)
            .all(|(a, b)| Arc::ptr_eq(a, b))
        && owners == current.owners;
    if same {
        return;
    }
    let gone: Vec<Arc<Node>> = current
        .nodes
        .iter()
        .filter(|node| !next.iter().any(|kept| Arc::ptr_eq(kept, node)))
        .cloned()
        .collect();
    tracing::info!(
        primaries = next.len(),
        removed = gone.len(),
        "redis cluster slot map changed"
    );
    nodes.topology.store(Arc::new(Topology {
        nodes: next,
        owners,
    }));
    nodes.known.send_replace(true);
    if !gone.is_empty() {
        tokio::spawn(async move {
            tokio::time::sleep(REFRESH_EVERY).await;
            for node in gone {
                close(&node.client).await;
            }
        });
    }
}

/// Closes `client`, waiting at most [`ASK_TIMEOUT`] for Redis to take the `QUIT` (a node
/// that does not answer must not keep its client, and its breaker, alive).
async fn close(client: &Client) {
    let _ = tokio::time::timeout(ASK_TIMEOUT, client.quit()).await;
}

/// Locks `mutex`, whose guarded data (none) cannot be left inconsistent by a panic.
fn lock(mutex: &Mutex<()>) -> MutexGuard<'_, ()> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
