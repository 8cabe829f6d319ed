//! The batcher: checks from concurrent requests share script calls and round trips.
//!
//! Requests put a job on a bounded queue (full: the call fails at once with
//! [`StoreError::Unavailable`], and the rule's failure mode answers). One collector task
//! takes the first job, then keeps taking jobs for at most `batch_window` or until
//! `batch_max` checks, groups the checks by hash slot (a standalone or Sentinel server
//! is one group), and makes one script call per group, which decides that group's
//! checks in arrival order (checks on the same key coalesce into that call). All calls
//! of a batch go out as one fred pipeline; fred routes each to its node, so a request
//! whose descriptors live on several shards is split across nodes in parallel and
//! answered when every part has returned. At most [`MAX_IN_FLIGHT`] batches are in
//! flight; while they are, the queue absorbs new jobs, which is what makes batches
//! grow under load.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::{Client, ClientLike, LuaInterface};
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::client::{classify, is_noscript};
use super::script::{self, Call};
use crate::algorithm::Decision;
use crate::store::{StoreCheck, StoreError};
use crate::telemetry::Metrics;

/// Most batches in flight at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// A request's checks waiting for a batch.
pub struct Job {
    /// The checks, in request order.
    pub checks: Vec<StoreCheck>,
    /// Charge (`true`) or peek.
    pub commit: bool,
    /// Where the decisions (one per limit, in order) go. Closed when the caller gave up
    /// (its own deadline): such a job is never sent.
    pub reply: oneshot::Sender<Result<Vec<Decision>, StoreError>>,
    /// Past this instant the caller no longer waits: the job is dropped, not sent.
    pub deadline: Instant,
}

/// Hash slot of a check's keys (all limits of a descriptor share it).
pub fn slot_of(check: &StoreCheck) -> u16 {
    fred::util::redis_keyslot(script::limit_key(check.key, 0).as_bytes())
}

/// What every batch needs.
pub struct Shared {
    /// The fred client (cloning it shares its connections).
    pub client: Client,
    /// Whether keys must be grouped by slot.
    pub clustered: bool,
    /// Circuit breakers (fed with every script call's outcome) and routing.
    pub health: super::health::Health,
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
    while let Some(first) = jobs.recv().await {
        let mut size = first.checks.len();
        let mut batch = vec![first];
        let deadline = Instant::now() + shared.window;
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
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
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
    jobs.retain(|job| !job.reply.is_closed() && job.deadline > now);
    if jobs.is_empty() {
        return;
    }
    // (commit, slot) → the (job, check) pairs of that group, in arrival order.
    let mut index: HashMap<(bool, u16), usize> = HashMap::new();
    let mut groups: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut commits: Vec<bool> = Vec::new();
    let mut slots: Vec<u16> = Vec::new();
    let mut size = 0u64;
    for (j, job) in jobs.iter().enumerate() {
        for (c, check) in job.checks.iter().enumerate() {
            size += 1;
            let slot = if shared.clustered { slot_of(check) } else { 0 };
            let group = *index.entry((job.commit, slot)).or_insert_with(|| {
                groups.push(Vec::new());
                commits.push(job.commit);
                slots.push(slot);
                groups.len() - 1
            });
            groups[group].push((j, c));
        }
    }
    shared.metrics.batch_size.observe(size as f64);
    let calls: Vec<Call> = groups
        .iter()
        .zip(&commits)
        .map(|(members, commit)| {
            Call::new(
                members.iter().map(|&(j, c)| &jobs[j].checks[c]),
                *commit,
                None,
            )
        })
        .collect();
    let results = match tokio::time::timeout(shared.timeout, run_calls(shared, &calls)).await {
        Ok(results) => results,
        Err(_) => calls
            .iter()
            .map(|_| Err(StoreError::Timeout(shared.timeout)))
            .collect(),
    };
    let mut failed = false;
    for (slot, result) in slots.iter().zip(&results) {
        failed |= result.is_err();
        shared.health.record(*slot, result.as_ref().map(|_| ()));
    }
    shared.health.refresh_routing(&shared.client, failed);

    // Scatter: per job, per check, its decisions (or the job's first error).
    let mut answers: Vec<Result<Vec<Option<Vec<Decision>>>, StoreError>> = jobs
        .iter()
        .map(|job| Ok(vec![None; job.checks.len()]))
        .collect();
    for (members, result) in groups.iter().zip(results) {
        match result {
            Ok(decisions) => {
                let mut rest = decisions.as_slice();
                for &(j, c) in members {
                    let n = jobs[j].checks[c].limits.len().min(rest.len());
                    let (mine, tail) = rest.split_at(n);
                    rest = tail;
                    if let Ok(slots) = &mut answers[j] {
                        slots[c] = Some(mine.to_vec());
                    }
                }
            }
            Err(error) => {
                for &(j, _) in members {
                    if answers[j].is_ok() {
                        answers[j] = Err(error.clone());
                    }
                }
            }
        }
    }
    for (job, answer) in jobs.into_iter().zip(answers) {
        let answer = answer.map(|slots| slots.into_iter().flatten().flatten().collect());
        let _ = job.reply.send(answer);
    }
}

/// Runs `calls` as one pipeline; calls the server answered with NOSCRIPT are run again
/// after loading the script (they did not run, so nothing is charged twice).
pub async fn run_calls(shared: &Shared, calls: &[Call]) -> Vec<Result<Vec<Decision>, StoreError>> {
    let mut results = pipeline(shared, calls.iter()).await;
    let missing: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Err(Failure::NoScript)))
        .map(|(i, _)| i)
        .collect();
    if !missing.is_empty() {
        let loaded = if shared.clustered {
            shared
                .client
                .script_load_cluster::<(), _>(script::SCRIPT)
                .await
        } else {
            shared
                .client
                .script_load::<String, _>(script::SCRIPT)
                .await
                .map(|_| ())
        };
        match loaded {
            Ok(()) => {
                let retried = pipeline(shared, missing.iter().map(|&i| &calls[i])).await;
                for (i, result) in missing.into_iter().zip(retried) {
                    results[i] = result;
                }
            }
            Err(error) => {
                let error = classify(&error, shared.timeout);
                for i in missing {
                    results[i] = Err(Failure::Store(error.clone()));
                }
            }
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.map_err(|failure| match failure {
                Failure::NoScript => StoreError::Unavailable("NOSCRIPT after SCRIPT LOAD".into()),
                Failure::Store(error) => error,
            })
        })
        .collect()
}

/// Why one call of a pipeline failed.
enum Failure {
    /// The node does not have the script.
    NoScript,
    /// Anything else.
    Store(StoreError),
}

/// Sends `calls` as one pipeline and decodes each reply.
async fn pipeline<'a>(
    shared: &Shared,
    calls: impl Iterator<Item = &'a Call>,
) -> Vec<Result<Vec<Decision>, Failure>> {
    let pipe = shared.client.pipeline();
    let mut limits = Vec::new();
    for call in calls {
        limits.push(call.limits);
        // Queued in memory: this cannot fail for a well-formed call.
        // Pipelines have no typed EVALSHA: send it as a custom command routed by the
        // slot of its keys (all of one call share it).
        let slot = call
            .keys
            .first()
            .map_or(0, |key| fred::util::redis_keyslot(key.as_bytes()));
        let command = CustomCommand::new_static("EVALSHA", ClusterHash::Custom(slot), false);
        let mut args: Vec<Value> = Vec::with_capacity(2 + call.keys.len() + call.args.len());
        args.push(script::SHA.as_str().into());
        args.push(Value::Integer(call.keys.len() as i64));
        args.extend(call.keys.iter().map(|key| Value::from(key.as_str())));
        args.extend(call.args.iter().map(|arg| Value::from(arg.as_str())));
        let queued: Result<(), _> = pipe.custom(command, args).await;
        if let Err(error) = queued {
            let error = classify(&error, shared.timeout);
            return limits
                .iter()
                .map(|_| Err(Failure::Store(error.clone())))
                .collect();
        }
    }
    let replies = pipe.try_all::<Value>().await;
    if replies.len() != limits.len() {
        let error = StoreError::Protocol(format!(
            "pipeline of {} calls returned {} replies",
            limits.len(),
            replies.len()
        ));
        return limits
            .iter()
            .map(|_| Err(Failure::Store(error.clone())))
            .collect();
    }
    replies
        .into_iter()
        .zip(limits)
        .map(|(reply, limits)| match reply {
            Ok(value) => {
                let numbers: Vec<i64> = value.convert().map_err(|e| {
                    Failure::Store(StoreError::Protocol(format!(
                        "script reply: {}",
                        e.details()
                    )))
                })?;
                script::decode(&numbers, limits).map_err(Failure::Store)
            }
            Err(error) if is_noscript(&error) => Err(Failure::NoScript),
            Err(error) => Err(Failure::Store(classify(&error, shared.timeout))),
        })
        .collect()
}
