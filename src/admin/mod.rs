//! The admin HTTP port: health and readiness, status, metrics, the rule dump and the
//! reference's `POST /json` endpoint. Read-only views over the service's state.

pub mod json;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::proto::rls::rate_limit_response::Code;
use crate::server::Lifecycle;
use crate::service::Service;
use crate::store::Store;
use crate::telemetry::Metrics;

/// What the admin handlers read.
pub struct AdminState<S> {
    /// The rate limit service (`/json`, rules).
    pub service: Arc<Service<S>>,
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// Readiness and drain state.
    pub lifecycle: Arc<Lifecycle>,
    /// Serve `POST /explain` (it reveals descriptor values).
    pub debug_endpoints: bool,
}

/// The admin router.
pub fn router<S: Store>(state: Arc<AdminState<S>>) -> Router {
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
        .with_state(state)
}

/// Whether the service should receive traffic: rules loaded and not draining.
fn ready<S: Store>(state: &AdminState<S>) -> bool {
    state.service.rules().current().is_some() && !state.lifecycle.is_draining()
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

async fn status<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    let rules = state.service.rules();
    let current = rules.current();
    let report = rules.last_report();
    let seconds = |time: std::time::SystemTime| {
        time.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    let body = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "ready": ready(&state),
        "draining": state.lifecycle.is_draining(),
        "uptime_seconds": state.lifecycle.uptime().as_secs(),
        "rules": {
            "path": rules.path().display().to_string(),
            "loaded": current.is_some(),
            "version": current.as_ref().map(|set| set.version),
            "hash": current.as_ref().map(|set| set.hash.clone()),
            "count": current.as_ref().map(|set| set.rules.rule_count()),
            "loaded_at_unix": current.as_ref().map(|set| seconds(set.loaded_at)),
            "last_reload": {
                "at_unix": report.at.map(seconds),
                "result": if report.errors.is_empty() { "success" } else { "error" },
                "errors": report.errors,
            },
        },
        "store": {
            "kind": state.service.limiter().store().kind(),
        },
    });
    axum::Json(body).into_response()
}

async fn metrics<S: Store>(State(state): State<Arc<AdminState<S>>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
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
