//! Allocations per decision: `Service::should_rate_limit` on the memory store, counted
//! by a counting global allocator, for a request whose key is already stored (the steady
//! state of a busy key) and for one whose key is new.
//!
//! The bound is the allocations the answer itself must own, plus the request's borrowed
//! view; see `ALLOWED` below.

use std::sync::Arc;

use sluice::clock::{Clock, ManualClock};
use sluice::proto::rls::RateLimitRequest;
use sluice::store::memory::MemoryStore;
use stats_alloc::Region;

use crate::{alone, GLOBAL};
use support::{service_with, user_request};

const RULES: &str = "domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: token_bucket}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000000}
";

/// Allocations per request, the most a steady-state one-descriptor decision may make,
/// each a vector sized by the request: the request's borrowed view (descriptors, and
/// entries per descriptor: 2), the limiter's verdicts, pending descriptors, store
/// checks, limits per check and decisions (5), and the response's statuses (1).
const ALLOWED: u64 = 8;

/// Most bytes those allocations may take per request: measured 464 (688 while a matched
/// rule was a `Cow<Rule>`, a whole rule inline in every pending descriptor and verdict;
/// 1 336 while the pending-descriptor and store-check vectors grew to room for four). On
/// the Redis store they live across the round trip.
const MAX_BYTES: u64 = 640;

#[test]
fn allocations_per_request_are_bounded() {
    let _alone = alone();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_700_000_000_000_000));
    let (_rules_dir, service) =
        service_with(RULES, MemoryStore::new(100_000, clock.clone()), clock);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let hot = user_request("alice");
    let fresh: Vec<RateLimitRequest> = (0..1000).map(|i| user_request(&format!("u{i}"))).collect();
    // Warm up: metric families, the stored key, lazily built statics.
    for _ in 0..10 {
        runtime
            .block_on(service.should_rate_limit(&hot))
            .expect("decided");
    }

    // The allocator counts the whole process, so a background thread (the rules
    // watcher, the test harness) can add a stray allocation to a batch. A request's own
    // allocations are in every batch: the quietest batch is the request's cost.
    const ROUNDS: u64 = 1000;
    const BATCHES: usize = 5;
    let hot_stats = (0..BATCHES)
        .map(|_| {
            let region = Region::new(GLOBAL);
            for _ in 0..ROUNDS {
                let response = runtime
                    .block_on(service.should_rate_limit(&hot))
                    .expect("decided");
                std::hint::black_box(response);
            }
            region.change()
        })
        .min_by_key(|stats| stats.allocations)
        .expect("batches");
    let hot_per_request = hot_stats.allocations as f64 / ROUNDS as f64;

    let region = Region::new(GLOBAL);
    for request in &fresh {
        let response = runtime
            .block_on(service.should_rate_limit(request))
            .expect("decided");
        std::hint::black_box(response);
    }
    let fresh_stats = region.change();
    let fresh_per_request = fresh_stats.allocations as f64 / fresh.len() as f64;

    println!(
        "allocations per request: stored key {hot_per_request:.2} ({} bytes), new key {fresh_per_request:.2} (map growth amortised)",
        hot_stats.bytes_allocated as u64 / ROUNDS
    );
    assert!(
        hot_per_request <= ALLOWED as f64,
        "{hot_per_request} allocations per request, more than the {ALLOWED} justified"
    );
    let hot_bytes = hot_stats.bytes_allocated as u64 / ROUNDS;
    assert!(
        hot_bytes <= MAX_BYTES,
        "{hot_bytes} bytes allocated per request, more than {MAX_BYTES}"
    );
    // A new key may also grow the store's shard map (amortised, well under one per request).
    assert!(
        fresh_per_request <= ALLOWED as f64 + 1.0,
        "{fresh_per_request} allocations per new-key request"
    );
}
