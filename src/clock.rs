//! Time sources. Every stateful component takes a [`Clock`], so tests can drive time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::algorithm::Micros;

/// A source of the current time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Micros;
}

/// Wall-clock anchored once at start, then advanced by the monotonic clock: windows
/// align to the epoch like the reference's, and the clock never steps back.
#[derive(Debug)]
pub struct SystemClock {
    /// Wall-clock time at `anchor`.
    anchor_micros: Micros,
    /// Monotonic instant matching `anchor_micros`.
    anchor: Instant,
}

impl SystemClock {
    /// Anchors a new clock at the current wall-clock time.
    #[allow(clippy::disallowed_methods)] // the one place that reads the wall clock
    pub fn new() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Self {
            anchor_micros: wall,
            anchor: Instant::now(),
        }
    }

    /// A shared system clock.
    pub fn shared() -> Arc<dyn Clock> {
        Arc::new(Self::new())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        self.anchor_micros + self.anchor.elapsed().as_micros() as u64
    }
}

/// A clock that moves only when told to: for tests and reproducible tools.
#[derive(Debug, Default)]
pub struct ManualClock {
    /// Current time.
    now: AtomicU64,
}

impl ManualClock {
    /// A clock reading `now`.
    pub fn new(now: Micros) -> Self {
        Self {
            now: AtomicU64::new(now),
        }
    }

    /// Sets the time (may step back, as real clocks sometimes do).
    pub fn set(&self, now: Micros) {
        self.now.store(now, Ordering::SeqCst);
    }

    /// Moves the time forward by `micros`.
    pub fn advance(&self, micros: Micros) {
        self.now.fetch_add(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}
