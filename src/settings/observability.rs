//! What `serve` exports about itself: Prometheus metrics on a port of their own
//! (`--prometheus-addr`, or the reference's `USE_PROMETHEUS`, `PROMETHEUS_ADDR`,
//! `PROMETHEUS_PATH`) and OTLP traces (`--otlp-endpoint`, or `TRACING_ENABLED` with
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, `TRACING_EXPORTER_PROTOCOL`, `TRACING_SERVICE_*` and
//! `TRACING_SAMPLING_RATE`). Neither changes what is limited, so a request Sluice cannot
//! carry out is a startup warning, not a refusal.

use std::net::{Ipv4Addr, SocketAddr};

use super::cli::ServeArgs;
use super::reference::Reference;
use super::{invalid, SettingsError};
use crate::telemetry::{OtlpProtocol, TraceExport};

/// Where the Prometheus metrics are served besides the admin port's `/metrics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrometheusSettings {
    /// Listener address.
    pub addr: SocketAddr,
    /// Path of the metrics (starts with `/`).
    pub(crate) path: String,
}

/// The reference's default `PROMETHEUS_ADDR`.
const REFERENCE_PROMETHEUS_ADDR: &str = ":9090";

/// The collector the reference's exporter uses without `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (the OTLP/gRPC default).
const DEFAULT_OTLP_GRPC_ENDPOINT: &str = "http://localhost:4317";
/// The same over OTLP/HTTP.
const DEFAULT_OTLP_HTTP_ENDPOINT: &str = "http://localhost:4318";

/// The Prometheus listener: the flag, else `PROMETHEUS_ADDR` when `USE_PROMETHEUS` is
/// true, else none. On the admin address (`http_addr`) the admin listener serves them,
/// at `/metrics` only.
pub(crate) fn prometheus(
    args: &ServeArgs,
    env: Reference<'_>,
    http_addr: SocketAddr,
) -> Result<Option<PrometheusSettings>, SettingsError> {
    let addr = match args.prometheus_addr {
        Some(addr) => addr,
        None if env.bool("USE_PROMETHEUS")?.unwrap_or(false) => {
            let text = env
                .get("PROMETHEUS_ADDR")
                .unwrap_or_else(|| REFERENCE_PROMETHEUS_ADDR.into());
            go_listen_addr(&text).ok_or_else(|| {
                invalid(
                    "PROMETHEUS_ADDR",
                    &text,
                    "expected host:port or :port with an IP address or localhost",
                )
            })?
        }
        None => return Ok(None),
    };
    let (name, path) = match &args.prometheus_path {
        Some(path) => ("prometheus-path", path.clone()),
        None => (
            "PROMETHEUS_PATH",
            env.get("PROMETHEUS_PATH")
                .unwrap_or_else(|| "/metrics".into()),
        ),
    };
    if !path.starts_with('/') {
        return Err(invalid(name, &path, "expected a path starting with /"));
    }
    if addr == http_addr && path != "/metrics" {
        return Err(invalid(
            name,
            &path,
            "on the admin address the metrics are served at /metrics: use that path or another address",
        ));
    }
    Ok(Some(PrometheusSettings { addr, path }))
}

/// An address in Go's listen syntax: `:port` is every IPv4 interface, `localhost` the
/// loopback.
fn go_listen_addr(text: &str) -> Option<SocketAddr> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    match host {
        "" => Some((Ipv4Addr::UNSPECIFIED, port).into()),
        "localhost" => Some((Ipv4Addr::LOCALHOST, port).into()),
        _ => text.parse().ok(),
    }
}

/// Trace export. The flag exports over OTLP/gRPC.
/// Without it: `TRACING_ENABLED=true` exports to `OTEL_EXPORTER_OTLP_ENDPOINT` over
/// `TRACING_EXPORTER_PROTOCOL` (`http`, the reference's default: OTLP/HTTP to the
/// endpoint's `/v1/traces`; or `grpc`); `TRACING_ENABLED=false` exports nothing;
/// `TRACING_ENABLED` unset exports over gRPC to `OTEL_EXPORTER_OTLP_ENDPOINT` when it is
/// set (Sluice's own rule before it read `TRACING_ENABLED`).
pub(crate) fn tracing(
    args: &ServeArgs,
    env: Reference<'_>,
) -> Result<Option<TraceExport>, SettingsError> {
    let sampling_ratio = sampling_ratio(env)?;
    let grpc = match env.get("TRACING_EXPORTER_PROTOCOL") {
        None => false,
        Some(protocol) => match protocol.trim().to_ascii_lowercase().as_str() {
            "grpc" => true,
            "http" | "" => false,
            _ => {
                return Err(invalid(
                    "TRACING_EXPORTER_PROTOCOL",
                    &protocol,
                    "expected http or grpc",
                ))
            }
        },
    };
    // The OTLP/HTTP traces URL, when that is the protocol.
    let mut http = None;
    let reference_endpoint = env
        .get("OTEL_EXPORTER_OTLP_ENDPOINT")
        .filter(|endpoint| !endpoint.is_empty());
    let endpoint = match (args.otlp_endpoint.clone(), env.bool("TRACING_ENABLED")?) {
        (Some(flag), _) => Some(flag).filter(|endpoint| !endpoint.is_empty()),
        (None, Some(false)) => None,
        (None, Some(true)) if grpc => {
            Some(reference_endpoint.unwrap_or_else(|| DEFAULT_OTLP_GRPC_ENDPOINT.into()))
        }
        (None, Some(true)) => {
            let base = reference_endpoint.unwrap_or_else(|| DEFAULT_OTLP_HTTP_ENDPOINT.into());
            http = Some(format!(
                "{}/v1/traces",
                with_scheme(base).trim_end_matches('/')
            ));
            http.clone()
        }
        (None, None) => reference_endpoint,
    };
    let Some(endpoint) = endpoint else {
        return Ok(None);
    };
    let text = |name: &str| env.get(name).filter(|value| !value.is_empty());
    Ok(Some(TraceExport {
        protocol: if http.is_some() {
            OtlpProtocol::Http
        } else {
            OtlpProtocol::Grpc
        },
        endpoint: with_scheme(endpoint),
        service_name: text("TRACING_SERVICE_NAME").unwrap_or_else(|| "sluice".into()),
        service_namespace: text("TRACING_SERVICE_NAMESPACE"),
        service_instance_id: text("TRACING_SERVICE_INSTANCE_ID"),
        sampling_ratio,
    }))
}

/// `TRACING_SAMPLING_RATE`, the fraction of traces kept (default 1: all).
fn sampling_ratio(env: Reference<'_>) -> Result<f64, SettingsError> {
    let Some(text) = env.get("TRACING_SAMPLING_RATE") else {
        return Ok(1.0);
    };
    match text.trim().parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(invalid(
            "TRACING_SAMPLING_RATE",
            &text,
            "expected a fraction between 0.0 and 1.0",
        )),
    }
}

/// An endpoint with a scheme (`host:port` as the reference accepts it becomes
/// `http://host:port`).
fn with_scheme(endpoint: String) -> String {
    if endpoint.contains("://") {
        endpoint
    } else {
        format!("http://{endpoint}")
    }
}
