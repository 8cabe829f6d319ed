//! What the xDS client has done, for `/status` and `/metrics`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::telemetry::{Metrics, ResultLabel};

/// The client's state, shared with the admin port.
#[derive(Debug)]
pub(crate) struct XdsState {
    /// The management server, as configured.
    server: String,
    /// What happened so far.
    status: Mutex<XdsStatus>,
    /// `sluice_xds_connected`.
    connected: Gauge,
    /// `sluice_xds_responses_total{result}`.
    responses: Family<ResultLabel, Counter>,
}

/// The state as `/status` shows it.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(crate) struct XdsStatus {
    /// Whether a stream is open.
    pub(crate) connected: bool,
    /// Connection attempts that failed or streams that ended, in a row.
    pub(crate) failures: u32,
    /// The last error of the connection, if any.
    pub(crate) last_error: Option<String>,
    /// The version of the last accepted response.
    pub(crate) acked_version: Option<String>,
    /// When it was accepted (RFC 3339).
    pub(crate) acked_at: Option<String>,
    /// The last rejected response, and why.
    pub(crate) last_nack: Option<Nack>,
    /// Responses received.
    pub(crate) responses: u64,
}

/// A rejected response.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Nack {
    /// The response's version.
    pub(crate) version: String,
    /// The response's nonce.
    pub(crate) nonce: String,
    /// Why it was rejected (sent as the NACK's error detail).
    pub(crate) reason: String,
    /// When (RFC 3339).
    pub(crate) at: String,
}

// === impl XdsState ===

impl XdsState {
    /// A state for a client of `server`, counted in `metrics`.
    pub(crate) fn new(server: &str, metrics: &Metrics) -> Arc<Self> {
        Arc::new(Self {
            server: server.to_owned(),
            status: Mutex::new(XdsStatus::default()),
            connected: metrics.xds_connected.clone(),
            responses: metrics.xds_responses.clone(),
        })
    }

    /// The management server.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    /// A copy of the state.
    pub(crate) fn status(&self) -> XdsStatus {
        self.lock().clone()
    }

    /// The version of the last accepted response (empty before the first).
    pub(crate) fn acked_version(&self) -> String {
        self.lock().acked_version.clone().unwrap_or_default()
    }

    /// A stream is open.
    pub(crate) fn connected(&self) {
        let mut status = self.lock();
        status.connected = true;
        status.failures = 0;
        status.last_error = None;
        self.connected.set(1);
    }

    /// The connection failed or the stream ended.
    pub(crate) fn disconnected(&self, error: String) {
        let mut status = self.lock();
        status.connected = false;
        status.failures = status.failures.saturating_add(1);
        status.last_error = Some(error);
        self.connected.set(0);
    }

    /// A response was accepted.
    pub(crate) fn acked(&self, version: &str) {
        let mut status = self.lock();
        status.responses += 1;
        status.acked_version = Some(version.to_owned());
        status.acked_at = Some(now());
        self.responses
            .get_or_create(&ResultLabel { result: "ack" })
            .inc();
    }

    /// A response was rejected.
    pub(crate) fn nacked(&self, version: &str, nonce: &str, reason: &str) {
        let mut status = self.lock();
        status.responses += 1;
        status.last_nack = Some(Nack {
            version: version.to_owned(),
            nonce: nonce.to_owned(),
            reason: reason.to_owned(),
            at: now(),
        });
        self.responses
            .get_or_create(&ResultLabel { result: "nack" })
            .inc();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, XdsStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Wall-clock time for the report.
#[allow(clippy::disallowed_methods)]
fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}
