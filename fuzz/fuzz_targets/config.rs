//! Fuzz target: arbitrary bytes as a rule file → `Rules::compile` (rules or errors).
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::config(data));
