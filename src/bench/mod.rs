//! `sluice bench`: a load generator for any Envoy RLS server (ours or another), and the
//! bench-only helpers that measure Sluice itself: a constant-OK gRPC server (the
//! ceiling every throughput target is a fraction of) and the memory-per-key probe.
//!
//! Load runs over `--connections` HTTP/2 connections (one tonic channel multiplexes all
//! its calls on one connection, which then caps throughput). Closed loop: `--concurrency`
//! workers each keep one call in flight. Open loop (`--rate`): calls start on a fixed
//! schedule whatever the answers' speed, at most `--concurrency` in flight. Every
//! completed call counts, failed ones under their gRPC code; nothing is hidden in the
//! throughput.

pub mod ceiling;
pub(crate) mod keys;
pub mod memory;
pub(crate) mod pacer;
pub(crate) mod report;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Args;
use tokio::sync::{oneshot, Semaphore};
use tonic::transport::{Channel, Endpoint};

use crate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
pub(crate) use keys::{Distribution, RequestMaker, Rng, Template};
use pacer::{Ticker, PACER_TICK};
pub use report::{Report, Tally};

/// Flags of `sluice bench`.
#[derive(Clone, Debug, Args)]
pub struct BenchArgs {
    /// RLS server address (`host:port`, plaintext HTTP/2).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub(crate) target: SocketAddr,
    /// Calls in flight at most.
    #[arg(long, default_value_t = 64)]
    pub(crate) concurrency: usize,
    /// HTTP/2 connections to spread the calls over (as many as `--threads` to load a
    /// thread-per-core server: with more, which server thread each lands on is a race)
    #[arg(long, default_value_t = 4)]
    pub(crate) connections: usize,
    /// Measured time.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) duration: Duration,
    /// Unmeasured time before it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub(crate) warmup: Duration,
    /// Open loop: start this many calls per second on a fixed schedule.
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Rule domain of every request.
    #[arg(long, default_value = "bench")]
    pub(crate) domain: String,
    /// A descriptor, `key=value[,key=value...]`; `{key}` in a value is replaced by the
    /// request's key. Repeat for several descriptors per request.
    #[arg(long = "descriptor", default_value = "user={key}")]
    pub(crate) descriptors: Vec<Template>,
    /// Key distribution: `one`, `uniform:N` or `zipf:N:s`.
    #[arg(long, default_value = "one")]
    pub(crate) keys: Distribution,
    /// Request-level hits addend (0: the server's default of one hit).
    #[arg(long, default_value_t = 0)]
    pub(crate) hits_addend: u32,
    /// Deadline every call carries as `grpc-timeout`, as Envoy's rate limit filter
    /// sends its own timeout (20 ms by default); none when unset.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) grpc_timeout: Option<Duration>,
    /// Load threads, each with its own runtime, connections and share of the calls
    /// (at most `--connections` and `--concurrency`).
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A connection could not be opened.
    #[error("connecting to {target}: {source}")]
    Connect {
        /// The address.
        target: SocketAddr,
        /// What failed.
        source: tonic::transport::Error,
    },
    /// A load thread's runtime could not start.
    #[error("starting a load thread's runtime: {0}")]
    Runtime(std::io::Error),
    /// A load thread's pacing timer could not start or be read (open loop).
    #[error("pacing an open loop: {0}")]
    Pacing(std::io::Error),
    /// A load thread panicked: its calls are unaccounted for, so the run has no report.
    #[error("a load thread stopped unexpectedly; the run is void")]
    ThreadPanicked,
    /// Nonsense flags.
    #[error("invalid bench settings: {0}")]
    Settings(&'static str),
}

/// Runs the load described by `args` and summarises it.
///
/// Each of `--threads` OS threads runs its own single-threaded runtime with its own
/// connections and its share of the calls (as h2load and wrk do): no call waits behind a
/// scheduler another thread's calls keep busy, and no wakeup crosses threads: in an
/// open loop each thread paces its own share of the calls.
pub fn run(args: &BenchArgs) -> Result<Report, BenchError> {
    let threads = args.threads;
    if args.concurrency == 0 || args.connections == 0 || threads == 0 {
        return Err(BenchError::Settings(
            "concurrency, connections and threads must be ≥ 1",
        ));
    }
    if threads > args.connections || threads > args.concurrency {
        return Err(BenchError::Settings(
            "threads must not exceed connections or concurrency",
        ));
    }
    if args
        .rate
        .is_some_and(|rate| !(rate > 0.0 && rate.is_finite()))
    {
        return Err(BenchError::Settings("rate must be a positive number"));
    }
    let maker = Arc::new(RequestMaker::new(
        args.domain.clone(),
        args.descriptors.clone(),
        args.keys.clone(),
        args.hits_addend,
    ));
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut starts = Vec::with_capacity(threads);
    let mut loads = Vec::with_capacity(threads);
    for index in 0..threads {
        let share = Share {
            target: args.target,
            connections: split(args.connections, threads, index),
            concurrency: split(args.concurrency, threads, index),
            first_worker: index * args.concurrency.div_ceil(threads),
            pacing: args.rate.map(|rate| pacer::Pace {
                rate,
                threads: threads as u64,
                index: index as u64,
            }),
            grpc_timeout: args.grpc_timeout,
        };
        let (start_tx, start_rx) = oneshot::channel();
        starts.push(start_tx);
        let ready = ready_tx.clone();
        let maker = maker.clone();
        loads.push(std::thread::spawn(move || {
            share.run(&maker, &ready, start_rx)
        }));
    }
    drop(ready_tx);
    let mut failure = None;
    for ready in ready_rx.iter().take(threads) {
        if let Err(error) = ready {
            failure.get_or_insert(error);
        }
    }
    let timeline = Timeline::starting_now(args.warmup, args.duration);
    for start in starts {
        // A thread that could not connect has already returned.
        let _ = start.send(failure.is_none().then_some(timeline));
    }
    let mut tally = Tally::new();
    let mut panicked = false;
    for load in loads {
        match load.join() {
            Ok(Ok(thread_tally)) => tally.merge(&thread_tally),
            Ok(Err(error)) => {
                failure.get_or_insert(error);
            }
            Err(_) => panicked = true,
        }
    }
    if let Some(error) = failure {
        return Err(error);
    }
    if panicked {
        return Err(BenchError::ThreadPanicked);
    }
    Ok(Report::new(args, &tally))
}

/// The `index`-th of `parts` near-equal shares of `total`.
fn split(total: usize, parts: usize, index: usize) -> usize {
    total / parts + usize::from(index < total % parts)
}

/// When a run starts (an open loop's first call is due) and when it measures: from
/// `measure_from` (after the warm-up) to `end`.
#[derive(Clone, Copy, Debug)]
struct Timeline {
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

impl Timeline {
    fn starting_now(warmup: Duration, duration: Duration) -> Self {
        let start = Instant::now();
        let measure_from = start + warmup;
        Self {
            start,
            measure_from,
            end: measure_from + duration,
        }
    }
}

/// One load thread's part of a run.
struct Share {
    target: SocketAddr,
    connections: usize,
    concurrency: usize,
    /// Number of this thread's first worker (seeds each worker's key sequence).
    first_worker: usize,
    /// Open loop: this thread's share of the calls.
    pacing: Option<pacer::Pace>,
    /// `grpc-timeout` of every call.
    grpc_timeout: Option<Duration>,
}

impl Share {
    /// Connects (and, in an open loop, starts its pacing timer), reports on `ready`,
    /// waits for the timeline (none: another thread failed to start) and runs the load
    /// on a runtime of its own. A failure before the start goes to `ready`; one after it
    /// is returned.
    fn run(
        self,
        maker: &Arc<RequestMaker>,
        ready: &mpsc::Sender<Result<(), BenchError>>,
        start: oneshot::Receiver<Option<Timeline>>,
    ) -> Result<Tally, BenchError> {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = ready.send(Err(BenchError::Runtime(error)));
                return Ok(Tally::new());
            }
        };
        runtime.block_on(async {
            let started = self.connect().await.and_then(|clients| {
                // Open loop: this thread's pace and the timer that paces it.
                let paced = self
                    .pacing
                    .map(|pace| Ticker::every(PACER_TICK).map(|ticker| (pace, ticker)))
                    .transpose();
                Ok((clients, paced.map_err(BenchError::Pacing)?))
            });
            let (clients, paced) = match started {
                Ok(started) => started,
                Err(error) => {
                    let _ = ready.send(Err(error));
                    return Ok(Tally::new());
                }
            };
            let _ = ready.send(Ok(()));
            // Awaited, not blocked on: the connections' tasks run meanwhile.
            let Ok(Some(timeline)) = start.await else {
                return Ok(Tally::new());
            };
            match paced {
                Some((pace, ticker)) => {
                    self.open_loop(&clients, maker, &pace, &ticker, timeline)
                        .await
                }
                None => Ok(self.closed_loop(&clients, maker, timeline).await),
            }
        })
    }

    async fn connect(&self) -> Result<Vec<Client>, BenchError> {
        let mut clients = Vec::with_capacity(self.connections);
        for _ in 0..self.connections {
            let channel = connect(self.target).await?;
            clients.push(RateLimitServiceClient::new(channel));
        }
        Ok(clients)
    }

    /// This thread's `worker`-th worker, on its share of the clients, counting into the
    /// thread's `tally`.
    fn worker(
        &self,
        worker: usize,
        clients: &[Client],
        maker: &Arc<RequestMaker>,
        tally: &SharedTally,
    ) -> Worker {
        Worker {
            client: clients[worker % clients.len()].clone(),
            maker: maker.clone(),
            rng: Rng::new((self.first_worker + worker) as u64 + 1),
            tally: tally.clone(),
            grpc_timeout: self.grpc_timeout,
        }
    }

    /// `concurrency` workers, each with one call in flight, spread over the clients.
    async fn closed_loop(
        &self,
        clients: &[Client],
        maker: &Arc<RequestMaker>,
        timeline: Timeline,
    ) -> Tally {
        let tally = SharedTally::default();
        let workers: Vec<_> = (0..self.concurrency)
            .map(|index| {
                let mut worker = self.worker(index, clients, maker, &tally);
                tokio::spawn(async move {
                    while Instant::now() < timeline.end {
                        worker.call(|sent| sent >= timeline.measure_from).await;
                    }
                })
            })
            .collect();
        join_all(workers).await;
        take(&tally)
    }

    /// Calls started as `pace` releases them on `ticker`'s ticks, taken by whichever
    /// of the `concurrency` workers is free. Latency runs from the call's start; a
    /// schedule the workers cannot keep shows as a lower measured rate. The calls due
    /// in the warm-up are its own even when they start after it (a load thread that
    /// fell behind then): the measured calls are those due from `measure_from` on, so a
    /// late warm-up never adds a burst to the measured rate.
    async fn open_loop(
        &self,
        clients: &[Client],
        maker: &Arc<RequestMaker>,
        pace: &pacer::Pace,
        ticker: &Ticker,
        timeline: Timeline,
    ) -> Result<Tally, BenchError> {
        // Handed out on this thread: a released call wakes a worker without a syscall.
        let calls = Arc::new(Semaphore::new(0));
        let tally = SharedTally::default();
        // Calls are released in the order they fall due and taken in the order released
        // (the semaphore is fair): the k-th taken is this thread's k-th due.
        let warmup_calls = pace.due_after(timeline.measure_from - timeline.start);
        let taken = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..self.concurrency)
            .map(|index| {
                let mut worker = self.worker(index, clients, maker, &tally);
                let calls = calls.clone();
                let taken = taken.clone();
                tokio::spawn(async move {
                    while let Ok(permit) = calls.acquire().await {
                        permit.forget();
                        let measured = taken.fetch_add(1, Ordering::Relaxed) >= warmup_calls;
                        worker.call(|_| measured).await;
                    }
                })
            })
            .collect();
        let paced = pace.dispatch(ticker, timeline.start, timeline.end, &calls);
        let (paced, ()) = tokio::join!(paced, join_all(workers));
        paced.map_err(BenchError::Pacing)?;
        Ok(take(&tally))
    }
}

/// One load thread's tally, shared by its workers (all on that thread's runtime, so the
/// lock is never contended). One per worker cost each call a cache miss at high
/// concurrency: two 150 KB histograms per worker, 300 MB at 1 024 in flight; sharing
/// took the load generator's CPU per call there from 10.1 to 9.5 µs.
type SharedTally = Arc<Mutex<Tally>>;

/// What `tally` has counted, once its workers are done.
fn take(tally: &SharedTally) -> Tally {
    std::mem::take(&mut tally.lock().unwrap_or_else(PoisonError::into_inner))
}

/// One worker: its connection, its key sequence and the tally it counts into.
struct Worker {
    client: Client,
    maker: Arc<RequestMaker>,
    rng: Rng,
    tally: SharedTally,
    grpc_timeout: Option<Duration>,
}

impl Worker {
    /// Makes one call; counts it if `counted` says so of the instant it was sent.
    async fn call(&mut self, counted: impl FnOnce(Instant) -> bool) {
        let mut request = tonic::Request::new(self.maker.request(self.maker.key(&mut self.rng)));
        if let Some(timeout) = self.grpc_timeout {
            request.set_timeout(timeout);
        }
        let sent = Instant::now();
        let result = self.client.should_rate_limit(request).await;
        if counted(sent) {
            let latency = sent.elapsed();
            let code = result.as_ref().map(|r| r.get_ref().overall_code);
            self.tally
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .count(latency, code);
        }
    }
}

/// One HTTP/2 connection.
async fn connect(target: SocketAddr) -> Result<Channel, BenchError> {
    let endpoint = Endpoint::from_shared(format!("http://{target}"))
        .map_err(|source| BenchError::Connect { target, source })?
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(1 << 20))
        .initial_connection_window_size(Some(8 << 20))
        .connect_timeout(Duration::from_secs(5));
    endpoint
        .connect()
        .await
        .map_err(|source| BenchError::Connect { target, source })
}

type Client = RateLimitServiceClient<Channel>;

/// Waits for every worker. A worker's panic goes on to its load thread (whose run then
/// has no report): its calls must not silently vanish from the counts.
async fn join_all(workers: Vec<tokio::task::JoinHandle<()>>) {
    for worker in workers {
        if let Err(error) = worker.await {
            std::panic::resume_unwind(Box::new(error));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_differ_by_one_at_most() {
        for total in 1..40 {
            for parts in 1..=total.min(7) {
                let shares: Vec<_> = (0..parts).map(|i| split(total, parts, i)).collect();
                assert_eq!(shares.iter().sum::<usize>(), total);
                let (min, max) = (shares.iter().min(), shares.iter().max());
                assert!(max.zip(min).is_some_and(|(max, min)| max - min <= 1));
            }
        }
    }
}
