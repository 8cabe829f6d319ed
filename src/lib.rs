//! Sluice: a global rate limit service for Envoy.
//!
//! The request path, module by module: [`service`] (gRPC) validates a request →
//! [`rules`] turns each descriptor into checks → [`limiter`] answers them from local
//! layers or the [`store`] → [`algorithm`] holds the pure math every store runs.
//! [`server`] wires them; [`admin`] is the HTTP port; [`settings`] reads flags and env.

pub mod admin;
pub mod algorithm;
#[cfg(feature = "bench")]
pub mod bench;
pub mod clock;
pub(crate) mod codec;
pub mod commands;
pub mod exchange;
#[cfg(feature = "test-hooks")]
pub mod fuzzing;
pub(crate) mod jitter;
pub(crate) mod lanes;
pub mod ledger;
pub(crate) mod lifecycle;
pub mod limiter;
pub mod listener;
pub(crate) mod pem;
pub mod proto;
pub mod regions;
pub(crate) mod reloading;
pub mod rules;
pub mod server;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod xds;

#[cfg(test)]
mod layering;
