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

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

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
}

impl AlgorithmKind {
    /// The name used in rule files (`algorithm: token_bucket`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::SlidingLog => "sliding_log",
            Self::TokenBucket => "token_bucket",
            Self::Gcra => "gcra",
        }
    }

    /// Parses a rule file's algorithm name.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::FixedWindow,
            Self::SlidingWindow,
            Self::SlidingLog,
            Self::TokenBucket,
            Self::Gcra,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == name)
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
    /// Fixed window only: do not count hits of a refused request
    /// (the reference's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
    pub stop_increment_when_over_limit: bool,
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
    /// Time until a request of the same cost would be admitted; zero when allowed.
    pub retry_after: Micros,
    /// Units in use after this decision as the algorithm counts them, including the
    /// cost of a refused request (for fixed window, the window counter after the
    /// increment). Feeds the reference's near/over limit statistics.
    pub used: u64,
}

/// One algorithm: the shape of its per-key state and its pure decision function.
pub trait Algorithm {
    /// State kept per key. `Default` is the state of a key never seen.
    type State: Clone + Default + PartialEq + std::fmt::Debug;

    /// Decides a request of `cost` units at `now`. Returns the decision and the state to
    /// store if the caller commits it. `cost == 0` checks without charging. For a refused
    /// request the returned state charges nothing, except fixed window (reference
    /// semantics: refused hits count unless `stop_increment_when_over_limit`).
    fn decide(state: &Self::State, now: Micros, cost: u64, quota: &Quota)
        -> (Decision, Self::State);

    /// The instant from which `state` answers exactly as a fresh state would: the
    /// key may be dropped then (memory eviction, Redis TTL).
    fn expires_at(state: &Self::State, quota: &Quota) -> Micros;
}
