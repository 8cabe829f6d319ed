//! The compiled, immutable rule model that the request path reads.

use std::borrow::Cow;
use std::sync::Arc;

use crate::algorithm::{AlgorithmKind, Micros, OnOverLimit, Quota, MICROS_PER_SECOND};
use crate::regions::RegionWeights;

/// Time unit of a limit. Month is 30 days and year 365 days, as in the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3 600 seconds.
    Hour,
    /// 86 400 seconds.
    Day,
    /// 604 800 seconds.
    Week,
    /// 2 592 000 seconds (30 days).
    Month,
    /// 31 536 000 seconds (365 days).
    Year,
}

impl Unit {
    /// Length of the unit in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 604_800,
            Self::Month => 2_592_000,
            Self::Year => 31_536_000,
        }
    }

    /// Length of the unit in microseconds.
    pub fn micros(self) -> u64 {
        self.seconds() * MICROS_PER_SECOND
    }

    /// Parses a unit name case-insensitively (`second`, `MINUTE`, ...).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "second" => Self::Second,
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            "year" => Self::Year,
            _ => return None,
        })
    }

    /// Upper-case name, as the reference prints it (`SECOND`).
    pub fn as_upper_str(self) -> &'static str {
        match self {
            Self::Second => "SECOND",
            Self::Minute => "MINUTE",
            Self::Hour => "HOUR",
            Self::Day => "DAY",
            Self::Week => "WEEK",
            Self::Month => "MONTH",
            Self::Year => "YEAR",
        }
    }
}

/// What a check gets when the store cannot answer in time (DESIGN §7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum FailureMode {
    /// Allow the request (default).
    #[default]
    Open,
    /// Refuse the request.
    Closed,
    /// Enforce `limit / replicas` in local memory.
    Local,
    /// Fail the call with gRPC `UNAVAILABLE`; Envoy's `failure_mode_deny` decides.
    Error,
}

/// Token leasing of a limit (DESIGN §6, layer 3): `lease: off | auto | N`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum LeaseMode {
    /// Every check goes to the store (default).
    #[default]
    Off,
    /// Lease only keys this instance sees above a rate threshold, with a lease size
    /// derived from the limit (see `limiter::lease`).
    Auto,
    /// Take this many units per store call for every key of the rule.
    Units(u32),
}

/// Default lifetime of a lease.
pub(crate) const DEFAULT_LEASE_TTL_MICROS: u64 = 250_000;

/// How a limit is leased.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Lease {
    /// Off, auto or a fixed size.
    pub(crate) mode: LeaseMode,
    /// Longest life of one lease in microseconds (`lease_ttl`, default 250 ms); never
    /// past the end of a fixed or sliding window.
    pub(crate) ttl: u64,
}

impl Default for Lease {
    fn default() -> Self {
        Self {
            mode: LeaseMode::Off,
            ttl: DEFAULT_LEASE_TTL_MICROS,
        }
    }
}

/// How a limit is shared between regions (`scope`, `sharing`, `weights`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    /// Each region enforces the whole limit on its own (`scope: regional`, the default).
    #[default]
    Regional,
    /// `scope: global`, `sharing: split`: each region enforces a static share of the
    /// limit; the limit's `requests_per_unit` and `burst` are this region's share.
    Split {
        /// The configured `requests_per_unit` (or `max_in_flight`) of all regions.
        global_limit: u32,
        /// The configured `burst` of all regions, if any.
        global_burst: Option<u32>,
        /// Each region's weight, by region index.
        weights: RegionWeights,
    },
    /// `scope: global`, `sharing: aggregate`: each region counts the others' last known
    /// usage too; the limit's numbers are whole.
    Aggregate {
        /// Each region's weight (its share while its usage is not known), by region index.
        weights: RegionWeights,
    },
}

/// One limit of a rule: `requests_per_unit` per `unit` under an algorithm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Units admitted per `unit`.
    pub requests_per_unit: u32,
    /// Window length or refill period.
    pub unit: Unit,
    /// Algorithm deciding this limit.
    pub(crate) algorithm: AlgorithmKind,
    /// Capacity for token bucket and GCRA; `None` means `requests_per_unit`.
    pub(crate) burst: Option<u32>,
    /// What happens to this limit's checks when the store fails.
    pub(crate) failure_mode: FailureMode,
    /// Token leasing (only for a rule's single `rate_limit`).
    pub(crate) lease: Lease,
    /// Every unit the store admits is recorded in the usage ledger (`ledger: true`).
    pub(crate) ledger: bool,
    /// `on_over_limit`: whether a charge that does not fit still counts (debt).
    pub(crate) on_over_limit: OnOverLimit,
    /// Concurrency limits: the longest a slot is held before it is reclaimed
    /// (`max_hold`, µs); `requests_per_unit` is then `max_in_flight`, and `unit`
    /// means nothing. 0 for the other algorithms.
    pub(crate) max_hold: Micros,
    /// The longest wait a refused request may be delayed by instead (`max_delay`, µs;
    /// 0: never delayed).
    pub(crate) max_delay: Micros,
    /// How the limit is shared between regions.
    pub(crate) scope: Scope,
}

impl Limit {
    /// The algorithm parameters of this limit (a concurrency limit's period is its
    /// `max_hold`).
    pub(crate) fn quota(&self) -> Quota {
        Quota {
            limit: u64::from(self.requests_per_unit),
            period: if self.algorithm == AlgorithmKind::Concurrency {
                self.max_hold
            } else {
                self.unit.micros()
            },
            burst: u64::from(self.burst.unwrap_or(self.requests_per_unit)),
            on_over_limit: self.on_over_limit,
        }
    }
}

/// A rule: what applies at one descriptor node of the config tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Domain the rule belongs to.
    pub(crate) domain: Arc<str>,
    /// The reference's stats key for this node (`domain.key_value.key2`), used as the
    /// `rule` metric label and in `/rlconfig`.
    pub(crate) stats_key: Arc<str>,
    /// The `rule` metric label: the stats key as the reference names its statistics
    /// ([`stats_name`](crate::rules::stats_name)); the same string for nearly every rule.
    pub(crate) stats_label: Arc<str>,
    /// Where the rule came from, for humans: `file.yaml: descriptors[0].descriptors[1]`.
    pub(crate) config_path: Arc<str>,
    /// The limit's `name` (reported in `current_limit.name`), if any.
    pub name: Option<Arc<str>>,
    /// Limits checked all-or-nothing. Empty when `unlimited`.
    pub limits: Vec<Limit>,
    /// `unlimited: true`: always OK, `limit_remaining` u32::MAX, never counted.
    pub unlimited: bool,
    /// Counted and reported, but never refuses.
    pub shadow_mode: bool,
    /// Quota mode: an OVER_LIMIT here does not make the overall code OVER_LIMIT.
    pub(crate) quota_mode: bool,
    /// Names of limits this rule replaces when both match in one request.
    pub(crate) replaces: Vec<Arc<str>>,
    /// Stats key uses the request's own values (`detailed_metric`).
    pub detailed_metric: bool,
    /// Free-form `metadata` of the rule, as JSON (emitted in dynamic metadata).
    pub metadata: Option<Arc<serde_json::Value>>,
    /// What the limits ask of the pipeline, read on every request (see [`Needs`]).
    pub(crate) needs: Needs,
}

/// What a rule's limits ask of the pipeline beyond a store check, worked out once when
/// the rule is built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Needs {
    /// A concurrency limit: decided with the slot its descriptor's last entry names.
    pub(crate) slots: bool,
    /// A limit that delays (`max_delay`).
    pub(crate) delays: bool,
}

impl Needs {
    /// What `limits` ask.
    pub(crate) fn of(limits: &[Limit]) -> Self {
        Self {
            slots: limits
                .iter()
                .any(|limit| limit.algorithm == AlgorithmKind::Concurrency),
            delays: limits.iter().any(|limit| limit.max_delay > 0),
        }
    }
}

impl Rule {
    /// Whether the rule's limit is a concurrency limit: decided with the slot its
    /// descriptor's last entry names, that entry left out of the counter key.
    pub(crate) fn holds_slots(&self) -> bool {
        self.needs.slots
    }

    /// Whether a refused charge may be admitted later instead (`max_delay`).
    pub(crate) fn delays(&self) -> bool {
        self.needs.delays
    }

    /// Whether only the store may answer this rule's checks: a concurrency limit (a
    /// slot freed by a release the local layers never see) or a limit that delays
    /// (`max_delay`: the store reserves the wait).
    pub(crate) fn answered_by_store_only(&self) -> bool {
        self.needs.slots || self.needs.delays
    }
}

/// One request entry, borrowed from the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Descriptor key.
    pub key: &'a str,
    /// Descriptor value (may be empty).
    pub value: &'a str,
}

/// A per-request limit override sent by Envoy in the descriptor's `limit` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    /// Units admitted per `unit`.
    pub requests_per_unit: u32,
    /// Window length.
    pub unit: Unit,
}

/// The outcome of matching one descriptor.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup<'r> {
    /// The domain has no rules (the reference counts `<domain>.domain_not_found`).
    UnknownDomain,
    /// The domain exists but no limit applies to this descriptor.
    NoMatch,
    /// A rule applies.
    Matched(Matched<'r>),
}

/// A rule that applies to one descriptor: one of the rule set's, or one made for a
/// request's limit override. Two words wide (a `Cow<Rule>` holds a whole rule inline, and
/// the limiter keeps one per descriptor across a store's round trip).
#[derive(Clone, Debug, PartialEq)]
pub enum RuleRef<'r> {
    /// A rule of the rule set.
    Borrowed(&'r Rule),
    /// A rule made for a request's limit override.
    Owned(Box<Rule>),
}

impl std::ops::Deref for RuleRef<'_> {
    type Target = Rule;

    fn deref(&self) -> &Rule {
        match self {
            RuleRef::Borrowed(rule) => rule,
            RuleRef::Owned(rule) => rule,
        }
    }
}

/// A rule that applies to one descriptor, with what depends on the request's values.
#[derive(Clone, Debug, PartialEq)]
pub struct Matched<'r> {
    /// The rule (owned only for a request's limit override).
    pub rule: RuleRef<'r>,
    /// Stats key for this request: the rule's, or one built from request values for
    /// `detailed_metric`, `value_to_metric`, `share_threshold` and overrides.
    pub stats_key: Cow<'r, str>,
    /// Per request entry, the wildcard pattern that replaces the value in the counter
    /// key (`share_threshold`), `None` for entries that keep their value. Empty when no
    /// entry shares.
    pub share_patterns: Vec<Option<&'r str>>,
}

/// How one request entry matched a level of the config tree (for `explain`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MatchStep {
    /// The entry's value equals a configured value.
    Exact,
    /// The entry's value matched this wildcard pattern.
    Wildcard(String),
    /// Only the key matched (a descriptor configured without a value).
    KeyOnly,
    /// Nothing at this level matched (or an earlier level did not).
    NoMatch,
}

impl std::fmt::Display for MatchStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact => f.write_str("exact value"),
            Self::Wildcard(pattern) => write!(f, "wildcard {pattern:?}"),
            Self::KeyOnly => f.write_str("key only"),
            Self::NoMatch => f.write_str("no match"),
        }
    }
}
