//! Answers the store admitted after a wait (`max_delay`): the call waits, then answers
//! OK; a wait that would outlive the caller's deadline is answered OVER_LIMIT instead,
//! and a shutdown answers every waiting call at once.

use tokio::time::Instant;

use crate::algorithm::Micros;
use crate::limiter::delay::{Delays, Waited};
use crate::limiter::Verdict;

/// The longest wait among the verdicts admitted after one, if any.
pub(super) fn longest_wait(verdicts: &[Verdict<'_>]) -> Option<Micros> {
    verdicts
        .iter()
        .filter_map(|verdict| match verdict {
            Verdict::Limited(limited) if !limited.over_limit => limited.waits(),
            _ => None,
        })
        .max()
}

/// Waits `wait` µs before the answer is sent, or refuses the delayed verdicts when the
/// wait no longer ends before `answer_by` (the store took that long).
pub(super) async fn wait(
    delays: &Delays,
    verdicts: &mut [Verdict<'_>],
    wait: Micros,
    answer_by: Option<Instant>,
) {
    if !Delays::fits(wait, answer_by) {
        for verdict in verdicts.iter_mut() {
            if let Verdict::Limited(limited) = verdict {
                if limited.waits().is_some() {
                    limited.refuse_late();
                    delays.count("late");
                }
            }
        }
        return;
    }
    if delays.wait(wait).await == Waited::Drained {
        tracing::debug!(wait_us = wait, "delayed answer sent at once: shutting down");
    }
}
