//! Exact under concurrency, as users run it: 2, 4 and 8 `sluice serve` *processes*, each
//! started fresh with nothing but `--store` and `--redis-url` (the default 20 ms store
//! deadline and `failure_mode: open`), on one Redis and, separately, on a 3-master
//! cluster. 5 000 gRPC calls go round-robin across them on one key, 64 or 256 in flight
//! from the moment they are up, against a limit of 1 000: the store admits exactly
//! 1 000 for every algorithm (333 with hits_addend 3), with unit minute and day.
//!
//! What this catches: any call answered by the failure mode. A store call that misses
//! its deadline is admitted under `open` even when Redis, which still runs it, refuses
//! it; five in a row open the breaker, and then every call is admitted. Two causes did
//! that here: a sliding log read and rewrote its whole log in Redis on every call (a
//! full log cost ~1.5 ms of Redis per call, so a few instances' calls queued behind each
//! other passed 20 ms: 2 000–3 300 admitted of 1 000), and a fresh instance's first
//! burst waited behind connecting and `FUNCTION LOAD` (every algorithm, 1 400–1 900 of
//! 1 000). Instances in one process share a machine's scheduling but not its start-up,
//! so only processes show the second.
//!
//! Also 1 000 keys of limit 2 per algorithm at once on 8 instances with a 1 s deadline,
//! where no call may take the failure mode: batches of many keys (one script call per
//! slot in a cluster) exact.
//!
//! Token bucket and GCRA refill as time passes: with unit minute they may admit what
//! refilled during the run (1 000 per minute, about 17 per second), and no more.

use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice::algorithm::AlgorithmKind;
use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rls::RateLimitRequest;
use support::fault::serial;
use support::process::SluiceProcess;
use support::redis::{RedisCluster, RedisServer};
use tonic::transport::Channel;

/// Every algorithm's rule-file name.
const ALGORITHMS: [&str; 5] = {
    let mut names = [""; 5];
    let mut i = 0;
    while i < AlgorithmKind::ALL.len() {
        names[i] = AlgorithmKind::ALL[i].as_str();
        i += 1;
    }
    names
};
const UNITS: [&str; 2] = ["minute", "day"];
const CALLS: usize = 5_000;
const LIMIT: u64 = 1_000;
/// Failure-mode answers tolerated in one case at the default deadline (2 % of its
/// calls): see [`judge`].
const MAX_FAILURE_MODE_ANSWERS: u64 = 100;
/// The store deadline of the many-keys cases, which test batching, not the deadline: a
/// cluster splits a batch of distinct keys into a script call per slot, and eight
/// debug-built processes on two cores then miss 20 ms now and then.
const MANY_KEYS_TIMEOUT: &str = "1s";

/// One case of the sweep.
#[derive(Clone, Copy, Debug)]
struct Case {
    algorithm: &'static str,
    unit: &'static str,
    instances: usize,
    in_flight: usize,
    hits: u32,
}

/// The cases: for the sliding log, every instance count, in-flight level and cost (the
/// issue's whole matrix); for the others, the hardest load (8 instances, 256 in flight)
/// with both costs.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for algorithm in ALGORITHMS {
        for unit in UNITS {
            for hits in [1, 3] {
                let shapes: &[(usize, usize)] = if algorithm == "sliding_log" {
                    &[(2, 64), (2, 256), (4, 64), (4, 256), (8, 64), (8, 256)]
                } else {
                    &[(8, 256)]
                };
                for &(instances, in_flight) in shapes {
                    cases.push(Case {
                        algorithm,
                        unit,
                        instances,
                        in_flight,
                        hits,
                    });
                }
            }
        }
    }
    cases
}

/// Every rule of the sweep, one per algorithm and unit (key `<algorithm>_<unit>`), and
/// one of limit 2 a day per algorithm for many keys at once (key `few_<algorithm>`).
fn rules() -> String {
    let mut yaml = String::from("domain: exact\ndescriptors:\n");
    for algorithm in ALGORITHMS {
        yaml.push_str(&format!(
            "  - key: few_{algorithm}\n    rate_limit: {{unit: day, requests_per_unit: 2, algorithm: {algorithm}}}\n"
        ));
        for unit in UNITS {
            yaml.push_str(&format!(
                "  - key: {algorithm}_{unit}\n    rate_limit: {{unit: {unit}, requests_per_unit: {LIMIT}, algorithm: {algorithm}}}\n"
            ));
        }
    }
    yaml
}

/// `count` fresh processes on `url` with `extra` flags, each with its client and admin
/// address.
async fn start(
    count: usize,
    config: &std::path::Path,
    store: &str,
    url: &str,
    extra: &[&str],
) -> Vec<(SluiceProcess, RateLimitServiceClient<Channel>, String)> {
    let mut instances = Vec::with_capacity(count);
    let mut flags = vec!["--store", store, "--redis-url", url];
    flags.extend_from_slice(extra);
    for _ in 0..count {
        let (process, grpc, http) = SluiceProcess::serve(config, &flags);
        let client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect gRPC");
        instances.push((process, client, http));
    }
    instances
}

/// Fires `CALLS` calls of `case` round-robin over `clients`, `in_flight` at a time, call
/// `i` on the value `value(i)` of key `key`; returns how many were admitted.
async fn admitted(
    clients: &[RateLimitServiceClient<Channel>],
    case: Case,
    key: &str,
    value: impl Fn(usize) -> String,
) -> u64 {
    futures::stream::iter(0..CALLS)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let request = RateLimitRequest {
                domain: "exact".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.into(),
                        value: value(i),
                    }],
                    limit: None,
                    hits_addend: None,
                    is_negative_hits: false,
                }],
                hits_addend: case.hits,
            };
            async move {
                let response = client.should_rate_limit(request).await.expect("rpc");
                u64::from(response.into_inner().overall_code == Code::Ok as i32)
            }
        })
        .buffer_unordered(case.in_flight)
        .fold(0, |sum, ok| async move { sum + ok })
        .await
}

/// What is wrong with `admitted` calls of `limit` (+ at most `refilled`), when `fallbacks`
/// of them took the failure mode. Every store answer must be exact. A call past the 20 ms
/// deadline is admitted by `failure_mode: open` whatever Redis decided, so it may add one
/// admission; a handful of those are this two-core machine's scheduling (8 debug-built
/// processes and their client on two cores; the host also stops a vCPU for milliseconds
/// now and then), more is the store missing its deadline under this load, which is what
/// admitted 2–3 times the limit before.
fn judge(
    label: &str,
    admitted: u64,
    limit: u64,
    refilled: u64,
    (fallbacks, allowed): (f64, u64),
) -> Option<String> {
    let fallbacks = fallbacks as u64;
    let exact = (limit..=limit + refilled + fallbacks).contains(&admitted);
    (!exact || fallbacks > allowed).then(|| {
        format!(
            "{label}: {admitted} admitted of {limit} (+{refilled} refilled); {fallbacks} calls took the failure mode (at most {allowed} allowed)"
        )
    })
}

/// Calls the failure mode answered, summed over the instances' `/metrics`.
async fn fallbacks(admin: &[String]) -> f64 {
    let mut total = 0.0;
    for http in admin {
        let metrics = support::fetch_metrics(&format!("http://{http}/metrics")).await;
        total += metrics
            .0
            .iter()
            .filter(|(name, _)| name.starts_with("sluice_store_fallback_total"))
            .map(|(_, value)| value)
            .sum::<f64>();
    }
    total
}

async fn sweep(store: &str, url: &str, run: &str) {
    let config = tempfile::tempdir().expect("temp dir");
    support::write_file(config.path(), "exact.yaml", &rules());
    let mut failures = Vec::new();
    for (n, case) in cases().into_iter().enumerate() {
        if case.unit == "minute" {
            // The run stays inside one minute: a fixed window's boundary would double it.
            support::early_in_minute(Duration::from_secs(8)).await;
        }
        // Fresh processes every case: a fresh instance's first burst is part of the load.
        let instances = start(case.instances, config.path(), store, url, &[]).await;
        let clients: Vec<_> = instances.iter().map(|(_, c, _)| c.clone()).collect();
        let admin: Vec<_> = instances.iter().map(|(_, _, h)| h.clone()).collect();
        let started = Instant::now();
        let key = format!("{}_{}", case.algorithm, case.unit);
        let ok = admitted(&clients, case, &key, |_| format!("{run}-{n}")).await;
        let elapsed = started.elapsed();
        let answered_by_failure_mode = fallbacks(&admin).await;
        let limit = LIMIT / u64::from(case.hits);
        // Units refilled while the calls ran (token bucket and GCRA, unit minute), and
        // the one that may be whole by then.
        let refilled = match (case.algorithm, case.unit) {
            ("token_bucket" | "gcra", "minute") => {
                (elapsed.as_secs_f64() * LIMIT as f64 / 60.0).ceil() as u64 / u64::from(case.hits)
                    + 1
            }
            _ => 0,
        };
        let label = format!("{store} {case:?}");
        println!(
            "{label}: {ok} admitted of {limit} (+{refilled} refilled), {answered_by_failure_mode} failure-mode answers, {elapsed:?}"
        );
        failures.extend(judge(
            &label,
            ok,
            limit,
            refilled,
            (answered_by_failure_mode, MAX_FAILURE_MODE_ANSWERS),
        ));
        drop(instances);
        if case.instances == 8 && case.in_flight == 256 && case.hits == 1 && case.unit == "day" {
            // 1 000 keys of limit 2 at once, on 8 fresh instances whose deadline no call
            // misses: every key's batch of checks exact, none answered by the failure mode.
            let instances = start(
                8,
                config.path(),
                store,
                url,
                &["--redis-timeout", MANY_KEYS_TIMEOUT],
            )
            .await;
            let clients: Vec<_> = instances.iter().map(|(_, c, _)| c.clone()).collect();
            let admin: Vec<_> = instances.iter().map(|(_, _, h)| h.clone()).collect();
            let few = admitted(&clients, case, &format!("few_{}", case.algorithm), |i| {
                format!("{run}-{n}-{}", i % 1000)
            })
            .await;
            let fallbacks = fallbacks(&admin).await;
            let label = format!("{store} {}: 1000 keys x limit 2", case.algorithm);
            println!("{label}: {few} admitted of 2000, {fallbacks} failure-mode answers");
            failures.extend(judge(&label, few, 2000, 0, (fallbacks, 0)));
        }
    }
    assert!(failures.is_empty(), "{store}: {failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_one_redis_admit_exactly_the_limit() {
    // One sweep at a time: two sweeps' 16 processes on two cores would measure the
    // machine, not Sluice.
    let _serial = serial().await;
    let redis = RedisServer::start();
    sweep("redis", &redis.url(), "single").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_a_cluster_admit_exactly_the_limit() {
    // One sweep at a time: two sweeps' 16 processes on two cores would measure the
    // machine, not Sluice.
    let _serial = serial().await;
    let cluster = RedisCluster::start();
    sweep("redis-cluster", &cluster.url(), "cluster").await;
}
