//! End-to-end tests with real tools (Envoy, Helm's engine, Kubernetes schemas), found in
//! the virtualenv `scripts/test` installs: Envoy in front of Sluice (memory and Redis
//! stores, mTLS, HTTP/2 limits, the book's patterns beyond requests per second), the Helm
//! chart, its alerts and dashboard (promtool), and the Istio patches.

mod beyond_rps;
mod connection_age;
mod envoy;
mod envoy_gateway;
mod helm;
mod http2_limits;
mod istio;
mod monitoring;
mod tls_envoy;
mod xds_envoy;
