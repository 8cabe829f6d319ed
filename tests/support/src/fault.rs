//! Helpers for fault tests: calls with a gRPC deadline and their outcome, a load loop
//! that records every answer, Redis counter reads, process memory and a captured log.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sluice::algorithm::AlgorithmKind;
use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rls::RateLimitRequest;
use sluice::rules::Entry as RuleEntry;
use sluice::store::redis::script::limit_key;
use sluice::store::CounterKey;
use tonic::transport::Channel;

/// The domain of every fault-test rule.
pub const DOMAIN: &str = "faults";

/// One rule per failure mode (key = mode), a huge daily fixed window so that every
/// Redis answer is OK and every refusal comes from the failure mode; `few` (limit 3)
/// and `local` (limit 10, so 5 with `--replicas 2`) check exactness.
pub const RULES: &str = "domain: faults
descriptors:
  - key: open
    rate_limit: {unit: day, requests_per_unit: 1000000000}
  - key: closed
    rate_limit: {unit: day, requests_per_unit: 1000000000, failure_mode: closed}
  - key: error
    rate_limit: {unit: day, requests_per_unit: 1000000000, failure_mode: error}
  - key: local
    rate_limit: {unit: day, requests_per_unit: 10, failure_mode: local}
  - key: few
    rate_limit: {unit: day, requests_per_unit: 3, failure_mode: closed}
";

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// OK.
    Ok,
    /// OVER_LIMIT.
    Over,
    /// gRPC UNAVAILABLE (the `error` failure mode).
    Unavailable,
    /// Anything else: a bug in a fault test (deadline exceeded, cancelled, UNKNOWN...).
    Other(tonic::Code, i32),
}

/// One call's outcome, when it started and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    /// How it ended.
    pub outcome: Outcome,
    /// When it was sent.
    pub started: Instant,
    /// How long it took.
    pub elapsed: Duration,
}

/// One call on descriptor `key=value` with `timeout` as its gRPC deadline.
pub async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    key: &str,
    value: &str,
    timeout: Duration,
) -> Answer {
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: DOMAIN.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    });
    request.set_timeout(timeout);
    let started = Instant::now();
    let result = client.should_rate_limit(request).await;
    let elapsed = started.elapsed();
    let outcome = match result {
        Ok(response) => match Code::try_from(response.get_ref().overall_code) {
            Ok(Code::Ok) => Outcome::Ok,
            Ok(Code::OverLimit) => Outcome::Over,
            _ => Outcome::Other(tonic::Code::Ok, response.get_ref().overall_code),
        },
        Err(status) if status.code() == tonic::Code::Unavailable => Outcome::Unavailable,
        Err(status) => {
            eprintln!("call {key}={value}: {status:?} after {elapsed:?}");
            Outcome::Other(status.code(), -1)
        }
    };
    Answer {
        outcome,
        started,
        elapsed,
    }
}

/// Calls on one descriptor from `workers` tasks until stopped; keeps every answer.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Answer>>>,
}

impl Load {
    /// Starts `workers` tasks calling `key=value`, each call with the deadline `timeout`.
    pub fn start(
        client: &RateLimitServiceClient<Channel>,
        key: &'static str,
        value: &'static str,
        workers: usize,
        timeout: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..workers)
            .map(|_| {
                let mut client = client.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        answers.push(call(&mut client, key, value, timeout).await);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    answers
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops the tasks; every answer, in the order the calls started.
    pub async fn stop(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for task in self.tasks {
            all.extend(task.await.expect("load task panicked"));
        }
        all.sort_by_key(|answer| answer.started);
        all
    }
}

/// Asserts no answer is anything but OK / OVER_LIMIT / UNAVAILABLE, and every one came
/// within its deadline (tonic's server cancels a call past `grpc-timeout`, which would
/// show as CANCELLED or DEADLINE_EXCEEDED).
pub fn assert_all_answered(answers: &[Answer], what: &str) {
    for answer in answers {
        assert!(
            !matches!(answer.outcome, Outcome::Other(..)),
            "{what}: a call ended with {:?} after {:?}",
            answer.outcome,
            answer.elapsed
        );
    }
}

/// The Redis key of limit 0 of descriptor `key=value` (every rule of [`RULES`] has one
/// limit of a day).
pub fn redis_key(key: &str, value: &str) -> String {
    let entries = [RuleEntry { key, value }];
    limit_key(
        &Default::default(),
        CounterKey::new(
            DOMAIN,
            &entries,
            &[],
            [(AlgorithmKind::FixedWindow, DAY_MICROS)],
        ),
        0,
    )
}

/// A day in microseconds: the window of every rule of [`RULES`].
const DAY_MICROS: u64 = 86_400_000_000;

/// Hash slot of descriptor `key=value`.
pub fn slot(key: &str, value: &str) -> u16 {
    fred::util::redis_keyslot(redis_key(key, value).as_bytes())
}

/// The fixed-window count in `redis-cli`'s answer to a `GET` (`f <window start>
/// <count>`), 0 for no key; `None` for any other answer (an error, a redirect to a node
/// that is gone), which must never read as a count.
pub fn count_of(get_answer: &str) -> Option<u64> {
    let answer = get_answer.trim();
    if answer.is_empty() {
        return Some(0);
    }
    match answer.split_whitespace().collect::<Vec<_>>()[..] {
        ["f", _, count] => count.parse().ok(),
        _ => None,
    }
}

/// Fault tests measure latency and this process's memory: they run one at a time.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Resident memory of this process, in KiB.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// The `q`-quantile of the answers' latencies.
pub fn quantile(answers: &[Answer], q: f64) -> Duration {
    let mut times: Vec<Duration> = answers.iter().map(|a| a.elapsed).collect();
    times.sort();
    let index = ((times.len() as f64 - 1.0) * q).round() as usize;
    times.get(index).copied().unwrap_or_default()
}

/// Everything logged in this test process (installed once).
pub fn captured_log() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buffer: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("sluice=info")
            .with_ansi(false)
            .with_writer(move || LogWriter(buffer))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buffer
    })
}

/// The log lines that contain `needle`.
pub fn log_lines_with(needle: &str) -> Vec<String> {
    let text = {
        let log = captured_log().lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&log).into_owned()
    };
    text.lines()
        .filter(|line| line.contains(needle))
        .map(str::to_owned)
        .collect()
}

struct LogWriter(&'static Mutex<Vec<u8>>);

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        log.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
