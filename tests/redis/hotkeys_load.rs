//! Measured effect of the hot-key layers (DESIGN §6; the README's "Hot keys" section).
//!
//! A small closed-loop load generator: 64 concurrent callers send ShouldRateLimit calls
//! to one in-process Sluice for a fixed time, on the memory store and on a real Redis.
//! Scenarios:
//! - `hot_over`: one key far over its limit (100 per minute);
//! - `hot_under`: one key under a huge limit, leased 100 units at a time (and not);
//! - `many`: 100 000 distinct keys under their limits, `lease: auto` against `off`.
//!
//! Each run reports calls per second, the share of decisions made without the store
//! (`sluice_local_decisions_total` over `sluice_requests_total`), and Redis script calls
//! (`FCALL` and `EVALSHA`) from `INFO commandstats`. The checks of the issue are asserted: hot key over
//! its limit ≥ 95 % local and within 20 % of the memory store's throughput; many keys
//! with `lease: auto` no slower than `off` (within noise, 10 %).
//!
//! Ignored by default (a measurement, seconds long, sensitive to machine load): run
//! `cargo test --release --test redis -- --ignored --nocapture --test-threads 1 hotkeys_load`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::RateLimitRequest;
use support::redis::RedisServer;
use support::TestServer;

const CALLERS: usize = 64;
const RUN: Duration = Duration::from_secs(3);
const ROUNDS: usize = 4;

const RULES: &str = "domain: load
descriptors:
  - key: hot_over
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: hot_under
    rate_limit: {unit: minute, requests_per_unit: 100000000}
  - key: hot_leased
    rate_limit: {unit: minute, requests_per_unit: 100000000, lease: 100}
  - key: many_off
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: many_auto
    rate_limit: {unit: minute, requests_per_unit: 1000, lease: auto}
";

/// One run's numbers.
#[derive(Debug)]
struct Run {
    calls: f64,
    script_calls: f64,
    calls_per_second: f64,
    local_share: f64,
    script_calls_per_call: f64,
}

fn redis_script_calls(redis: Option<&RedisServer>) -> f64 {
    redis.map_or(0.0, |redis| redis.script_calls() as f64)
}

async fn totals(server: &TestServer) -> (f64, f64) {
    let metrics = server.metrics().await;
    let sum = |prefix: &str| -> f64 {
        metrics
            .0
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, value)| value)
            .sum()
    };
    (
        sum("sluice_requests_total"),
        sum("sluice_local_decisions_total"),
    )
}

/// Drives `key` (`distinct`: a new value per call, else one value) for [`RUN`].
async fn run(server: &TestServer, redis: Option<&RedisServer>, key: &str, distinct: bool) -> Run {
    let client = server.client().await;
    let (decided_before, local_before) = totals(server).await;
    let script_calls_before = redis_script_calls(redis);
    let calls = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + RUN;
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let mut client = client.clone();
            let calls = calls.clone();
            let key = key.to_owned();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let value = if distinct {
                        format!("{caller}-{n}")
                    } else {
                        "one".to_owned()
                    };
                    n += 1;
                    let request = RateLimitRequest {
                        domain: "load".into(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: key.clone(),
                                value,
                            }],
                            limit: None,
                            hits_addend: None,
                            is_negative_hits: false,
                        }],
                        hits_addend: 1,
                    };
                    client.should_rate_limit(request).await.expect("rpc");
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("caller");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let calls = calls.load(Ordering::Relaxed) as f64;
    let (decided, local) = totals(server).await;
    let script_calls = redis_script_calls(redis) - script_calls_before;
    Run {
        calls,
        script_calls,
        calls_per_second: calls / elapsed,
        local_share: (local - local_before) / (decided - decided_before).max(1.0),
        script_calls_per_call: script_calls / calls.max(1.0),
    }
}

/// The run with the median throughput.
fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.calls_per_second.total_cmp(&b.calls_per_second));
    runs.swap_remove(runs.len() / 2)
}

fn row(store: &str, scenario: &str, run: &Run) {
    println!(
        "| {store} | {scenario} | {:.0} | {:.1} % | {:.0} / {:.0} = {:.4} |",
        run.calls_per_second,
        run.local_share * 100.0,
        run.script_calls,
        run.calls,
        run.script_calls_per_call
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run explicitly, in release, on a quiet machine"]
async fn hot_keys_are_absorbed_locally() {
    let files = [("load.yaml".to_owned(), RULES.to_owned())];
    let memory = TestServer::start(&files, &[], &["--store", "memory"]).await;
    let redis = RedisServer::start();
    let url = redis.url();
    let remote = TestServer::start(&files, &[], &["--store", "redis", "--redis-url", &url]).await;

    println!("| store | scenario | calls/s | decided locally | script calls / gRPC calls |");
    println!("|---|---|---|---|---|");
    let memory_over = run(&memory, None, "hot_over", false).await;
    row("memory", "one key over its limit", &memory_over);
    let redis_over = run(&remote, Some(&redis), "hot_over", false).await;
    row("redis", "one key over its limit", &redis_over);
    let memory_under = run(&memory, None, "hot_under", false).await;
    row("memory", "one key under its limit", &memory_under);
    let redis_under = run(&remote, Some(&redis), "hot_under", false).await;
    row("redis", "one key under its limit, lease off", &redis_under);
    let redis_leased = run(&remote, Some(&redis), "hot_leased", false).await;
    row("redis", "one key under its limit, lease 100", &redis_leased);
    let memory_many = run(&memory, None, "many_off", true).await;
    row("memory", "distinct keys under their limits", &memory_many);
    // Alternating rounds, median of each: this comparison is within the machine's noise.
    let (mut off, mut auto) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // Alternate which goes first, each on an empty Redis.
        redis.cli(&["FLUSHALL"]);
        if round % 2 == 0 {
            off.push(run(&remote, Some(&redis), "many_off", true).await);
            redis.cli(&["FLUSHALL"]);
            auto.push(run(&remote, Some(&redis), "many_auto", true).await);
        } else {
            auto.push(run(&remote, Some(&redis), "many_auto", true).await);
            redis.cli(&["FLUSHALL"]);
            off.push(run(&remote, Some(&redis), "many_off", true).await);
        }
    }
    let redis_many_off = median(off);
    row(
        "redis",
        "distinct keys, lease off (median of 4)",
        &redis_many_off,
    );
    let redis_many_auto = median(auto);
    row(
        "redis",
        "distinct keys, lease auto (median of 4)",
        &redis_many_auto,
    );

    assert!(
        redis_over.local_share >= 0.95,
        "hot key over its limit: {:.1} % local",
        redis_over.local_share * 100.0
    );
    assert!(
        redis_over.script_calls_per_call <= 0.05,
        "hot key over its limit: {:.3} script calls per call",
        redis_over.script_calls_per_call
    );
    assert!(
        redis_over.calls_per_second >= 0.8 * memory_over.calls_per_second,
        "hot key over its limit: {:.0}/s on Redis vs {:.0}/s in memory",
        redis_over.calls_per_second,
        memory_over.calls_per_second
    );
    assert!(
        redis_many_auto.calls_per_second >= 0.9 * redis_many_off.calls_per_second,
        "distinct keys: lease auto {:.0}/s vs off {:.0}/s",
        redis_many_auto.calls_per_second,
        redis_many_off.calls_per_second
    );
    memory.stop().await;
    remote.stop().await;
}
