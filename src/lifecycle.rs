//! The process's readiness and drain state: rules loaded, draining or not, uptime. The
//! admin port reads it, the gRPC health service mirrors it, the server drives it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Readiness and drain state shared by the admin port and the gRPC health service.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    /// Set at the start of shutdown: readiness turns false at once.
    draining: AtomicBool,
    /// When the server started.
    started: Instant,
    /// Whether to receive traffic: rules loaded and not draining. Mirrored into the
    /// gRPC health service.
    serving: watch::Sender<bool>,
}

impl Lifecycle {
    /// A lifecycle starting now.
    pub(crate) fn new() -> Self {
        Self {
            draining: AtomicBool::new(false),
            started: Instant::now(),
            serving: watch::Sender::new(false),
        }
    }

    /// Records whether rules are loaded; readiness follows unless draining.
    pub(crate) fn set_rules_loaded(&self, loaded: bool) {
        // Decided under the channel's lock, so a drain in between cannot be undone.
        self.serving.send_if_modified(|serving| {
            let next = loaded && !self.is_draining();
            std::mem::replace(serving, next) != next
        });
    }

    /// Whether to receive traffic now.
    pub(crate) fn is_serving(&self) -> bool {
        *self.serving.borrow()
    }

    /// Follows readiness changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.serving.subscribe()
    }

    /// Whether shutdown has begun.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Time since start.
    pub(crate) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Begins shutdown: readiness turns false at once and stays false.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.serving
            .send_if_modified(|serving| std::mem::replace(serving, false));
    }
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}
