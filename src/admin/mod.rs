//! The admin HTTP port: health and readiness, status, metrics, the rule dump and the
//! reference's `POST /json` endpoint. Read-only views over the service's state.

pub mod json;
mod usage;

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::lifecycle::Lifecycle;
use crate::proto::rls::rate_limit_response::Code;
use crate::service::Service;
use crate::store::Store;
use crate::telemetry::Metrics;
use crate::xds::XdsState;

/// What the admin handlers read.
pub(crate) struct AdminState<S> {
    /// The rate limit service (`/json`, rules).
    pub(crate) service: Arc<Service<S>>,
    /// Metrics to expose.
    pub(crate) metrics: Arc<Metrics>,
    /// Readiness and drain state.
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// Serve `POST /explain` (it reveals descriptor values).
    pub(crate) debug_endpoints: bool,
    /// The xDS client's state, when rules come over xDS.
    pub(crate) xds: Option<Arc<XdsState>>,
}

/// The admin router.
pub(crate) fn router<S: Store>(state: Arc<AdminState<S>>) -> Router {
    let mut router = Router::new();
    if state.debug_endpoints {
        router = router.route("/explain", post(explain::<S>));
    }
    router
        .route("/healthcheck", get(healthcheck::<S>))
        .route("/readyz", get(readyz::<S>))
        .route("/livez", get(|| async { "OK" }))
        .route("/status", get(status::<S>))
        .route("/metrics", get(metrics::<S>))
        .route("/rlconfig", get(rlconfig::<S>))
        .route("/json", post(json_check::<S>))
        .route("/usage", get(usage::usage::<S>))
        .route("/debug/shadow", get(debug_shadow::<S>))
        .route("/debug/hotkeys", get(debug_hotkeys::<S>))
        .with_state(state)
}

/// A router serving only the Prometheus metrics, at `path` (the reference's
/// `USE_PROMETHEUS` listener): the same registry as the admin port's `/metrics`.
pub(crate) fn metrics_router(metrics: Arc<Metrics>, path: &str) -> Router {
    Router::new()
        .route(path, get(prometheus_metrics))
        .with_state(metrics)
}

/// The metrics of [`metrics_router`].
async fn prometheus_metrics(State(metrics): State<Arc<Metrics>>) -> Response {
    encoded(&metrics)
}

/// The registry in the OpenMetrics text format.
fn encoded(metrics: &Metrics) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
        .into_response()
}

/// Whether the service should receive traffic: rules loaded and not draining. Store
/// health is deliberately not part of it (per-rule failure modes handle an outage).
fn ready<S: Store>(state: &AdminState<S>) -> bool {
    state.lifecycle.is_serving()
}

/// The reference's health check: 200 `OK`, or 500 when not serving.
async fn healthcheck<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    if ready(&state) {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK").into_response()
    }
}

/// Kubernetes readiness: 200 when serving, 503 otherwise.
async fn readyz<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    if ready(&state) {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

/// `/status`: versions, rules, the last reload, the store, uptime (DESIGN §1).
async fn status<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    let rules = state.service.rules();
    let current = rules.current();
    let report = rules.last_report();
    let time = |time: SystemTime| humantime::format_rfc3339_seconds(time).to_string();
    let result = match (&report.changed_at, report.errors.is_empty()) {
        (None, _) => None,
        (Some(_), true) => Some("success"),
        (Some(_), false) => Some("error"),
    };
    let store = state.service.limiter().store();
    let store_status = store.status();
    let body = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "ready": ready(&state),
        "draining": state.lifecycle.is_draining(),
        "uptime_seconds": state.lifecycle.uptime().as_secs(),
        "rules": {
            "source": if state.xds.is_some() { "xds" } else { "file" },
            "path": state.xds.is_none().then(|| rules.path().display().to_string()),
            "loaded": current.is_some(),
            "version": current.as_ref().map(|set| set.version),
            "hash": current.as_ref().map(|set| set.hash.clone()),
            "count": current.as_ref().map(|set| set.rules.rule_count()),
            "loaded_at": current.as_ref().map(|set| time(set.loaded_at)),
        },
        "last_reload": {
            "at": report.changed_at.map(time),
            "checked_at": report.checked_at.map(time),
            "result": result,
            "error": report.errors.first().map(|e| e.message.clone()),
            "errors": report.errors,
        },
        "xds": state.xds.as_ref().map(|xds| {
            let mut status = serde_json::json!(xds.status());
            status["server"] = xds.server().into();
            status
        }),
        "store": {
            "kind": store.kind(),
            // Reported, never part of readiness: failure modes handle an outage.
            "health": store_status.health,
            "breaker": store_status.breaker,
            "lua": store_status.lua,
        },
        "ledger": state.service.limiter().ledger().map(|ledger| ledger.status()),
        "regions": store_status.regions,
    });
    axum::Json(body).into_response()
}

/// `/debug/shadow`: per shadow rule, the keys it would have refused.
async fn debug_shadow<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    match state.service.debug_reports() {
        Some(reports) => axum::Json(reports.shadow_json()).into_response(),
        None => not_enabled(),
    }
}

/// `/debug/hotkeys`: the top keys by recent rate.
async fn debug_hotkeys<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    match state.service.debug_reports() {
        Some(reports) => axum::Json(reports.hotkeys_json()).into_response(),
        None => not_enabled(),
    }
}

/// Debug endpoints show descriptor values: 404 unless `--debug-endpoints`.
fn not_enabled() -> Response {
    (
        StatusCode::NOT_FOUND,
        "debug endpoints are off (serve --debug-endpoints)\n",
    )
        .into_response()
}

async fn metrics<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    encoded(&state.metrics)
}

async fn rlconfig<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    let mut text = String::new();
    if let Some(set) = state.service.rules().current() {
        for line in set.rules.dump_lines() {
            text.push_str(&line);
            text.push('\n');
        }
    }
    text.into_response()
}

/// Plain-text error bodies in the reference's exact form.
fn plain(status: StatusCode) -> Response {
    let reason = status.canonical_reason().unwrap_or("Error");
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{reason}\n"),
    )
        .into_response()
}

/// `POST /json`: 200 OK, 429 over limit, 400 bad request (the reference's contract).
async fn json_check<S: Store>(State(state): State<Arc<AdminState<S>>>, body: Bytes) -> Response {
    let Ok(request) = json::parse_request(&body) else {
        return plain(StatusCode::BAD_REQUEST);
    };
    match state.service.should_rate_limit(&request).await {
        Err(_) => plain(StatusCode::BAD_REQUEST),
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let body = json::response_to_json(&response).to_string();
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
    }
}

/// `POST /explain`: same body as `/json`; per descriptor the rule, why it matched, its
/// counter key and what the store would decide now. Charges nothing.
async fn explain<S: Store>(State(state): State<Arc<AdminState<S>>>, body: Bytes) -> Response {
    let Ok(request) = json::parse_request(&body) else {
        return plain(StatusCode::BAD_REQUEST);
    };
    match state.service.explain(&request).await {
        Ok(explanations) => axum::Json(explanations).into_response(),
        Err(error) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{error}\n"),
        )
            .into_response(),
    }
}
