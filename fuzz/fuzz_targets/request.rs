//! Fuzz target: protobuf bytes → `RateLimitRequest` → `Service::should_rate_limit`
//! with a memory store (an answer or an error).
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::request(data);
});
