//! Entry points for the fuzz harness (`tests/support/src/fuzz.rs`, the targets in
//! `fuzz/`): inputs Sluice takes from outside whose parsers are crate-private. Built
//! with the `test-hooks` feature only; each returns what it made of the input, or why
//! it refused it, and must never panic.

use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::types::Value;

use crate::proto::rls::RateLimitRequest;
use crate::rules::{LoadOptions, Rules};
use crate::store::redis::{client, functions, lease, script};

/// Every decoder of a Redis reply: `reply` as the main script's answer for `limits`
/// limits and as the lease script's, and `error` as an error reply (redirects,
/// missing scripts or functions, the error classes that pick a failure mode).
pub fn redis_reply(reply: &Value, limits: usize, error: &str) {
    let _ = script::decode(reply, limits);
    let _ = lease::decode(reply.clone());
    for kind in [
        ErrorKind::Unknown,
        ErrorKind::Cluster,
        ErrorKind::IO,
        ErrorKind::Timeout,
        ErrorKind::Auth,
        ErrorKind::Routing,
    ] {
        let error = FredError::new(kind, error.to_owned());
        let _ = client::redirect_of(&error);
        let _ = client::is_noscript(&error);
        let _ = client::classify(&error, Duration::from_millis(20)).kind();
        let details = error.details();
        let _ = functions::is_function_missing(details)
            || functions::refuses_functions(details)
            || functions::refuses_library(details)
            || functions::already_loaded(details);
    }
}

/// xDS `RateLimitConfig` resources as rule files, compiled: the number of rules, or
/// why the resources or the rules were refused.
pub fn xds_resources(resources: &[prost_types::Any]) -> Result<usize, String> {
    let files = crate::xds::resource::rule_files(resources).map_err(|e| e.to_string())?;
    Rules::compile(&files, &LoadOptions::default())
        .map(|rules| rules.rule_count())
        .map_err(|errors| {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            errors.join("; ")
        })
}

/// A `POST /json` body on the admin port as a request, or why it is not one.
pub fn json_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    crate::admin::json::parse_request(body).map_err(|e| e.to_string())
}
