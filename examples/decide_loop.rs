//! A fixed number of in-process decisions (`Service::should_rate_limit`, memory store),
//! for instruction counting under valgrind's callgrind:
//!
//! ```sh
//! valgrind --tool=callgrind --toggle-collect='decide_loop::run*' \
//!     target/release/examples/decide_loop one 100000
//! ```
//!
//! Modes: `one` (one key under its limit) or `many` (100 000 distinct keys in turn).

#[path = "../benches/common/mod.rs"]
mod common;

use sluice::proto::common::{rate_limit_descriptor::Entry, RateLimitDescriptor};
use sluice::proto::rls::RateLimitRequest;

fn request(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

#[inline(never)]
fn run(fixture: &common::Fixture, requests: &[RateLimitRequest], iterations: usize) -> usize {
    let mut ok = 0;
    for i in 0..iterations {
        let request = &requests[i % requests.len()];
        let response = futures::executor::block_on(fixture.service.should_rate_limit(request));
        ok += usize::from(response.is_ok());
    }
    ok
}

/// Warm-up outside `run`, so callgrind's toggle counts only the measured loop.
#[inline(never)]
fn warm(fixture: &common::Fixture, requests: &[RateLimitRequest]) {
    for request in requests {
        let _ = futures::executor::block_on(fixture.service.should_rate_limit(request));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "one".into());
    let iterations: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let fixture = common::Fixture::new(
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket}\n",
    );
    let requests: Vec<RateLimitRequest> = match mode.as_str() {
        "many" => (0..100_000)
            .map(|u| request("user", &u.to_string()))
            .collect(),
        _ => vec![request("user", "alice")],
    };
    warm(&fixture, &requests);
    let ok = run(&fixture, &requests, iterations);
    println!("{ok} of {iterations} decided");
}
