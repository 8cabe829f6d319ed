//! Fuzz target: arbitrary bytes as a rule file → `Rules::compile` (rules or errors).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| support::fuzz::config(data));
