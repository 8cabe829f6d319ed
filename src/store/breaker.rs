//! A circuit breaker: after repeated store failures, stop waiting on the store for a
//! while so that every call gets its failure mode at once (DESIGN §7).
//!
//! Closed: calls go through; `failures` consecutive failures, the first of them no more
//! than `window` ago, open it. Open: every call is refused at once until the backoff has
//! passed; then the breaker is half-open and lets exactly one call through as a probe
//! (another one if the probe reports nothing within [`PROBE_STALE`]). A successful probe
//! closes it; a failed one opens it again with twice the backoff, capped at
//! `max_backoff`. The state machine is pure: time is passed in, and transitions are
//! returned to the caller, who logs and counts them (one line per transition).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A half-open probe that reported nothing after this long is given up; the next call
/// becomes the probe.
pub(crate) const PROBE_STALE: Duration = Duration::from_secs(1);

/// When a breaker opens and how long it stays open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BreakerSettings {
    /// Consecutive failures that open the breaker.
    pub(crate) failures: u32,
    /// Those failures must fall within this span.
    pub(crate) window: Duration,
    /// First open period.
    pub(crate) backoff: Duration,
    /// Longest open period (the backoff doubles after each failed probe).
    pub(crate) max_backoff: Duration,
}

impl Default for BreakerSettings {
    /// 5 failures within 1 s; open for 100 ms, doubling up to 1 s (so a healed store is
    /// used again within about a second).
    fn default() -> Self {
        Self {
            failures: 5,
            window: Duration::from_secs(1),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        }
    }
}

/// Where a breaker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BreakerState {
    /// Calls go through.
    Closed = 0,
    /// Calls are refused at once.
    Open = 1,
    /// One probe call is let through.
    HalfOpen = 2,
}

impl BreakerState {
    /// Lower-case name for `/status`, metrics and logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Open,
            2 => Self::HalfOpen,
            _ => Self::Closed,
        }
    }
}

/// A change of state, for the caller to log and count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Transition {
    /// State before.
    pub(crate) from: BreakerState,
    /// State after.
    pub(crate) to: BreakerState,
    /// How long the breaker stays open (for a transition to `Open`).
    pub(crate) backoff: Duration,
}

/// One circuit breaker (see the module documentation).
#[derive(Debug)]
pub(crate) struct Breaker {
    /// Thresholds and backoffs.
    settings: BreakerSettings,
    /// The state, readable without the lock (the closed fast path takes no lock).
    state: AtomicU8,
    /// Everything else; taken on failures and while not closed.
    inner: Mutex<Inner>,
}

/// The locked part of a [`Breaker`].
#[derive(Debug)]
struct Inner {
    /// Consecutive failures so far.
    failures: u32,
    /// When the first of them happened.
    first_failure: Option<Instant>,
    /// Current open period.
    backoff: Duration,
    /// When an open breaker may probe.
    retry_at: Option<Instant>,
    /// When the current half-open probe was let through.
    probe_at: Option<Instant>,
}

/// A snapshot for `/status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BreakerView {
    /// State now.
    pub(crate) state: BreakerState,
    /// Consecutive failures counted.
    pub(crate) failures: u32,
    /// Time until an open breaker probes.
    pub(crate) retry_in: Option<Duration>,
}

// === impl Breaker ===

impl Breaker {
    /// A closed breaker.
    pub(crate) fn new(settings: BreakerSettings) -> Self {
        Self {
            settings,
            state: AtomicU8::new(BreakerState::Closed as u8),
            inner: Mutex::new(Inner {
                failures: 0,
                first_failure: None,
                backoff: settings.backoff,
                retry_at: None,
                probe_at: None,
            }),
        }
    }

    /// The state now.
    pub(crate) fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Whether a call may go to the store at `now`; may move an open breaker to
    /// half-open (the call is then the probe).
    pub(crate) fn allow(&self, now: Instant) -> (bool, Option<Transition>) {
        if self.state() == BreakerState::Closed {
            return (true, None);
        }
        let mut inner = self.lock();
        match self.state() {
            BreakerState::Closed => (true, None),
            BreakerState::Open => {
                if inner.retry_at.is_some_and(|at| now < at) {
                    return (false, None);
                }
                inner.probe_at = Some(now);
                (true, Some(self.set(BreakerState::HalfOpen, &inner)))
            }
            BreakerState::HalfOpen => {
                let stale = inner
                    .probe_at
                    .is_none_or(|at| now.saturating_duration_since(at) >= PROBE_STALE);
                if stale {
                    inner.probe_at = Some(now);
                }
                (stale, None)
            }
        }
    }

    /// Records the outcome of a store call made at or before `now`.
    pub(crate) fn record(&self, ok: bool, now: Instant) -> Option<Transition> {
        let state = self.state();
        if ok {
            if state == BreakerState::Closed {
                // Fast path: only touch the lock when there is something to reset.
                let mut inner = self.lock();
                if inner.failures != 0 {
                    inner.failures = 0;
                    inner.first_failure = None;
                }
                return None;
            }
            let mut inner = self.lock();
            inner.failures = 0;
            inner.first_failure = None;
            inner.backoff = self.settings.backoff;
            inner.retry_at = None;
            inner.probe_at = None;
            return Some(self.set(BreakerState::Closed, &inner));
        }
        let mut inner = self.lock();
        match self.state() {
            BreakerState::Closed => {
                let fresh = inner.first_failure.is_some_and(|first| {
                    now.saturating_duration_since(first) <= self.settings.window
                });
                if fresh {
                    inner.failures += 1;
                } else {
                    inner.failures = 1;
                    inner.first_failure = Some(now);
                }
                if inner.failures < self.settings.failures.max(1) {
                    return None;
                }
                inner.backoff = self.settings.backoff;
                inner.retry_at = Some(now + inner.backoff);
                Some(self.set(BreakerState::Open, &inner))
            }
            BreakerState::HalfOpen => {
                inner.backoff = (inner.backoff * 2).min(self.settings.max_backoff);
                inner.retry_at = Some(now + inner.backoff);
                inner.probe_at = None;
                Some(self.set(BreakerState::Open, &inner))
            }
            // Calls let through before it opened report late: already open.
            BreakerState::Open => None,
        }
    }

    /// A snapshot at `now`.
    pub(crate) fn view(&self, now: Instant) -> BreakerView {
        let inner = self.lock();
        let state = self.state();
        BreakerView {
            state,
            failures: inner.failures,
            retry_in: match state {
                BreakerState::Open => inner.retry_at.map(|at| at.saturating_duration_since(now)),
                _ => None,
            },
        }
    }

    fn set(&self, to: BreakerState, inner: &Inner) -> Transition {
        let from = BreakerState::from_u8(self.state.swap(to as u8, Ordering::AcqRel));
        Transition {
            from,
            to,
            backoff: inner.backoff,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means a panic elsewhere; the counters are still usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerSettings::default())
    }

    #[test]
    fn opens_after_five_consecutive_failures_within_a_second() {
        let b = breaker();
        let t0 = Instant::now();
        for i in 0..4 {
            assert_eq!(b.record(false, t0 + Duration::from_millis(i * 10)), None);
        }
        let opened = b
            .record(false, t0 + Duration::from_millis(50))
            .expect("opens");
        assert_eq!(
            (opened.from, opened.to),
            (BreakerState::Closed, BreakerState::Open)
        );
        assert_eq!(b.allow(t0 + Duration::from_millis(60)), (false, None));
    }

    #[test]
    fn a_success_or_a_slow_trickle_does_not_open_it() {
        let b = breaker();
        let t0 = Instant::now();
        for i in 0..4 {
            b.record(false, t0 + Duration::from_millis(i));
        }
        b.record(true, t0 + Duration::from_millis(5));
        for i in 0..4 {
            assert_eq!(b.record(false, t0 + Duration::from_millis(10 + i)), None);
        }
        // Failures spread over more than the window restart the count.
        let b = breaker();
        for i in 0..10 {
            assert_eq!(b.record(false, t0 + Duration::from_millis(300 * i)), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn probes_after_backoff_and_doubles_it_up_to_the_cap() {
        let b = breaker();
        let t0 = Instant::now();
        for _ in 0..5 {
            b.record(false, t0);
        }
        let mut now = t0;
        let mut backoff = Duration::from_millis(100);
        for _ in 0..6 {
            assert!(!b.allow(now + backoff - Duration::from_millis(1)).0);
            now += backoff;
            let (allowed, transition) = b.allow(now);
            assert!(allowed);
            assert_eq!(transition.map(|t| t.to), Some(BreakerState::HalfOpen));
            // Only one probe at a time.
            assert!(!b.allow(now).0);
            let reopened = b.record(false, now).expect("reopens");
            backoff = (backoff * 2).min(Duration::from_secs(1));
            assert_eq!(reopened.backoff, backoff);
        }
        now += backoff;
        assert!(b.allow(now).0);
        let closed = b.record(true, now).expect("closes");
        assert_eq!(
            (closed.from, closed.to),
            (BreakerState::HalfOpen, BreakerState::Closed)
        );
        assert!(b.allow(now).0);
    }

    #[test]
    fn a_lost_probe_is_replaced() {
        let b = breaker();
        let t0 = Instant::now();
        for _ in 0..5 {
            b.record(false, t0);
        }
        let t1 = t0 + Duration::from_millis(100);
        assert!(b.allow(t1).0);
        assert!(!b.allow(t1 + Duration::from_millis(10)).0);
        assert!(b.allow(t1 + PROBE_STALE).0);
    }
}
