//! The one way to make a [`Service`] and its [`Limiter`]: the server, the tests, the
//! benches and the fuzz harness all build through here, so they wire the same parts,
//! and each can inject a clock (a manual one in tests, the system clock in production).

use std::sync::Arc;

use super::debug::DebugReports;
use super::{RequestBounds, ResponseOptions, Service};
use crate::clock::{Clock, SystemClock};
use crate::limiter::{Limiter, LimiterSettings};
use crate::rules::live::LiveRules;
use crate::store::Store;
use crate::telemetry::Metrics;

/// Builds a [`Service`]: every part but the store and the rules has a default.
pub struct ServiceBuilder<S> {
    store: S,
    rules: Arc<LiveRules>,
    clock: Option<Arc<dyn Clock>>,
    limiter: LimiterSettings,
    response: ResponseOptions,
    bounds: RequestBounds,
    metrics: Option<Arc<Metrics>>,
    debug: Option<Arc<DebugReports>>,
    ledger: Option<Arc<crate::ledger::Ledger>>,
}

impl<S: Store> ServiceBuilder<S> {
    /// A service over `store` under `rules`, with the system clock, default settings and
    /// its own metrics until told otherwise.
    pub(crate) fn new(store: S, rules: Arc<LiveRules>) -> Self {
        Self {
            store,
            rules,
            clock: None,
            limiter: LimiterSettings::default(),
            response: ResponseOptions::default(),
            bounds: RequestBounds::default(),
            metrics: None,
            debug: None,
            ledger: None,
        }
    }

    /// The limiter's clock (the store keeps its own, given when it was made).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The limiter's request semantics.
    pub fn limiter_settings(mut self, settings: LimiterSettings) -> Self {
        self.limiter = settings;
        self
    }

    /// The usage ledger, where units admitted for `ledger: true` limits are recorded.
    pub(crate) fn ledger(mut self, ledger: Option<Arc<crate::ledger::Ledger>>) -> Self {
        self.ledger = ledger;
        self
    }

    /// Response shaping.
    pub fn response(mut self, options: ResponseOptions) -> Self {
        self.response = options;
        self
    }

    /// Request bounds.
    pub fn bounds(mut self, bounds: RequestBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Where the limiter and the service count (shared with `/metrics`).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Records the debug reports (`/debug/shadow`, `/debug/hotkeys`) into `reports`.
    pub(crate) fn debug_reports(mut self, reports: Option<Arc<DebugReports>>) -> Self {
        self.debug = reports;
        self
    }

    /// The service, with its limiter.
    pub fn build(self) -> Service<S> {
        let metrics = self.metrics.unwrap_or_else(|| Arc::new(Metrics::new()));
        let clock = self.clock.unwrap_or_else(SystemClock::shared);
        let limiter =
            Limiter::new(self.store, clock, self.limiter, metrics.clone()).with_ledger(self.ledger);
        Service {
            limiter,
            rules: self.rules,
            options: self.response,
            bounds: self.bounds,
            metrics,
            debug: self.debug,
        }
    }
}
