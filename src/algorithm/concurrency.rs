//! Concurrency limits: at most `limit` requests in flight per key (`algorithm:
//! concurrency`, `max_in_flight`), each holding a named slot for at most `period`
//! (`max_hold`).
//!
//! Every request names its own slot (the descriptor entry the rule marks `slot: true`,
//! typically the request's `x-request-id`): the request-phase call acquires it, the
//! stream-done call (a negative hit) releases it. Because Envoy also sends the release
//! for a request it refused, a release frees only the slot the same request holds: a
//! refused request's release frees nothing, and a release sent twice frees one slot. An
//! acquire of a slot already held is admitted again without taking another (a retried
//! call is not charged twice). A slot held `period` or longer is reclaimed: a release
//! that never comes (Envoy crashed, the call was lost) costs capacity for `max_hold`,
//! never forever.
//!
//! | op      | slot held            | slot not held, room    | slot not held, full |
//! |---------|----------------------|------------------------|---------------------|
//! | acquire | allowed, unchanged   | allowed, slot taken    | refused             |
//! | probe   | allowed              | allowed                | refused             |
//! | release | allowed, slot freed  | allowed, unchanged     | allowed, unchanged  |
//!
//! A refusal's `retry_after` is the time until the oldest slot is reclaimed, at most
//! [`RETRY_CAP`]: a slot usually frees when its request ends, which no store can
//! foresee, so a client is told to come back soon rather than after `max_hold`.
//! `reset_after` is the time until every slot held now is reclaimed; `remaining` the
//! free slots; `used` the slots held (a refused request counted as one more).
//!
//! The Redis mirror is `src/store/redis/scripts/hold.lua`: a sorted set of slot ids
//! scored by the instant each was taken.

use sha2::{Digest, Sha256};

use super::{Decision, Micros, Quota, MICROS_PER_SECOND};

/// Longest `retry_after` of a refusal.
pub const RETRY_CAP: Micros = MICROS_PER_SECOND;

/// A slot's identity: the first 64 bits of SHA-256 over its name, the same in every
/// instance (replicas sharing Redis must agree on it). Two names of one key share an id
/// with probability about `n² / 2^65` for `n` slots held: never, in practice.
pub type SlotId = u64;

/// The id of the slot named `name`.
pub fn slot_id(name: &str) -> SlotId {
    let digest = Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// What a call does with its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotOp {
    /// Take the slot if there is room (the request phase: a positive hit).
    Acquire,
    /// Whether an acquire would be admitted, changing nothing (a hit of 0, `explain`).
    Probe,
    /// Give the slot back if this request holds it (stream done: a negative hit).
    Release,
}

/// One slot held: its id and the instant it was taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The slot's id.
    pub slot: SlotId,
    /// When it was taken (µs).
    pub since: Micros,
}

/// The slots held on one key, in the order they were taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// At most the limit's `max_in_flight` entries.
    pub held: Vec<Held>,
}

/// Runs `op` for `slot` at `now`. Slots held `quota.period` or longer are reclaimed
/// first. Returns the decision and the state to store.
pub fn hold(
    state: &State,
    now: Micros,
    op: SlotOp,
    slot: SlotId,
    quota: &Quota,
) -> (Decision, State) {
    if super::is_invalid(quota) {
        let decision = match op {
            SlotOp::Release => Decision::refund_of_invalid_quota(),
            SlotOp::Acquire | SlotOp::Probe => Decision::invalid_quota(1, quota),
        };
        return (decision, state.clone());
    }
    let mut next = State {
        held: state
            .held
            .iter()
            .copied()
            .filter(|held| !reclaimed(held, now, quota))
            .collect(),
    };
    let position = next.held.iter().position(|held| held.slot == slot);
    let allowed = match (op, position) {
        (SlotOp::Release, Some(at)) => {
            next.held.remove(at);
            true
        }
        (SlotOp::Release, None) | (SlotOp::Acquire | SlotOp::Probe, Some(_)) => true,
        (SlotOp::Acquire | SlotOp::Probe, None) => {
            let room = (next.held.len() as u64) < quota.limit;
            if room && op == SlotOp::Acquire {
                next.held.push(Held { slot, since: now });
            }
            room
        }
    };
    let in_flight = next.held.len() as u64;
    let decision = Decision {
        allowed,
        remaining: if allowed {
            quota.limit.saturating_sub(in_flight)
        } else {
            0
        },
        reset_after: expires_at(&next, quota).saturating_sub(now),
        retry_after: if allowed {
            0
        } else {
            oldest_reclaim(&next, quota)
                .saturating_sub(now)
                .clamp(1, RETRY_CAP)
        },
        used: if allowed { in_flight } else { in_flight + 1 },
    };
    (decision, next)
}

/// Whether `held` has been held `quota.period` or longer at `now`.
fn reclaimed(held: &Held, now: Micros, quota: &Quota) -> bool {
    held.since.saturating_add(quota.period) <= now
}

/// When the oldest slot held is reclaimed (0 when none is held).
fn oldest_reclaim(state: &State, quota: &Quota) -> Micros {
    state
        .held
        .iter()
        .map(|held| held.since.saturating_add(quota.period))
        .min()
        .unwrap_or(0)
}

/// The instant every slot held is reclaimed: from then on the state is fresh (0 for no
/// slot held).
pub fn expires_at(state: &State, quota: &Quota) -> Micros {
    state
        .held
        .iter()
        .map(|held| held.since.saturating_add(quota.period))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = MICROS_PER_SECOND;
    const T0: Micros = 1_800_000_000 * S;

    fn quota(limit: u64, max_hold: Micros) -> Quota {
        Quota {
            limit,
            period: max_hold,
            burst: limit,
            on_over_limit: Default::default(),
        }
    }

    /// Runs `(now, op, slot)` steps from a fresh state: the decisions.
    fn run(quota: &Quota, steps: &[(Micros, SlotOp, &str)]) -> Vec<Decision> {
        let mut state = State::default();
        steps
            .iter()
            .map(|&(now, op, slot)| {
                let (decision, next) = hold(&state, now, op, slot_id(slot), quota);
                state = next;
                decision
            })
            .collect()
    }

    #[test]
    fn three_in_flight_then_the_fourth_waits_for_a_release() {
        use SlotOp::*;
        let q = quota(3, 60 * S);
        let d = run(
            &q,
            &[
                (T0, Acquire, "a"),
                (T0, Acquire, "b"),
                (T0 + 1, Acquire, "c"),
                (T0 + 2, Acquire, "d"),
                (T0 + 3, Release, "b"),
                (T0 + 4, Acquire, "d"),
            ],
        );
        assert!(d[..3].iter().all(|d| d.allowed));
        assert_eq!(d[2].remaining, 0);
        assert!(!d[3].allowed);
        assert_eq!(d[3].used, 4);
        // The oldest slot is reclaimed in 60 s: the wait is capped at a second.
        assert_eq!(d[3].retry_after, RETRY_CAP);
        assert!(d[4].allowed);
        assert_eq!(d[4].remaining, 1);
        assert!(d[5].allowed);
        assert_eq!(d[5].reset_after, 60 * S);
    }

    #[test]
    fn a_release_frees_only_the_slot_its_request_holds() {
        use SlotOp::*;
        let q = quota(1, 60 * S);
        let d = run(
            &q,
            &[
                (T0, Acquire, "a"),
                // Refused, then Envoy's stream-done release of the refused request.
                (T0, Acquire, "b"),
                (T0, Release, "b"),
                (T0, Acquire, "c"),
                // Released twice: one slot freed.
                (T0, Release, "a"),
                (T0, Release, "a"),
                (T0, Acquire, "c"),
                (T0, Acquire, "d"),
            ],
        );
        let allowed: Vec<bool> = d.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, false, true, false, true, true, true, false]);
    }

    #[test]
    fn an_acquire_repeated_takes_one_slot_and_a_probe_none() {
        use SlotOp::*;
        let q = quota(2, 60 * S);
        let d = run(
            &q,
            &[
                (T0, Acquire, "a"),
                (T0, Acquire, "a"),
                (T0, Probe, "b"),
                (T0, Probe, "b"),
                (T0, Acquire, "b"),
                (T0, Probe, "c"),
                (T0, Probe, "a"),
            ],
        );
        assert_eq!(d[1].remaining, 1);
        assert!(d[2].allowed && d[3].allowed && d[4].allowed);
        assert!(!d[5].allowed, "full: a new slot would be refused");
        assert!(d[6].allowed, "a slot held is admitted again");
    }

    #[test]
    fn a_slot_held_max_hold_is_reclaimed() {
        use SlotOp::*;
        let q = quota(1, 10 * S);
        let d = run(
            &q,
            &[
                (T0, Acquire, "a"),
                (T0 + 10 * S - 1, Acquire, "b"),
                (T0 + 10 * S, Acquire, "b"),
                (T0 + 10 * S, Release, "a"),
                (T0 + 10 * S + 1, Acquire, "c"),
            ],
        );
        assert!(!d[1].allowed);
        assert_eq!(d[1].retry_after, 1);
        assert!(d[2].allowed);
        assert_eq!(d[3].remaining, 0, "a's late release frees nothing");
        assert!(!d[4].allowed);
        let mut state = State::default();
        (_, state) = hold(&state, T0, Acquire, 1, &q);
        assert_eq!(expires_at(&state, &q), T0 + 10 * S);
    }

    #[test]
    fn an_invalid_quota_refuses_acquires_and_takes_releases() {
        let q = quota(0, 10 * S);
        let (d, state) = hold(&State::default(), T0, SlotOp::Acquire, 1, &q);
        assert!(!d.allowed);
        assert_eq!(state, State::default());
        let (d, _) = hold(&State::default(), T0, SlotOp::Release, 1, &q);
        assert!(d.allowed);
    }
}
