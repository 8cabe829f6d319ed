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

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time;

use super::call::{run_decisions, Shared};
use super::nodes::Nodes;
use super::script::{self, Call};
use crate::algorithm::Decision;
use crate::store::{StoreCheck, StoreError};

/// Most batches in flight at once.
pub(crate) const MAX_IN_FLIGHT: usize = 64;

/// Jobs a batch vector first has room for.
const TYPICAL_BATCH: usize = 16;

/// A request's checks waiting for a batch.
pub(crate) struct Job {
    /// The checks, in request order.
    pub(crate) checks: Vec<StoreCheck>,
    /// Charge (`true`) or peek.
    pub(crate) commit: bool,
    /// The caller's decisions so far; the job's (one per limit, in order) are appended
    /// and the vector goes back through `reply`.
    pub(crate) decisions: Vec<Decision>,
    /// Where the decisions go, with the outcome; taken when answered. Closed
    /// when the caller gave up (its own deadline): such a job is never sent.
    pub(crate) reply: Option<oneshot::Sender<JobAnswer>>,
    /// By this instant the job is answered: past it, it is not sent, and if its batch
    /// is still out it is answered with a timeout.
    pub(crate) deadline: Instant,
}

/// A job's answer: its decisions vector (filled where its checks were decided) and
/// the outcome: an error, or [`StoreError::Partly`] when only some checks failed.
pub(crate) type JobAnswer = (Vec<Decision>, Result<(), StoreError>);

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
pub(crate) fn slot_of(nodes: &Nodes, check: &StoreCheck) -> u16 {
    if nodes.clustered() {
        script::slot(check.key)
    } else {
        0
    }
}

/// Collects jobs into batches until every sender is gone (the store was dropped).
pub(crate) async fn collect(mut jobs: mpsc::Receiver<Job>, shared: Arc<Shared>) {
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
                &shared.key_prefix,
                members.iter().map(|m| &jobs[m.job].checks[m.check]),
                *commit,
                None,
                shared.regions.as_deref(),
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
