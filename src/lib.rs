//! Sluice: a global rate limit service for Envoy.
//!
//! The request path, module by module: [`service`] (gRPC) validates a request →
//! [`rules`] turns each descriptor into checks → [`limiter`] answers them from local
//! layers or the [`store`] → [`algorithm`] holds the pure math every store runs.

pub mod algorithm;
pub mod proto;
pub mod rules;
