//! Fuzz target: bytes → a Redis reply value tree and an error reply → every decoder of
//! Redis replies (script and lease results, redirects, error classes), never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    support::fuzz::redis_reply(data);
});
