//! Counter stores: where algorithm state lives. [`memory`] is the default; [`redis`]
//! shares counters between instances behind the same [`Store`] trait. A store knows keys, algorithms and time; it
//! knows nothing of rules, requests or responses.

pub(crate) mod breaker;
pub(crate) mod key;
pub mod memory;
pub mod redis;

use std::future::Future;
use std::sync::Arc;

use crate::algorithm::concurrency::{SlotId, SlotOp};
use crate::algorithm::{AlgorithmKind, Decision, Micros, Quota};
pub(crate) use key::LimitKey;
pub use key::{CounterKey, KeyPrefix, KeyPrefixError};

/// One limit to decide within a [`StoreCheck`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LimitCheck {
    /// Algorithm of the limit.
    pub algorithm: AlgorithmKind,
    /// Its numbers.
    pub quota: Quota,
    /// Whether other regions' usage counts too (a `scope: global` limit shared by
    /// aggregation; the memory store has no other region).
    pub sharing: crate::regions::Sharing,
}

/// One descriptor's check: every limit of the matched rule, decided all-or-nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreCheck {
    /// Identity of the descriptor's counters.
    pub key: CounterKey,
    /// The limits, in rule order. Limit `i` lives at `key.for_limit(i)`. Shared, so a
    /// store that hands checks to another task (the Redis batcher) copies no list.
    pub limits: Arc<[LimitCheck]>,
    /// Units this request costs (0 = check without charging), or, for a refund, the
    /// units it gives back.
    pub cost: u64,
    /// A negative hit: `cost` units are given back ([`crate::algorithm::refund`]),
    /// never refused.
    pub refund: bool,
    /// The longest wait a refused charge may be admitted after instead
    /// ([`crate::algorithm::decide_delayed`]; single-limit checks only): 0, never.
    pub max_wait: Micros,
}

/// A lease call (DESIGN §6, layer 3) for one single-limit check: return what is unused
/// of the previous lease, decide the request, and if admitted take `units` more,
/// all-or-nothing, in one atomic store call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The request's check (exactly one limit); `cost` 0 only returns units.
    pub check: StoreCheck,
    /// Units to lease if the request is admitted (0: none).
    pub units: u64,
    /// Longest life of the lease in microseconds (token bucket and GCRA reserve its
    /// refill, see `limiter::lease`).
    pub lifetime: Micros,
    /// The previous lease's unused units, the store time it was granted at and its
    /// lifetime.
    pub give_back: Option<(u64, Micros, Micros)>,
}

/// One request's call on a concurrency limit (`algorithm: concurrency`): take, probe or
/// give back its own slot ([`crate::algorithm::concurrency::hold`]), in one atomic
/// store call on the store's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldCall {
    /// The descriptor's counters (its slot entry left out).
    pub key: CounterKey,
    /// `limit` slots, each held at most `period` µs.
    pub quota: Quota,
    /// The request's slot.
    pub slot: SlotId,
    /// What to do with it.
    pub op: SlotOp,
}

/// What a lease call answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The request's decision, as [`Store::check`] would have answered it.
    pub decision: Decision,
    /// Units leased (0 or the units asked for).
    pub units: u64,
    /// The store's clock when it decided (identifies the lease's window and refill).
    pub store_now: Micros,
    /// Time left in the current window (fixed and sliding window; 0 for the others):
    /// a lease never outlives the window it was charged in.
    pub window_left: Micros,
}

/// Errors a store reports. Every store error is answered by the rule's failure mode.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer within its deadline.
    #[error("store call timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The store is unreachable or refused the call; may succeed if retried later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something this version cannot use (a bug or a misconfiguration).
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// The store refused our credentials (wrong password, unknown user).
    #[error("store authentication failed: {0}")]
    Auth(String),
    /// The store's ACL forbids a command we need (e.g. EVALSHA).
    #[error("store permission denied: {0}")]
    NoPermission(String),
    /// The circuit breaker of the named store node is open: the store was not asked.
    #[error("store circuit breaker open for {0}")]
    BreakerOpen(String),
    /// The store is out of memory and refuses writes (`maxmemory` with `noeviction`).
    #[error("store out of memory: {0}")]
    OutOfMemory(String),
    /// Only some checks of a call failed (a cluster shard down, its breaker open): those
    /// (indexes into the call's checks) with `error`. The others were decided, and
    /// charged, as if alone; their decisions are in place, the failed ones' are not.
    #[error("{error} ({} of the checks)", failed.len())]
    Partly {
        /// Indexes of the failed checks, ascending.
        failed: Vec<usize>,
        /// What the first of them failed with.
        error: Box<StoreError>,
    },
}

impl StoreError {
    /// Short, bounded label for metrics (`sluice_store_errors_total{kind}`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Unavailable(_) => "unavailable",
            Self::Protocol(_) => "protocol",
            Self::BreakerOpen(_) => "breaker_open",
            Self::Auth(_) => "auth",
            Self::NoPermission(_) => "noperm",
            Self::OutOfMemory(_) => "oom",
            Self::Partly { error, .. } => error.kind(),
        }
    }
}

/// A place where counters live.
///
/// Semantics every store implements identically: for each check, every limit is
/// decided at the store's current time (a refund gives `cost` back to every limit, and
/// is never refused); if all allow, every limit is charged `cost`;
/// if any refuses, none is charged, except the limits with `on_over_limit: charge`
/// (every charge counts: [`crate::algorithm::OnOverLimit::Charge`]), and except that a
/// rule with a single fixed-window limit charges a refused request (the reference's behaviour; the limiter's
/// `stop_increment_when_over_limit` setting decides before it charges).
pub trait Store: Send + Sync + 'static {
    /// Decides `checks`, appending one decision per limit, in order, to `decisions`
    /// (left empty or partly filled on an error; on [`StoreError::Partly`], filled for
    /// every check, the failed ones' with placeholders).
    fn check(
        &self,
        checks: &[StoreCheck],
        decisions: &mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads what `check` would decide for `check`, charging nothing (`/explain`).
    fn peek(
        &self,
        check: &StoreCheck,
        decisions: &mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Short name for `/status` and logs (`memory`, `redis`, ...).
    fn kind(&self) -> &'static str;

    /// Whether other instances share these counters (a remote store): the hot-key
    /// layers that answer from local memory are only worth their cost then.
    fn is_shared(&self) -> bool {
        false
    }

    /// Runs a lease call (see [`LeaseRequest`]). Stores that do not lease (the memory
    /// store: its counters are local anyway) answer with an error, and the limiter
    /// decides through [`Store::check`] instead.
    fn lease(
        &self,
        _request: &LeaseRequest,
    ) -> impl Future<Output = Result<LeaseGrant, StoreError>> + Send {
        async { Err(StoreError::Protocol("this store does not lease".into())) }
    }

    /// Runs a concurrency limit's call (see [`HoldCall`]).
    fn hold(&self, call: &HoldCall) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Health and breaker state for `/status`. A store that cannot fail is always ok.
    fn status(&self) -> StoreStatus {
        StoreStatus::default()
    }
}

/// What `/status` shows of a store. Never part of readiness (DESIGN §1).
#[derive(Clone, Debug, PartialEq)]
pub struct StoreStatus {
    /// `ok`, `degraded` (some node's breaker is not closed, or some node is not
    /// connected) or `down` (no node connected, or every breaker open).
    pub(crate) health: &'static str,
    /// Breaker state (JSON), `null` for stores without one.
    pub(crate) breaker: serde_json::Value,
    /// How the Redis store runs its Lua code: `functions` (`FCALL`) or `scripts`
    /// (`EVALSHA`, once a node refused functions); `None` for other stores.
    pub(crate) lua: Option<&'static str>,
    /// This region and its links to the others (JSON), `null` without `--region`.
    pub(crate) regions: serde_json::Value,
}

impl Default for StoreStatus {
    fn default() -> Self {
        Self {
            health: "ok",
            breaker: serde_json::Value::Null,
            lua: None,
            regions: serde_json::Value::Null,
        }
    }
}

/// A shared store is a store (the server keeps a handle for background sweeps).
impl<T: Store> Store for std::sync::Arc<T> {
    fn check(
        &self,
        checks: &[StoreCheck],
        decisions: &mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).check(checks, decisions)
    }

    fn peek(
        &self,
        check: &StoreCheck,
        decisions: &mut Vec<Decision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).peek(check, decisions)
    }

    fn kind(&self) -> &'static str {
        (**self).kind()
    }

    fn is_shared(&self) -> bool {
        (**self).is_shared()
    }

    fn lease(
        &self,
        request: &LeaseRequest,
    ) -> impl Future<Output = Result<LeaseGrant, StoreError>> + Send {
        (**self).lease(request)
    }

    fn hold(&self, call: &HoldCall) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).hold(call)
    }

    fn status(&self) -> StoreStatus {
        (**self).status()
    }
}
