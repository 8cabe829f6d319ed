//! Fuzz target: bytes → the admin port's `POST /json` body → `RateLimitRequest` →
//! `Service::should_rate_limit` with a memory store (an answer or an error).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    support::fuzz::json(data);
});
