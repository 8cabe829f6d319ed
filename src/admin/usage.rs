//! `GET /usage?domain=D&descriptor=k=v,k2=v2`: a descriptor's usage in the current
//! window, per limit, from the store and the usage ledger; charges nothing.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AdminState;
use crate::rules::Entry;
use crate::store::Store;

/// The query string.
#[derive(Debug, serde::Deserialize)]
pub(super) struct UsageQuery {
    domain: String,
    /// `key=value,key2=value2` (a value cannot hold a comma here).
    descriptor: String,
}

/// `GET /usage`.
pub(super) async fn usage<S: Store>(
    State(state): State<Arc<AdminState<S>>>,
    Query(query): Query<UsageQuery>,
) -> Response {
    if state.service.limiter().ledger().is_none() {
        return text(
            StatusCode::NOT_FOUND,
            "usage needs a ledger (serve --ledger-url)",
        );
    }
    let mut entries = Vec::new();
    for item in query.descriptor.split(',') {
        match item.split_once('=') {
            Some((key, value)) if !key.is_empty() => entries.push(Entry { key, value }),
            _ => {
                return text(
                    StatusCode::BAD_REQUEST,
                    "descriptor: want key=value,key2=value2",
                )
            }
        }
    }
    match state.service.usage(&query.domain, &entries).await {
        Ok(Some(usage)) => axum::Json(usage).into_response(),
        Ok(None) => text(StatusCode::SERVICE_UNAVAILABLE, "no rules loaded"),
        Err(error) => text(StatusCode::SERVICE_UNAVAILABLE, &error.to_string()),
    }
}

fn text(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}
