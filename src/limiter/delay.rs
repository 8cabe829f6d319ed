//! Delayed answers (`max_delay`): a request the store admitted at a later instant is
//! answered OK after that wait. Here: how long a request may wait (the call's deadline,
//! the bound on answers waiting at once), the wait itself, and the drain that answers
//! every waiting call at once when the process shuts down.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::algorithm::Micros;
use crate::telemetry::{Metrics, OutcomeLabel};

/// Most answers waiting at once; past it, a request that would wait is refused instead
/// (each holds its call and a timer).
pub(crate) const MAX_PENDING: usize = 10_000;

/// Share of the time left before the caller's deadline kept back from a wait: the
/// store call and the answer's way back happen in it.
const DEADLINE_MARGIN_SHARE: u32 = 10;

/// Least time kept back before the caller's deadline.
const DEADLINE_MARGIN_MIN: Duration = Duration::from_millis(20);

/// The answers waiting, and the drain.
pub(crate) struct Delays {
    /// Answers waiting now.
    pending: AtomicUsize,
    /// Most answers waiting at once.
    max_pending: usize,
    /// Set once shutdown begins: every wait ends at once, and no new one starts.
    draining: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// After the whole wait.
    Answered,
    /// Cut short by a shutdown.
    Drained,
}

impl Delays {
    /// No answer waiting; at most `max_pending` at once.
    pub(crate) fn new(max_pending: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            pending: AtomicUsize::new(0),
            max_pending,
            draining: watch::Sender::new(false),
            metrics,
        }
    }

    /// The longest wait a request may be delayed by now, whose caller gives up at
    /// `answer_by` (none: no deadline): 0 while draining or with `max_pending` answers
    /// waiting already.
    pub(crate) fn budget(&self, answer_by: Option<Instant>) -> Micros {
        if *self.draining.borrow() || self.pending.load(Ordering::Relaxed) >= self.max_pending {
            return 0;
        }
        let Some(answer_by) = answer_by else {
            return Micros::MAX;
        };
        let left = answer_by.saturating_duration_since(Instant::now());
        let margin = (left / DEADLINE_MARGIN_SHARE).max(DEADLINE_MARGIN_MIN);
        u64::try_from(left.saturating_sub(margin).as_micros()).unwrap_or(Micros::MAX)
    }

    /// Whether a wait of `wait` µs from now still ends before `answer_by`.
    pub(crate) fn fits(wait: Micros, answer_by: Option<Instant>) -> bool {
        answer_by.is_none_or(|answer_by| Instant::now() + Duration::from_micros(wait) < answer_by)
    }

    /// Waits `wait` µs before an answer, or until a drain.
    pub(crate) async fn wait(&self, wait: Micros) -> Waited {
        let _pending = Pending::enter(self);
        self.metrics.delay_seconds.observe(wait as f64 / 1e6);
        let mut draining = self.draining.subscribe();
        let drained = async {
            // An error: the sender is gone with the limiter, which cannot be mid-call.
            let _ = draining.wait_for(|draining| *draining).await;
        };
        let waited = tokio::select! {
            () = tokio::time::sleep(Duration::from_micros(wait)) => Waited::Answered,
            () = drained => Waited::Drained,
        };
        self.count(match waited {
            Waited::Answered => "answered",
            Waited::Drained => "drained",
        });
        waited
    }

    /// Counts a delayed answer that ended as `outcome`.
    pub(crate) fn count(&self, outcome: &'static str) {
        self.metrics
            .delayed_answers
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Ends every wait at once (shutdown) and starts none from now on.
    pub(crate) fn drain(&self) {
        self.draining.send_replace(true);
    }
}

/// One answer counted as waiting while it lives.
struct Pending<'a>(&'a Delays);

impl<'a> Pending<'a> {
    fn enter(delays: &'a Delays) -> Self {
        delays.pending.fetch_add(1, Ordering::Relaxed);
        delays.metrics.delayed_pending.inc();
        Self(delays)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
        self.0.metrics.delayed_pending.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_drain_ends_every_wait_at_once_and_starts_none() {
        let delays = Arc::new(Delays::new(2, Arc::new(Metrics::new())));
        let waiting = {
            let delays = delays.clone();
            tokio::spawn(async move { delays.wait(60_000_000).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(delays.pending.load(Ordering::Relaxed), 1);
        delays.drain();
        assert_eq!(waiting.await.ok(), Some(Waited::Drained));
        assert_eq!(delays.pending.load(Ordering::Relaxed), 0);
        assert_eq!(delays.budget(None), 0, "no wait starts once draining");
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_keeps_a_margin_before_the_deadline_and_a_bound_on_waits() {
        let delays = Arc::new(Delays::new(1, Arc::new(Metrics::new())));
        let budget = delays.budget(Some(Instant::now() + Duration::from_secs(3)));
        assert_eq!(budget, 2_700_000);
        let short = delays.budget(Some(Instant::now() + Duration::from_millis(15)));
        assert_eq!(short, 0, "20 ms at least are kept back");
        assert!(Delays::fits(1_000, None));
        assert!(!Delays::fits(
            2_000_000,
            Some(Instant::now() + Duration::from_secs(1))
        ));
        let waiting = {
            let delays = delays.clone();
            tokio::spawn(async move { delays.wait(1_000_000).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(delays.budget(None), 0, "one answer waiting: the bound");
        assert_eq!(waiting.await.ok(), Some(Waited::Answered));
        assert_eq!(delays.budget(None), Micros::MAX);
    }
}
