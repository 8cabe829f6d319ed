//! Tests of behaviour without Redis nor a network peer: algorithm properties, the
//! shared conformance cases, the hot-key layers replayed against the store and the fuzz
//! targets' smoke run.

mod algorithm_props;
mod conformance_rules;
mod conformance_service;
mod debt_props;
mod delay_props;
mod fuzz_smoke;
mod hotkeys_replay;
mod quotas;
mod refund_props;
