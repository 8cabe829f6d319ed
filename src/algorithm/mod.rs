//! Pure rate limit algorithms.
//!
//! Each algorithm is a pure function of `(state, now, cost, quota)` that returns a
//! [`Decision`] and the state to store if the caller commits the decision. Nothing in this
//! module reads a clock, does I/O or allocates on the hot path (the sliding log's state is
//! the one inherent exception). The memory store calls these functions directly; the Redis
//! Lua scripts mirror them line for line and a test feeds both the same sequences.
//!
//! Time is an integer count of microseconds since the Unix epoch ([`Micros`]), so that
//! fixed windows align to the epoch exactly as envoyproxy/ratelimit's do, and so that every
//! timestamp stays below 2^53: Redis's Lua numbers are doubles and Redis `TIME` gives
//! microseconds, so the Lua mirror can compute exactly what the Rust code computes.
//! Elapsed time is always clamped at zero: a clock that steps back never mints capacity.
//!
//! ## Conventions shared by every algorithm (and every Lua mirror)
//!
//! - **No panics.** All integer arithmetic saturates; `cost` and `now` may be anything up
//!   to `u64::MAX`. A quota with `period == 0`, or with `limit == 0` outside the fixed
//!   window, refuses everything ([`Decision::invalid_quota`]) and leaves the state as it
//!   was. The fixed window decides a limit of 0 as the reference does: every hit refused
//!   and counted, the window's end as the reset, a check of cost 0 allowed.
//! - **Refusal and `cost == 0` return the input state unchanged** (fixed window's counting
//!   of refused hits excepted), so a refused request or a probe never changes what later
//!   requests see, not even by a floating point rounding.
//! - **Fractions** use `f64` with the exact operation order written next to each formula.
//!   Every `+ - * /` on doubles is correctly rounded (IEEE 754) in Rust and in Lua 5.1;
//!   Lua runs each operator as its own VM instruction, so no fused multiply-add can
//!   creep in. `floor`/`ceil` are `math.floor`/`math.ceil`.
//! - **Waits are exact.** `retry_after` is the *smallest* wait after which the same request
//!   is admitted (given no other traffic), found by [`earliest`] over the algorithm's own
//!   decision predicate, so rounding in a closed form can never make it a microsecond too
//!   short. A request that can never pass (`cost` above the capacity) reports a finite,
//!   non-zero `retry_after` documented per algorithm.

pub mod concurrency;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub mod remote;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub mod token_bucket;

#[cfg(test)]
mod tests;

/// Microseconds since the Unix epoch, as read from the store's clock.
pub type Micros = u64;

/// Microseconds in one second.
pub const MICROS_PER_SECOND: u64 = 1_000_000;

/// Which algorithm a limit uses. `FixedWindow` is the default (envoyproxy/ratelimit's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AlgorithmKind {
    /// Counter per epoch-aligned window; refused hits still count (reference semantics).
    #[default]
    FixedWindow,
    /// Two-counter weighted estimate of a rolling window (Cloudflare's).
    SlidingWindow,
    /// Exact rolling window: one timestamp per admitted unit.
    SlidingLog,
    /// Lazily refilled bucket of `burst` tokens.
    TokenBucket,
    /// Generic cell rate algorithm: one theoretical arrival time, `burst` tolerance.
    Gcra,
    /// Requests in flight, each holding a named slot ([`concurrency`]): not a rate.
    /// Decided by [`concurrency::hold`] with the request's slot, never by [`decide`].
    Concurrency,
}

impl AlgorithmKind {
    /// The name used in rule files (`algorithm: token_bucket`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::SlidingLog => "sliding_log",
            Self::TokenBucket => "token_bucket",
            Self::Gcra => "gcra",
            Self::Concurrency => "concurrency",
        }
    }

    /// Parses a rule file's algorithm name.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([Self::Concurrency])
            .find(|kind| kind.as_str() == name)
    }

    /// Whether a refused request can be admitted later instead (`max_delay`): the
    /// algorithms whose state, decided at a later instant, reserves that instant for
    /// every request after it (see [`decide_delayed`]). A window counter would count a
    /// reservation in its window, not at its instant.
    pub const fn delays(self) -> bool {
        matches!(self, Self::SlidingLog | Self::TokenBucket | Self::Gcra)
    }

    /// Every rate algorithm: all but [`AlgorithmKind::Concurrency`], which counts
    /// requests in flight and is decided with a slot.
    pub const ALL: [AlgorithmKind; 5] = [
        Self::FixedWindow,
        Self::SlidingWindow,
        Self::SlidingLog,
        Self::TokenBucket,
        Self::Gcra,
    ];
}

/// What a limit does with a charge it cannot admit (the rule's `on_over_limit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnOverLimit {
    /// Refuse it and charge nothing (the fixed window still counts it, as the
    /// reference does). The default.
    #[default]
    Refuse,
    /// Refuse it and charge it anyway: every charge counts, so the state can go into
    /// debt (more used than the limit holds), and later requests are refused until
    /// time has paid the debt back at the limit's rate. For a cost known only after
    /// the response (LLM tokens): the charge at stream end is never lost.
    Charge,
}

impl OnOverLimit {
    /// The name used in rule files (`on_over_limit: charge`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::Charge => "charge",
        }
    }
}

/// The numbers of one limit, fixed at rule load time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Units admitted per `period` (the rule's `requests_per_unit`). Never zero for a
    /// limit that reaches an algorithm (a zero limit is answered without one).
    pub limit: u64,
    /// Length of the window, or the refill period, in microseconds (the rule's `unit`).
    pub period: Micros,
    /// Capacity of token bucket and GCRA (the rule's `burst`, default `limit`).
    /// Other algorithms ignore it.
    pub burst: u64,
    /// Whether a charge that does not fit still counts (debt). The sliding log always
    /// refuses (a debt would be one entry per unit); rules never give it `Charge`.
    pub on_over_limit: OnOverLimit,
}

impl Quota {
    /// Whether every charge counts, admitted or not ([`OnOverLimit::Charge`]).
    pub(crate) fn charges_always(&self) -> bool {
        self.on_over_limit == OnOverLimit::Charge
    }
}

/// What an algorithm decided for one request of a given cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Units still available after this decision (0 when refused).
    pub remaining: u64,
    /// Time until the limit is whole again (fixed window: until the window ends).
    pub reset_after: Micros,
    /// Refused: the time until a request of the same cost would be admitted. Allowed:
    /// zero, or the wait a delayed admission is answered after (`max_delay`, see
    /// [`decide_delayed`]).
    pub retry_after: Micros,
    /// Units in use after this decision as the algorithm counts them, including the
    /// cost of a refused request (for fixed window, the window counter after the
    /// increment). Feeds the reference's near/over limit statistics.
    pub used: u64,
}

impl Decision {
    /// The answer to a refund against a quota that cannot admit anything (see
    /// [`is_invalid`]): nothing was charged, so nothing is given back; a refund is never
    /// refused.
    pub(crate) fn refund_of_invalid_quota() -> Self {
        Self {
            allowed: true,
            ..Self::default()
        }
    }

    /// The answer for a quota that cannot admit anything (see [`is_invalid`]): refused,
    /// nothing remaining, retry after one period (at least 1 µs).
    pub(crate) fn invalid_quota(cost: u64, quota: &Quota) -> Self {
        Self {
            allowed: false,
            remaining: 0,
            reset_after: 0,
            retry_after: quota.period.max(1),
            used: cost,
        }
    }
}

/// Whether `quota` can admit nothing at all (`limit == 0` or `period == 0`); the
/// algorithms other than the fixed window refuse outright when it cannot.
pub(crate) fn is_invalid(quota: &Quota) -> bool {
    quota.limit == 0 || quota.period == 0
}

/// The smallest `d` for which `pass(d)` holds, for a predicate that is monotone (false up
/// to some point, true from there on) and true at `u64::MAX` or earlier; `guess` is a
/// starting point (typically a closed form) that only affects speed, never the answer.
///
/// Lua mirror: gallop up from `guess` (step 1, 2, 4, ...) until `pass`, gallop down the
/// same way while `pass`, then bisect with `mid = lo + floor((hi - lo) / 2)`. Values stay
/// integers below 2^53 for realistic waits, so the loop is exact in doubles too.
pub(crate) fn earliest(guess: Micros, pass: impl Fn(Micros) -> bool) -> Micros {
    // Invariant: pass(hi) holds, and pass(d) is false for every d < lo.
    let mut lo: Micros = 0;
    let mut hi = guess;
    let mut step: Micros = 1;
    while !pass(hi) {
        if hi == Micros::MAX {
            return Micros::MAX;
        }
        lo = hi + 1;
        hi = hi.saturating_add(step);
        step = step.saturating_mul(2);
    }
    step = 1;
    while hi > lo {
        let probe = hi.saturating_sub(step).max(lo);
        if pass(probe) {
            hi = probe;
            step = step.saturating_mul(2);
        } else {
            lo = probe + 1;
            break;
        }
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pass(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

/// `x` rounded toward zero into `u64`, saturating (NaN and negatives give 0). Lua mirror:
/// the value is already a double; `math.floor` when the Rust code says `floor`.
pub(crate) fn to_u64(x: f64) -> u64 {
    // `as` saturates and maps NaN to 0: exactly the no-panic behaviour wanted.
    x as u64
}

/// One algorithm: the shape of its per-key state and its pure decision function.
pub trait Algorithm {
    /// State kept per key. `Default` is the state of a key never seen.
    type State: Clone + Default + PartialEq + std::fmt::Debug;

    /// Decides a request of `cost` units at `now`. Returns the decision and the state to
    /// store if the caller commits it. `cost == 0` checks without charging. For a refused
    /// request the returned state charges nothing, except fixed window (reference
    /// semantics: refused hits count).
    fn decide(
        state: &Self::State,
        now: Micros,
        cost: u64,
        quota: &Quota,
    ) -> (Decision, Self::State);

    /// Gives back `units` hits at `now` (a negative hit, Envoy's `is_negative_hits`):
    /// always allowed, never refused; the decision describes the state after the
    /// refund (`retry_after` 0). Each algorithm states what a refund gives back; none
    /// lets a later request through that the charges it was given back from did not
    /// pay for. `units == 0` returns the state unchanged.
    fn refund(
        state: &Self::State,
        now: Micros,
        units: u64,
        quota: &Quota,
    ) -> (Decision, Self::State);

    /// The instant from which `state` answers exactly as a fresh state would: the
    /// key may be dropped then (memory eviction, Redis TTL).
    fn expires_at(state: &Self::State, quota: &Quota) -> Micros;
}

/// Per-key state of any algorithm: what the memory store keeps per key.
///
/// A key's algorithm can change when rules are edited, so [`decide`] treats a state of
/// another kind as fresh. Kept small (≤ 48 bytes, asserted by a test): the sliding log's
/// variable-size state is boxed.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    /// See [`fixed_window`].
    FixedWindow(fixed_window::State),
    /// See [`sliding_window`].
    SlidingWindow(sliding_window::State),
    /// See [`sliding_log`].
    SlidingLog(Box<sliding_log::State>),
    /// See [`token_bucket`].
    TokenBucket(token_bucket::State),
    /// See [`gcra`].
    Gcra(gcra::State),
    /// See [`concurrency`].
    Concurrency(Box<concurrency::State>),
}

// === impl State ===

impl State {
    /// The state of a key never seen, for algorithm `kind`.
    pub fn fresh(kind: AlgorithmKind) -> Self {
        match kind {
            AlgorithmKind::FixedWindow => Self::FixedWindow(Default::default()),
            AlgorithmKind::SlidingWindow => Self::SlidingWindow(Default::default()),
            AlgorithmKind::SlidingLog => Self::SlidingLog(Default::default()),
            AlgorithmKind::TokenBucket => Self::TokenBucket(Default::default()),
            AlgorithmKind::Gcra => Self::Gcra(Default::default()),
            AlgorithmKind::Concurrency => Self::Concurrency(Default::default()),
        }
    }
}

/// Runs one algorithm's [`Algorithm::decide`] on a state of that kind (a fresh one if
/// `state` belongs to another algorithm) and wraps the new state.
fn run<A: Algorithm>(
    state: Option<&A::State>,
    op: Op,
    now: Micros,
    cost: u64,
    quota: &Quota,
    wrap: impl FnOnce(A::State) -> State,
) -> (Decision, State) {
    let fresh;
    let state = match state {
        Some(state) => state,
        None => {
            fresh = A::State::default();
            &fresh
        }
    };
    let (decision, next) = match op {
        Op::Charge => A::decide(state, now, cost, quota),
        Op::Refund => A::refund(state, now, cost, quota),
    };
    (decision, wrap(next))
}

/// What a call does to a state: decide a charge, or give hits back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// [`Algorithm::decide`].
    Charge,
    /// [`Algorithm::refund`].
    Refund,
}

/// Decides a request with algorithm `kind` over a stored `state` (see [`Algorithm::decide`]).
/// A state of another algorithm (the rule changed) is treated as fresh.
pub fn decide(
    kind: AlgorithmKind,
    state: &State,
    now: Micros,
    cost: u64,
    quota: &Quota,
) -> (Decision, State) {
    apply(kind, state, Op::Charge, now, cost, quota)
}

/// [`decide`], where a refused request that would be admitted within `max_wait` is
/// admitted *then* instead (`max_delay`): it is decided at `now + wait` (`wait` its
/// `retry_after`, the exact earliest instant it passes), so the state reserves its
/// units at that instant, and the decision is allowed with `retry_after = wait`, the
/// wait the caller answers after. `remaining` and `reset_after` are those after the
/// reservation, `reset_after` counted from `now`. Only the algorithms that
/// [`AlgorithmKind::delays`] delay; the others answer as [`decide`].
///
/// Every later request sees a reservation. Token bucket and GCRA keep one state that
/// a reservation moves ahead. The sliding log dates a unit at its newest instant when
/// that is after `now` (the log is kept in order), so behind a reservation an admission
/// is dated with it: here it is answered at that date too (`retry_after` the wait to
/// it), or refused when that is past `max_wait`. So every unit is answered at the
/// instant the log holds it at, and the log's rolling windows are the answers'.
pub fn decide_delayed(
    kind: AlgorithmKind,
    state: &State,
    now: Micros,
    cost: u64,
    quota: &Quota,
    max_wait: Micros,
) -> (Decision, State) {
    let (decision, next) = decide(kind, state, now, cost, quota);
    if !kind.delays() {
        return (decision, next);
    }
    if decision.allowed {
        let dated = match &next {
            State::SlidingLog(log) if cost > 0 => log.runs.last().map_or(0, |run| run.at),
            _ => 0,
        };
        if dated <= now {
            return (decision, next);
        }
        let wait = dated - now;
        if wait > max_wait {
            let refused = Decision {
                allowed: false,
                remaining: 0,
                retry_after: wait,
                ..decision
            };
            return (refused, state.clone());
        }
        return (
            Decision {
                retry_after: wait,
                ..decision
            },
            next,
        );
    }
    if decision.retry_after > max_wait {
        return (decision, next);
    }
    let wait = decision.retry_after;
    let (later, reserved) = decide(kind, state, now.saturating_add(wait), cost, quota);
    if !later.allowed {
        // A cost above the capacity: never admitted, whatever the wait.
        return (decision, next);
    }
    let delayed = Decision {
        retry_after: wait,
        reset_after: later.reset_after.saturating_add(wait),
        ..later
    };
    (delayed, reserved)
}

/// Gives `units` hits back with algorithm `kind` over a stored `state` (see
/// [`Algorithm::refund`]). A state of another algorithm is treated as fresh.
pub fn refund(
    kind: AlgorithmKind,
    state: &State,
    now: Micros,
    units: u64,
    quota: &Quota,
) -> (Decision, State) {
    apply(kind, state, Op::Refund, now, units, quota)
}

/// [`decide`] or [`refund`].
fn apply(
    kind: AlgorithmKind,
    state: &State,
    op: Op,
    now: Micros,
    cost: u64,
    quota: &Quota,
) -> (Decision, State) {
    use AlgorithmKind as K;
    match (kind, state) {
        (K::FixedWindow, State::FixedWindow(s)) => {
            run::<fixed_window::FixedWindow>(Some(s), op, now, cost, quota, State::FixedWindow)
        }
        (K::FixedWindow, _) => {
            run::<fixed_window::FixedWindow>(None, op, now, cost, quota, State::FixedWindow)
        }
        (K::SlidingWindow, State::SlidingWindow(s)) => run::<sliding_window::SlidingWindow>(
            Some(s),
            op,
            now,
            cost,
            quota,
            State::SlidingWindow,
        ),
        (K::SlidingWindow, _) => {
            run::<sliding_window::SlidingWindow>(None, op, now, cost, quota, State::SlidingWindow)
        }
        (K::SlidingLog, State::SlidingLog(s)) => {
            run::<sliding_log::SlidingLog>(Some(s), op, now, cost, quota, |s| {
                State::SlidingLog(Box::new(s))
            })
        }
        (K::SlidingLog, _) => run::<sliding_log::SlidingLog>(None, op, now, cost, quota, |s| {
            State::SlidingLog(Box::new(s))
        }),
        (K::TokenBucket, State::TokenBucket(s)) => {
            run::<token_bucket::TokenBucket>(Some(s), op, now, cost, quota, State::TokenBucket)
        }
        (K::TokenBucket, _) => {
            run::<token_bucket::TokenBucket>(None, op, now, cost, quota, State::TokenBucket)
        }
        (K::Gcra, State::Gcra(s)) => run::<gcra::Gcra>(Some(s), op, now, cost, quota, State::Gcra),
        (K::Gcra, _) => run::<gcra::Gcra>(None, op, now, cost, quota, State::Gcra),
        // Without its slot a concurrency limit can neither take nor free one: refused
        // (a refund: nothing given back). The limiter never asks this.
        (K::Concurrency, _) => {
            let decision = match op {
                Op::Charge => Decision::invalid_quota(cost, quota),
                Op::Refund => Decision::refund_of_invalid_quota(),
            };
            (decision, state.clone())
        }
    }
}

/// The instant from which `state` answers as a fresh state would (see
/// [`Algorithm::expires_at`]): the store may drop the key then.
pub fn expires_at(state: &State, quota: &Quota) -> Micros {
    match state {
        State::FixedWindow(s) => fixed_window::FixedWindow::expires_at(s, quota),
        State::SlidingWindow(s) => sliding_window::SlidingWindow::expires_at(s, quota),
        State::SlidingLog(s) => sliding_log::SlidingLog::expires_at(s, quota),
        State::TokenBucket(s) => token_bucket::TokenBucket::expires_at(s, quota),
        State::Gcra(s) => gcra::Gcra::expires_at(s, quota),
        State::Concurrency(s) => concurrency::expires_at(s, quota),
    }
}
