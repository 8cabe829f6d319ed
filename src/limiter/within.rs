//! A store call bounded by the caller's deadline.
//!
//! `tokio::time::timeout_at` keeps its 112-byte `Sleep` inline, in every request's
//! future, though most store calls never arm it: the memory store answers on the first
//! poll, and without `grpc-timeout` there is no deadline at all. Here the timer is made
//! only when the call is still pending at its first poll, on the heap.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::store::StoreError;
use crate::telemetry::Metrics;

pin_project_lite::pin_project! {
    /// Runs `call`, abandoning it at `deadline` (the caller's own, from `grpc-timeout`)
    /// with [`StoreError::Timeout`]: the store's own timeout may be longer than the
    /// caller is willing to wait. An abandoned Redis call is dropped by the batcher
    /// before it is sent, so it charges nothing.
    pub(crate) struct Within<'a, F> {
        #[pin]
        call: F,
        // The deadline, and what the caller allowed (as the timeout error reports it).
        deadline: Option<(Instant, Duration)>,
        metrics: &'a Metrics,
        timer: Option<Pin<Box<Sleep>>>,
    }
}

/// `call`, abandoned at `deadline` when there is one.
pub(crate) fn within<F>(deadline: Option<Instant>, metrics: &Metrics, call: F) -> Within<'_, F>
where
    F: Future<Output = Result<(), StoreError>>,
{
    let deadline =
        deadline.map(|deadline| (deadline, deadline.saturating_duration_since(Instant::now())));
    Within {
        call,
        deadline,
        metrics,
        timer: None,
    }
}

impl<F> Future for Within<'_, F>
where
    F: Future<Output = Result<(), StoreError>>,
{
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The call first, as `timeout_at` does: one that is ready never arms a timer.
        if let Poll::Ready(result) = this.call.poll(cx) {
            return Poll::Ready(result);
        }
        let Some((deadline, budget)) = *this.deadline else {
            return Poll::Pending;
        };
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let error = StoreError::Timeout(budget);
                this.metrics.store_error(error.kind());
                Poll::Ready(Err(error))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_deadline_times_out() {
        let metrics = Metrics::new();
        let deadline = Instant::now() + Duration::from_millis(5);
        let never = std::future::pending::<Result<(), StoreError>>();
        let result = within(Some(deadline), &metrics, never).await;
        assert!(
            matches!(result, Err(StoreError::Timeout(budget)) if budget == Duration::from_millis(5)),
            "{result:?}"
        );
        assert!(Instant::now() >= deadline);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_answers_in_time_keeps_its_answer() {
        let metrics = Metrics::new();
        let deadline = Instant::now() + Duration::from_millis(5);
        let late_ok = async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(())
        };
        assert!(within(Some(deadline), &metrics, late_ok).await.is_ok());
        let failed = async { Err(StoreError::Unavailable("down".into())) };
        assert!(matches!(
            within(Some(deadline), &metrics, failed).await,
            Err(StoreError::Unavailable(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_deadline_a_call_waits_as_long_as_it_takes() {
        let metrics = Metrics::new();
        let slow = async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        };
        assert!(within(None, &metrics, slow).await.is_ok());
    }

    #[test]
    fn a_ready_call_arms_no_timer() {
        let metrics = Metrics::new();
        let deadline = Instant::now() + Duration::from_millis(5);
        let mut call = Box::pin(within(Some(deadline), &metrics, async { Ok(()) }));
        let waker = futures::task::noop_waker();
        // No runtime here: arming a timer would panic.
        let polled = call.as_mut().poll(&mut Context::from_waker(&waker));
        assert!(matches!(polled, Poll::Ready(Ok(()))));
    }
}
