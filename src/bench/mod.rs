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
pub mod keys;
pub mod memory;
pub mod report;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use tokio::sync::Semaphore;
use tonic::transport::{Channel, Endpoint};

use crate::proto::rls::rate_limit_response::Code;
use crate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
pub use keys::{Distribution, RequestMaker, Rng, Template};
pub use report::{Report, Tally};

/// Flags of `sluice bench`.
#[derive(Clone, Debug, Args)]
pub struct BenchArgs {
    /// RLS server address (`host:port`, plaintext HTTP/2).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub target: SocketAddr,
    /// Calls in flight at most.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// HTTP/2 connections to spread the calls over.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Measured time.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// Unmeasured time before it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub warmup: Duration,
    /// Open loop: start this many calls per second on a fixed schedule.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Rule domain of every request.
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// A descriptor, `key=value[,key=value...]`; `{key}` in a value is replaced by the
    /// request's key. Repeat for several descriptors per request.
    #[arg(long = "descriptor", default_value = "user={key}")]
    pub descriptors: Vec<Template>,
    /// Key distribution: `one`, `uniform:N` or `zipf:N:s`.
    #[arg(long, default_value = "one")]
    pub keys: Distribution,
    /// Request-level hits addend (0: the server's default of one hit).
    #[arg(long, default_value_t = 0)]
    pub hits_addend: u32,
    /// Client runtime threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
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
    /// Nonsense flags.
    #[error("invalid bench settings: {0}")]
    Settings(&'static str),
}

/// Runs the load described by `args` and summarises it.
pub async fn run(args: &BenchArgs) -> Result<Report, BenchError> {
    if args.concurrency == 0 || args.connections == 0 {
        return Err(BenchError::Settings(
            "concurrency and connections must be ≥ 1",
        ));
    }
    if args
        .rate
        .is_some_and(|rate| !(rate > 0.0 && rate.is_finite()))
    {
        return Err(BenchError::Settings("rate must be a positive number"));
    }
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let channel = connect(args.target).await?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    let maker = Arc::new(RequestMaker::new(
        args.domain.clone(),
        args.descriptors.clone(),
        args.keys.clone(),
        args.hits_addend,
    ));
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let tally = match args.rate {
        None => closed_loop(args, &clients, &maker, measure_from, end).await,
        Some(rate) => open_loop(args, &clients, &maker, rate, measure_from, end).await,
    };
    Ok(Report::new(
        args.target.to_string(),
        args.connections,
        args.concurrency,
        args.rate,
        args.duration,
        &tally,
    ))
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

/// `concurrency` workers, each with one call in flight, spread over the clients.
async fn closed_loop(
    args: &BenchArgs,
    clients: &[Client],
    maker: &Arc<RequestMaker>,
    measure_from: Instant,
    end: Instant,
) -> Tally {
    let workers: Vec<_> = (0..args.concurrency)
        .map(|worker| {
            let mut client = clients[worker % clients.len()].clone();
            let maker = maker.clone();
            tokio::spawn(async move {
                let mut tally = Tally::new();
                let mut rng = Rng::new(worker as u64 + 1);
                loop {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    let request = maker.request(maker.key(&mut rng));
                    let result = client.should_rate_limit(request).await;
                    if sent >= measure_from {
                        tally.record(sent.elapsed());
                        count(&mut tally, result);
                    }
                }
                tally
            })
        })
        .collect();
    gather(workers).await
}

/// Calls started on a fixed schedule of `rate` per second: a pacer thread releases call
/// `n` at `start + n / rate` (to within [`PACER_TICK`]; tokio's timer has millisecond
/// granularity, which would send the calls in bursts, one per millisecond), taken by
/// whichever of the `concurrency` workers is free. Latency runs from the call's start;
/// a schedule the workers cannot keep shows as a lower measured rate.
async fn open_loop(
    args: &BenchArgs,
    clients: &[Client],
    maker: &Arc<RequestMaker>,
    rate: f64,
    measure_from: Instant,
    end: Instant,
) -> Tally {
    let due = Arc::new(Semaphore::new(0));
    let pacer = {
        let due = due.clone();
        std::thread::spawn(move || pace(&due, rate, end))
    };
    let workers: Vec<_> = (0..args.concurrency)
        .map(|worker| {
            let mut client = clients[worker % clients.len()].clone();
            let maker = maker.clone();
            let due = due.clone();
            tokio::spawn(async move {
                let mut tally = Tally::new();
                let mut rng = Rng::new(worker as u64 + 1);
                while let Ok(permit) = due.acquire().await {
                    permit.forget();
                    let request = maker.request(maker.key(&mut rng));
                    let sent = Instant::now();
                    let result = client.should_rate_limit(request).await;
                    if sent >= measure_from {
                        tally.record(sent.elapsed());
                        count(&mut tally, result);
                    }
                }
                tally
            })
        })
        .collect();
    let tally = gather(workers).await;
    let _ = pacer.join();
    tally
}

/// How often the pacer releases the calls that have become due.
pub const PACER_TICK: Duration = Duration::from_micros(50);

/// Releases `rate` calls per second on `due` until `end`, then closes it.
fn pace(due: &Semaphore, rate: f64, end: Instant) {
    let start = Instant::now();
    let mut released = 0u64;
    loop {
        let now = Instant::now();
        if now >= end {
            due.close();
            return;
        }
        let owed = ((now - start).as_secs_f64() * rate) as u64;
        if owed > released {
            let batch = usize::try_from(owed - released)
                .unwrap_or(usize::MAX)
                .min(Semaphore::MAX_PERMITS / 2);
            due.add_permits(batch);
            released += batch as u64;
        }
        std::thread::sleep(PACER_TICK);
    }
}

/// Sums the workers' tallies.
async fn gather(workers: Vec<tokio::task::JoinHandle<Tally>>) -> Tally {
    let mut total = Tally::new();
    for worker in workers {
        if let Ok(tally) = worker.await {
            total.merge(&tally);
        }
    }
    total
}

/// Counts one call's outcome.
fn count(
    tally: &mut Tally,
    result: Result<tonic::Response<crate::proto::rls::RateLimitResponse>, tonic::Status>,
) {
    match result.map(|r| r.into_inner().overall_code) {
        Ok(code) if code == Code::Ok as i32 => tally.ok += 1,
        Ok(code) if code == Code::OverLimit as i32 => tally.over_limit += 1,
        Ok(_) => tally.unknown += 1,
        Err(status) => {
            *tally
                .errors
                .entry(format!("{:?}", status.code()))
                .or_default() += 1;
        }
    }
}
