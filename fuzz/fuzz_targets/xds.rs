//! Fuzz target: protobuf bytes → an xDS `RateLimitConfig` resource → rule files →
//! compiled rules (rules or errors, never a panic).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = support::fuzz::xds(data);
});
