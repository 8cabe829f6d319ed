//! One script call on one node: sending it (`FCALL` or `EVALSHA`) under a deadline,
//! loading the Lua code where the node lacks it, following a cluster's MOVED and ASK,
//! feeding the node's breaker. The batcher ([`super::batcher`]) and leases
//! ([`super::lease`]) send their calls through here; [`warm_up`] readies every node
//! before serving.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::{ClientLike, LuaInterface};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::time;

use super::client::{classify, is_noscript, redirect_of, Redirect};
use super::clients::Node;
use super::functions::{self, Lua, LIBRARY};
use super::health::Health;
use super::nodes::Nodes;
use super::script::{self, Call};
use crate::algorithm::Decision;
use crate::store::redis::links::RegionLinks;
use crate::store::{KeyPrefix, StoreError};
use crate::telemetry::Metrics;

/// What every call of a backend (one lane's, or the main one) needs: its nodes, the
/// shared breakers, its deadline and batching limits, metrics.
pub(crate) struct Shared {
    /// The node of each slot, with its client.
    pub(crate) nodes: Arc<Nodes>,
    /// Circuit breakers, fed with every script call's outcome (shared by every lane).
    pub(crate) health: Arc<Health>,
    /// Deadline of one batch's round trip.
    pub(crate) timeout: Duration,
    /// Longest wait for more jobs.
    pub(crate) window: Duration,
    /// Most checks in one batch.
    pub(crate) max: usize,
    /// Batch size and store metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Written before every key, so deployments sharing a Redis count apart.
    pub(crate) key_prefix: KeyPrefix,
    /// The other regions aggregated limits count, if any.
    pub(crate) regions: Option<Arc<RegionLinks>>,
}

#[cfg(feature = "test-hooks")]
/// Runs `calls` of the main script at once, each on the node of its slot and within the
/// store's call deadline from now (see [`run_call`]).
pub(crate) async fn run_calls(
    shared: &Shared,
    calls: &[Call],
) -> Vec<Result<Vec<Decision>, StoreError>> {
    let topology = shared.nodes.topology_now();
    let deadline = Instant::now() + shared.timeout;
    futures::future::join_all(
        calls.iter().map(|call| {
            run_decisions(shared, topology.route(call.slot()).cloned(), call, deadline)
        }),
    )
    .await
}

/// Makes every known node ready for the first real call, within `limit`: waits for the
/// slot map, then sends each node a script call with no checks, which connects its
/// client, loads the function library (or the script) and builds the Lua helpers. A
/// node that misses `limit` is left as it is: its first call does the same.
pub(crate) async fn warm_up(shared: &Shared, limit: Duration) {
    let deadline = Instant::now() + limit;
    shared.nodes.wait_known(limit).await;
    let topology = shared.nodes.topology_now();
    let nothing = Call::new(&shared.key_prefix, std::iter::empty(), false, None, None);
    let nodes = topology.nodes().iter().map(|node| {
        let node = node.clone();
        let nothing = &nothing;
        // A client still connecting is waited for by the call itself, within the deadline.
        async move {
            let _ = run_decisions(shared, Some(node), nothing, deadline).await;
        }
    });
    futures::future::join_all(nodes).await;
}

/// [`run_call`] of the main script: one decision per limit.
pub(crate) async fn run_decisions(
    shared: &Shared,
    node: Option<Arc<Node>>,
    call: &Call,
    deadline: Instant,
) -> Result<Vec<Decision>, StoreError> {
    run_call(shared, node, call, deadline, |reply| {
        script::decode(&reply, call.limits)
    })
    .await
}

/// One script call on `node` (none: no node serves its slot), its reply turned into a
/// `T` by `decode`. An answer that the node lacks the script or the function library
/// loads it on that node and runs the call again; a node that refuses functions is sent
/// `EVALSHA` until a connection to it is made again ([`functions`]), this call first; a
/// MOVED answer sends it once more to the node named, and an ASK answer (its slot is
/// being migrated) sends it there after `ASKING` on the same connection. In each case
/// it did not run, so nothing is charged twice; every step ends by `deadline`, and a
/// call is redirected once at most. Feeds the node's breaker, and asks for a fresh slot
/// map when the call fails.
pub(crate) async fn run_call<T>(
    shared: &Shared,
    node: Option<Arc<Node>>,
    call: &Call,
    deadline: Instant,
    decode: impl Fn(Value) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let Some(node) = node else {
        shared.nodes.suspect();
        return Err(unrouted(call.slot()));
    };
    // A redirected call did not run: it is sent once more, to the node named.
    let mut node = node;
    let mut asking = false;
    let mut redirected = false;
    let result = loop {
        let attempt = match call_loading(shared, &node, call, asking, deadline).await {
            Err(Failure::NoFunctions(reason)) => {
                node.lua.fall_back(&node.name, &reason);
                call_loading(shared, &node, call, asking, deadline).await
            }
            other => other,
        };
        match attempt {
            Err(Failure::Redirected(redirect)) if !redirected => {
                let target = match &redirect {
                    Redirect::Moved(server) => shared.nodes.moved(call.slot(), server.clone()),
                    Redirect::Ask(server) => shared.nodes.migrating_to(server.clone()),
                };
                let Some(target) = target else {
                    break Err(Failure::Redirected(redirect));
                };
                node = target;
                asking = matches!(redirect, Redirect::Ask(_));
                redirected = true;
            }
            other => break other.and_then(|reply| decode(reply).map_err(Failure::Store)),
        }
    };
    // A redirect says where the slot is, not that the node is unwell: no breaker count.
    let redirected_again = matches!(result, Err(Failure::Redirected(_)));
    let result = result.map_err(|failure| match failure {
        Failure::NoScript => {
            StoreError::Unavailable("script or function missing after loading it".into())
        }
        Failure::NoFunctions(reason) => StoreError::Protocol(format!("redis functions: {reason}")),
        Failure::Redirected(Redirect::Moved(server)) => {
            StoreError::Unavailable(format!("redirected (MOVED) to {server}"))
        }
        Failure::Redirected(Redirect::Ask(server)) => {
            StoreError::Unavailable(format!("redirected (ASK) to {server}"))
        }
        Failure::Store(error) => error,
    });
    if !redirected_again {
        shared
            .health
            .record(&node.name, result.as_ref().map(|_| ()));
    }
    if result.is_err() {
        shared.nodes.suspect();
    }
    result
}

/// [`run_call`] of a call made on its own, outside the batcher (a lease, a hold, the
/// region exchange): on the node its slot is routed to now.
pub(crate) async fn run_alone<T>(
    shared: &Shared,
    call: &Call,
    deadline: Instant,
    decode: impl Fn(Value) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let node = shared.nodes.topology().route(call.slot()).cloned();
    run_call(shared, node, call, deadline, decode).await
}

/// One call on `node`; if the node lacks its script or function library, the call
/// again once that is loaded, within the same deadline.
async fn call_loading(
    shared: &Shared,
    node: &Node,
    call: &Call,
    asking: bool,
    deadline: Instant,
) -> Result<Value, Failure> {
    match one_call(shared, node, call, asking, deadline).await {
        Err(Failure::NoScript) => {
            match time::timeout_at(deadline.into(), load(shared, node, call)).await {
                Ok(Ok(())) => one_call(shared, node, call, asking, deadline).await,
                Ok(Err(failure)) => Err(failure),
                Err(_) => Err(Failure::Store(StoreError::Timeout(shared.timeout))),
            }
        }
        other => other,
    }
}

/// Loads what `call` runs on `node`: the function library (`FUNCTION LOAD`; loaded
/// already by another lane or instance counts as loaded) or its script (`SCRIPT LOAD`).
async fn load(shared: &Shared, node: &Node, call: &Call) -> Result<(), Failure> {
    let failed = |error: &fred::error::Error| Failure::Store(classify(error, shared.timeout));
    if node.lua.current() == Lua::Scripts {
        return match node
            .client
            .script_load::<String, _>(call.entry.script())
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => Err(failed(&error)),
        };
    }
    let command = CustomCommand::new_static("FUNCTION", ClusterHash::Custom(call.slot()), false);
    let args = vec![Value::from_static_str("LOAD"), LIBRARY.code.clone()];
    match node.client.custom::<Value, _>(command, args).await {
        Ok(_) => Ok(()),
        Err(error) if functions::already_loaded(error.details()) => Ok(()),
        Err(error) if functions::refuses_library(error.details()) => {
            Err(Failure::NoFunctions(error.details().to_owned()))
        }
        Err(error) => Err(failed(&error)),
    }
}

/// The error of a call whose slot no known node serves (a cluster's slot map not read
/// yet, or a slot left without a primary).
pub(crate) fn unrouted(slot: u16) -> StoreError {
    StoreError::Unavailable(format!(
        "no redis node serves slot {slot} (slot map not known yet)"
    ))
}

/// Why one call of a pipeline failed.
enum Failure {
    /// The node does not have the script, or the function library.
    NoScript,
    /// The node takes no functions (the reply saying so): send `EVALSHA` instead.
    NoFunctions(String),
    /// The slot lives on another node now, or is being migrated to it (the call did
    /// not run).
    Redirected(Redirect),
    /// Anything else.
    Store(StoreError),
}

/// One script call on `node`, ended by `deadline`: in a cluster, a call to a dead or
/// moved shard fails alone, never the calls of other shards in the same batch. With
/// `asking`, `ASKING` goes first on the same connection (the node is importing the
/// call's slot).
async fn one_call(
    shared: &Shared,
    node: &Node,
    call: &Call,
    asking: bool,
    deadline: Instant,
) -> Result<Value, Failure> {
    // fred reads a zero timeout as none: a call with no time left is not sent.
    let Some(left) = deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
    else {
        return Err(Failure::Store(StoreError::Timeout(shared.timeout)));
    };
    let options = Options {
        timeout: Some(left),
        ..Options::default()
    };
    let client = node.client.with_options(&options);
    // No typed FCALL or EVALSHA with raw arguments: sent as a custom command.
    let lua = node.lua.current();
    let (name, script) = lua.command(call.entry);
    let command = CustomCommand::new_static(name, ClusterHash::Custom(call.slot()), false);
    let mut args = Vec::with_capacity(1 + call.args.len());
    args.push(script.clone());
    args.extend(call.args.iter().cloned());
    let attempt = async {
        if asking {
            // Boxed: the rare path does not grow every call's future.
            return Box::pin(call_asking(node, command, call.slot(), args)).await;
        }
        client.custom::<Value, _>(command, args).await
    };
    let reply = if node.client.is_connected() && !asking {
        // Nearly every call: fred's timeout for this command, the time left before the
        // deadline, bounds it; the only timer of the call.
        Ok(attempt.await)
    } else {
        // Boxed, as rare. A node's client made a moment ago (a new primary, a redirect)
        // may still be connecting: wait for the connection, and the call, within the
        // deadline.
        Box::pin(time::timeout_at(deadline.into(), async {
            if !node.client.is_connected() {
                let _ = node.client.wait_for_connect().await;
            }
            attempt.await
        }))
        .await
    };
    match reply {
        Err(_) => Err(Failure::Store(StoreError::Timeout(shared.timeout))),
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error))
            if is_noscript(&error) || functions::is_function_missing(error.details()) =>
        {
            Err(Failure::NoScript)
        }
        Ok(Err(error))
            if lua == Lua::Functions && functions::refuses_functions(error.details()) =>
        {
            Err(Failure::NoFunctions(error.details().to_owned()))
        }
        Ok(Err(error)) => match redirect_of(&error) {
            Some(redirect) => Err(Failure::Redirected(redirect)),
            None => Err(Failure::Store(classify(&error, shared.timeout))),
        },
    }
}

/// `ASKING` then `command`, written back to back on `node`'s connection (a pipeline),
/// so that the node takes the command for a slot it is importing; the command's reply.
async fn call_asking(
    node: &Node,
    command: CustomCommand,
    slot: u16,
    args: Vec<Value>,
) -> Result<Value, fred::error::Error> {
    let asking = CustomCommand::new_static("ASKING", ClusterHash::Custom(slot), false);
    let pipeline = node.client.pipeline();
    pipeline
        .custom::<(), _>(asking, Vec::<Value>::new())
        .await?;
    pipeline.custom::<(), _>(command, args).await?;
    let mut replies = pipeline.try_all::<Value>().await;
    replies.pop().unwrap_or_else(|| {
        Err(fred::error::Error::new(
            fred::error::ErrorKind::Protocol,
            "no reply to a pipelined script call",
        ))
    })
}
