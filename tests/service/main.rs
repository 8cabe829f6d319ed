//! Black-box tests of one Sluice server, in-process or as the `sluice` binary: the gRPC
//! service, the admin port, the CLI, rule reloads, the process lifecycle, TLS, the bench
//! tool and, with the `otel` feature, OTLP trace export.

mod admin;
#[cfg(feature = "bench")]
mod bench_tool;
mod beyond;
mod cli;
mod drop_in;
mod lifecycle;
#[cfg(feature = "otel")]
mod otlp;
mod reload;
mod service;
mod tls;
mod xds;
