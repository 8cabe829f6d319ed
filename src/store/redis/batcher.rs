//! The batcher: checks from concurrent requests share script calls and round trips.
//!
//! Requests put a job on a bounded queue (full: the call fails at once with
//! [`StoreError::Unavailable`], and the rule's failure mode answers). One collector task
//! takes the first job, then, while other calls are queued or batches in flight, keeps taking jobs for
//! at most `batch_window` or until `batch_max` checks (a lone call with none in flight
//! goes at once: an idle Redis is never kept waiting), groups the checks by hash slot (a standalone or Sentinel server
//! is one group), and makes one script call per group, which decides that group's
//! checks in arrival order (checks on the same key coalesce into that call). All calls
//! of a batch go out at once (fred pipelines them on each node's connection), each with
//! its own deadline and outcome; each goes to the client of its slot's node
//! ([`super::nodes`]), so a request whose descriptors live on several shards is split
//! across nodes in parallel and answered when every part has returned, and a failed
//! shard fails only its own calls. At most [`MAX_IN_FLIGHT`] batches are in
//! flight; while they are, the queue absorbs new jobs, which is what makes batches
//! grow under load.
//!
//! Every job is answered by its deadline: one that expires while it waits for room
//! among the batches in flight is answered with a timeout then and there, and each
//! script call runs under the earliest deadline of the jobs it carries, so a call that
//! is late fails them all by the first one's deadline (the others' a little early, by
//! at most the time they queued apart). That is one timer per script call, fred's
//! command timeout: each timer registered on a runtime with none pending costs tokio
//! a driver wakeup (an `eventfd` write and an extra `epoll_wait`), and a second timer
//! per batch for the jobs' deadlines cost one caller ~15 µs of its p50.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::{ClientLike, LuaInterface};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time;

use super::client::{classify, is_noscript, redirect_of, Redirect};
use super::functions::{self, Lua, LIBRARY};
use super::nodes::{Node, Nodes};
use super::script::{self, Call};
use crate::algorithm::Decision;
use crate::store::{StoreCheck, StoreError};
use crate::telemetry::Metrics;

/// Most batches in flight at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// Jobs a batch vector first has room for.
const TYPICAL_BATCH: usize = 16;

/// A request's checks waiting for a batch.
pub struct Job {
    /// The checks, in request order.
    pub checks: Vec<StoreCheck>,
    /// Charge (`true`) or peek.
    pub commit: bool,
    /// The caller's decisions so far; the job's (one per limit, in order) are appended
    /// and the vector goes back through `reply`.
    pub decisions: Vec<Decision>,
    /// Where the decisions go, with the outcome; taken when answered. Closed
    /// when the caller gave up (its own deadline): such a job is never sent.
    pub reply: Option<oneshot::Sender<JobAnswer>>,
    /// By this instant the job is answered: past it, it is not sent, and if its batch
    /// is still out it is answered with a timeout.
    pub deadline: Instant,
}

/// A job's answer: its decisions vector (filled where its checks were decided) and
/// the outcome: an error, or [`StoreError::Partly`] when only some checks failed.
pub type JobAnswer = (Vec<Decision>, Result<(), StoreError>);

impl Job {
    /// Answers the job, if it is not answered yet.
    fn answer(&mut self, outcome: Result<(), StoreError>) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send((std::mem::take(&mut self.decisions), outcome));
        }
    }

    /// Answers with a timeout (the store's call deadline, `timeout`) if the job's
    /// deadline has passed at `now`; whether it had.
    fn expire_at(&mut self, now: Instant, timeout: Duration) -> bool {
        let expired = self.deadline <= now;
        if expired {
            self.answer(Err(StoreError::Timeout(timeout)));
        }
        expired
    }

    /// Whether the caller still waits for an answer.
    fn awaited(&self) -> bool {
        self.reply.as_ref().is_some_and(|reply| !reply.is_closed())
    }
}

/// Hash slot of a check's keys (all limits of a descriptor share it); 0 where one node
/// serves every slot (standalone, Sentinel), which spares the CRC.
pub fn slot_of(nodes: &Nodes, check: &StoreCheck) -> u16 {
    if nodes.clustered() {
        script::slot(check.key)
    } else {
        0
    }
}

/// What every batch needs.
pub struct Shared {
    /// The node of each slot, with its client.
    pub nodes: Arc<Nodes>,
    /// Circuit breakers, fed with every script call's outcome (shared by every lane).
    pub health: Arc<super::health::Health>,
    /// Deadline of one batch's round trip.
    pub timeout: Duration,
    /// Longest wait for more jobs.
    pub window: Duration,
    /// Most checks in one batch.
    pub max: usize,
    /// Batch size and store metrics.
    pub metrics: Arc<Metrics>,
}

/// Collects jobs into batches until every sender is gone (the store was dropped).
pub async fn collect(mut jobs: mpsc::Receiver<Job>, shared: Arc<Shared>) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some(mut first) = jobs.recv().await {
        // No room among the batches in flight: wait, but not past the job's deadline
        // (no timer at all when there is room).
        let permit = match time::timeout_at(
            first.deadline.into(),
            in_flight.clone().acquire_owned(),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_closed)) => return,
            Err(_elapsed) => {
                first.expire_at(Instant::now(), shared.timeout);
                continue;
            }
        };
        let mut size = first.checks.len();
        // Sized for the jobs already queued (at least a typical batch), so it seldom grows.
        let mut batch = Vec::with_capacity((jobs.len() + 1).max(TYPICAL_BATCH).min(shared.max));
        batch.push(first);
        // A lone call with no batch in flight finds Redis idle: waiting would only add
        // latency (one caller would pay the whole window on every call), so it goes at
        // once. When other calls are queued or batches are in flight, more are coming,
        // and the window gathers them.
        let busy = !jobs.is_empty() || in_flight.available_permits() + 1 < MAX_IN_FLIGHT;
        let window = if busy { shared.window } else { Duration::ZERO };
        let deadline = Instant::now() + window;
        while size < shared.max {
            match jobs.try_recv() {
                Ok(job) => {
                    size += job.checks.len();
                    batch.push(job);
                }
                Err(TryRecvError::Empty) if Instant::now() < deadline => {
                    tokio::task::yield_now().await;
                }
                Err(_) => break,
            }
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            run_batch(&shared, batch).await;
            drop(permit);
        });
    }
}

/// Sends one batch and answers its jobs. Jobs whose caller has given up are dropped
/// first: nothing is charged for an answer nobody waits for.
async fn run_batch(shared: &Shared, mut jobs: Vec<Job>) {
    let now = Instant::now();
    jobs.retain_mut(|job| job.awaited() && !job.expire_at(now, shared.timeout));
    if jobs.is_empty() {
        return;
    }
    // (commit, slot) → the checks of that group, in arrival order: (job, check, where the
    // check's decisions go in its job's vector). Each job's vector gets room for one
    // decision per limit, after what its caller had there.
    let mut index: HashMap<(bool, u16), usize> = HashMap::new();
    let mut groups: Vec<Vec<Member>> = Vec::new();
    let mut commits: Vec<bool> = Vec::new();
    // Per group: the earliest deadline of its jobs, its script call's deadline.
    let mut deadlines: Vec<Instant> = Vec::new();
    let total: usize = jobs.iter().map(|job| job.checks.len()).sum();
    let mut placed = 0;
    for (j, job) in jobs.iter_mut().enumerate() {
        let mut at = job.decisions.len();
        for (c, check) in job.checks.iter().enumerate() {
            let slot = slot_of(&shared.nodes, check);
            let group = *index.entry((job.commit, slot)).or_insert_with(|| {
                // Room for every check still to place: one group (a single node) never grows.
                groups.push(Vec::with_capacity(total - placed));
                commits.push(job.commit);
                deadlines.push(job.deadline);
                groups.len() - 1
            });
            deadlines[group] = deadlines[group].min(job.deadline);
            groups[group].push(Member {
                job: j,
                check: c,
                at,
            });
            placed += 1;
            at += check.limits.len();
        }
        job.decisions.resize(at, Decision::default());
    }
    shared.metrics.batch_size.observe(total as f64);
    let calls: Vec<Call> = groups
        .iter()
        .zip(&commits)
        .map(|(members, commit)| {
            Call::new(
                members.iter().map(|m| &jobs[m.job].checks[m.check]),
                *commit,
                None,
            )
        })
        .collect();
    // Each job is answered as soon as every call it has a check in is back, so a job
    // never waits on a slower shard it does not touch.
    let topology = shared.nodes.topology_now();
    let mut pending: FuturesUnordered<_> = calls
        .iter()
        .enumerate()
        .map(|(group, call)| {
            let node = topology.route(call.slot()).cloned();
            let deadline = deadlines[group];
            async move { (group, run_decisions(shared, node, call, deadline).await) }
        })
        .collect();
    drop(topology);
    // Per job: its failed checks with the first error, and the number of its checks
    // not back yet.
    let mut failures: Vec<Option<Failed>> = (0..jobs.len()).map(|_| None).collect();
    let mut waiting: Vec<usize> = jobs.iter().map(|job| job.checks.len()).collect();
    // Each call ends by its deadline, which no job of its group is past: a job is
    // answered by its own once every call it has a check in is back.
    while let Some((group, result)) = pending.next().await {
        let members = &groups[group];
        match result {
            Ok(decisions) => {
                let mut rest = decisions.as_slice();
                for member in members {
                    let job = &mut jobs[member.job];
                    let n = job.checks[member.check].limits.len();
                    let (mine, tail) = rest.split_at(n.min(rest.len()));
                    rest = tail;
                    if mine.len() < n {
                        let error =
                            StoreError::Protocol("script reply shorter than its checks".into());
                        Failed::add(&mut failures[member.job], member.check, || error);
                    } else {
                        job.decisions[member.at..member.at + n].copy_from_slice(mine);
                    }
                }
            }
            Err(error) => {
                for member in members {
                    Failed::add(&mut failures[member.job], member.check, || error.clone());
                }
            }
        }
        for member in members {
            let j = member.job;
            waiting[j] -= 1;
            if waiting[j] == 0 {
                let job = &mut jobs[j];
                let outcome = match failures[j].take() {
                    None => Ok(()),
                    // A check of another shard was decided: say which failed.
                    Some(failed) if failed.checks.len() < job.checks.len() => Err(failed.partly()),
                    Some(failed) => Err(failed.error),
                };
                job.answer(outcome);
            }
        }
    }
}

/// A job's checks that failed, and the first error among them.
struct Failed {
    /// Indexes of the failed checks in the job.
    checks: Vec<usize>,
    /// The first failure.
    error: StoreError,
}

impl Failed {
    /// Records that check `check` of a job failed with `error()`.
    fn add(failed: &mut Option<Failed>, check: usize, error: impl FnOnce() -> StoreError) {
        match failed {
            Some(failed) => failed.checks.push(check),
            None => {
                *failed = Some(Failed {
                    checks: vec![check],
                    error: error(),
                })
            }
        }
    }

    /// The error of a job whose other checks were decided.
    fn partly(mut self) -> StoreError {
        self.checks.sort_unstable();
        StoreError::Partly {
            failed: self.checks,
            error: Box::new(self.error),
        }
    }
}

/// One check of a batch's script call.
struct Member {
    /// Its job, by index in the batch.
    job: usize,
    /// Its index among that job's checks.
    check: usize,
    /// Where its decisions go in the job's vector.
    at: usize,
}

/// Runs `calls` of the main script at once, each on the node of its slot and within the
/// store's call deadline from now (see [`run_call`]).
pub async fn run_calls(shared: &Shared, calls: &[Call]) -> Vec<Result<Vec<Decision>, StoreError>> {
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
pub async fn warm_up(shared: &Shared, limit: Duration) {
    let deadline = Instant::now() + limit;
    shared.nodes.wait_known(limit).await;
    let topology = shared.nodes.topology_now();
    let nothing = Call::new(std::iter::empty(), false, None);
    let nodes = topology.nodes().iter().map(|node| {
        let node = node.clone();
        let nothing = &nothing;
        async move {
            if !node.client.is_connected() {
                let _ = time::timeout_at(deadline.into(), node.client.wait_for_connect()).await;
            }
            let _ = run_decisions(shared, Some(node), nothing, deadline).await;
        }
    });
    futures::future::join_all(nodes).await;
}

/// [`run_call`] of the main script: one decision per limit.
async fn run_decisions(
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
pub async fn run_call<T>(
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
pub fn unrouted(slot: u16) -> StoreError {
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
