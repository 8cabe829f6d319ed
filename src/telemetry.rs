//! Metrics (Prometheus text via `prometheus-client`) and log setup.
//!
//! Labels are bounded by configuration, never by descriptor values, except the stats
//! keys built from request values (`detailed_metric`, `value_to_metric`, limit
//! overrides), which are capped at [`MAX_RULE_LABELS`] values of at most
//! [`MAX_RULE_LABEL_BYTES`]. The `rule` label is the reference's statistic name, so
//! dashboards built on envoyproxy/ratelimit's `ratelimit.service.rate_limit.<key>.<stat>`
//! map one to one onto `sluice_rule_hits_total{rule="<key>", stat="<stat>"}`.

mod process;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Most distinct `rule` label values; further detailed-metric keys share `overflow`.
pub(crate) const MAX_RULE_LABELS: usize = 10_000;

/// Longest `rule` label built from request values; a longer key is cut (at a character
/// boundary) and ends in `...`.
pub(crate) const MAX_RULE_LABEL_BYTES: usize = 256;

/// Label of a per-rule hit statistic.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RuleStatLabels {
    /// The reference's stats key (`domain.key_value`).
    pub(crate) rule: Arc<str>,
    /// `total_hits`, `over_limit`, `near_limit`, `within_limit`, `shadow_mode`,
    /// `over_limit_with_local_cache`.
    pub(crate) stat: &'static str,
}

/// Label of a per-rule decision count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DecisionLabels {
    /// Domain of the request.
    pub(crate) domain: Arc<str>,
    /// The reference's stats key.
    pub(crate) rule: Arc<str>,
    /// `ok`, `over_limit`, `near_limit` or `shadow_over_limit`.
    pub(crate) decision: &'static str,
}

/// A label with one bounded string value.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabel {
    /// The bounded value.
    pub(crate) kind: &'static str,
}

/// Labels of a failure-mode decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FallbackLabels {
    /// The reference's stats key of the rule.
    pub(crate) rule: Arc<str>,
    /// `open`, `closed`, `local` or `error`.
    pub(crate) mode: &'static str,
}

/// A local decision layer label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LayerLabel {
    /// `blocked_cache`, `precheck` or `lease`.
    pub layer: &'static str,
}

/// How a delayed answer ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `answered`, `drained` or `late`.
    pub outcome: &'static str,
}

/// A rule label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RuleLabel {
    /// The reference's stats key of the rule.
    pub(crate) rule: Arc<str>,
}

/// A store operation label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OpLabel {
    /// `check` or `peek`.
    pub(crate) op: &'static str,
}

/// A store node label (`host:port`, or `redis` for a single node).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NodeLabel {
    /// The node.
    pub(crate) node: Arc<str>,
}

/// Another region's label (`--region`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RegionLabel {
    /// Its name.
    pub(crate) region: String,
}

/// A circuit-breaker state label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabel {
    /// `closed`, `open` or `half_open`.
    pub(crate) state: &'static str,
}

/// Labels of `sluice_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BuildLabels {
    /// The crate's version (`Cargo.toml`).
    pub(crate) version: &'static str,
    /// The optional cargo features built in, comma-separated (`otel`, `bench`), or empty.
    pub(crate) features: &'static str,
}

/// The optional features of this build, for `sluice_build_info{features}`.
const FEATURES: &str = match (cfg!(feature = "otel"), cfg!(feature = "bench")) {
    (true, true) => "otel,bench",
    (true, false) => "otel",
    (false, true) => "bench",
    (false, false) => "",
};

/// A reload outcome label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    /// `success` or `error` (rule loads), `ack` or `nack` (xDS responses).
    pub(crate) result: &'static str,
}

/// Every metric Sluice exports.
pub struct Metrics {
    /// The registry `/metrics` encodes.
    registry: Registry,
    /// Reference-compatible per-rule statistics, in hits.
    pub(crate) rule_hits: Family<RuleStatLabels, Counter>,
    /// Per-rule decisions, in requests.
    pub(crate) requests: Family<DecisionLabels, Counter>,
    /// Time to answer one ShouldRateLimit call.
    pub(crate) request_duration: Histogram,
    /// Calls that failed: `service_error` (bad request, no rules) or `store_error`.
    pub(crate) call_errors: Family<KindLabel, Counter>,
    /// Calls whose OVER_LIMIT was turned into OK by global shadow mode.
    pub(crate) global_shadow_mode: Counter,
    /// Descriptors looked up in a domain that has no rules.
    pub(crate) domain_not_found: Counter,
    /// Rule set loads by result.
    pub(crate) config_reloads: Family<ResultLabel, Counter>,
    /// Rules in the active rule set.
    pub(crate) config_rules: Gauge,
    /// Live entries the memory store evicted because it was full.
    pub(crate) memory_evictions: Counter,
    /// Ledger units written to PostgreSQL.
    pub(crate) ledger_written_units: Counter,
    /// Ledger units sealed and not written yet (the spool).
    pub(crate) ledger_spooled_units: Gauge,
    /// Seal time (Unix seconds) of the oldest unwritten ledger batch; 0 when none.
    pub(crate) ledger_oldest_unwritten: Gauge,
    /// Failed ledger writes and connection attempts.
    pub(crate) ledger_write_failures: Counter,
    /// Ledger units dropped because the queue or the spool was full.
    pub(crate) ledger_dropped_units: Counter,
    /// Units added to store counters found lower than the ledger.
    pub(crate) ledger_restored_units: Counter,
    /// Decisions made without the store, per local layer.
    pub local_decisions: Family<LayerLabel, Counter>,
    /// Units of the leases this instance holds open (used or not), per rule.
    pub(crate) lease_outstanding: Family<RuleLabel, Gauge>,
    /// Per leased rule, the documented bound of early refusal in units:
    /// `(replicas − 1) × N` (plus the refill reserve for token bucket and GCRA).
    pub(crate) lease_bound: Family<RuleLabel, Gauge>,
    /// Checks per Redis batch.
    pub(crate) batch_size: Histogram,
    /// Time of one store call (`op` = `check` or `peek`), queueing included.
    pub(crate) store_durations: Family<OpLabel, Histogram, fn() -> Histogram>,
    /// Failed store calls by [`crate::store::StoreError::kind`].
    pub(crate) store_errors: Family<KindLabel, Counter>,
    /// Checks answered by a rule's failure mode because the store failed.
    pub(crate) store_fallbacks: Family<FallbackLabels, Counter>,
    /// Circuit breaker state per store node: 0 closed, 1 open, 2 half-open.
    pub(crate) breaker_state: Family<NodeLabel, Gauge>,
    /// Circuit breaker transitions by the state entered.
    pub(crate) breaker_transitions: Family<StateLabel, Counter>,
    /// Whether the xDS stream to the management server is open (1) or not (0).
    pub(crate) xds_connected: Gauge,
    /// xDS responses received, by what was answered: `ack` (loaded) or `nack`.
    pub(crate) xds_responses: Family<ResultLabel, Counter>,
    /// When rules were last loaded, in Unix seconds (0 before the first load).
    pub(crate) config_last_success: Gauge<f64, AtomicU64>,
    /// 1 while the last load of new rule content failed (previous rules keep serving),
    /// 0 once a load succeeds.
    pub(crate) config_failing: Gauge,
    /// Resident memory, in bytes (read from `/proc` at each scrape).
    pub(crate) process_resident_memory: Gauge,
    /// User and system CPU time, in seconds (read from `/proc` at each scrape).
    pub(crate) process_cpu: Counter<f64, AtomicU64>,
    /// Open file descriptors (read from `/proc` at each scrape).
    pub(crate) process_open_fds: Gauge,
    /// The soft limit on open file descriptors.
    pub(crate) process_max_fds: Gauge,
    /// When the process started, in Unix seconds.
    pub(crate) process_start_time: Gauge<f64, AtomicU64>,
    /// Tokio tasks alive on Sluice's runtimes (the main one and every serving thread's),
    /// read at each scrape.
    pub(crate) runtime_alive_tasks: Gauge,
    /// Answers held back by a delay (`max_delay`), waiting now.
    pub(crate) delayed_pending: Gauge,
    /// 1 while publications to the region succeed and its own reach this region.
    pub(crate) region_link_up: Family<RegionLabel, Gauge>,
    /// 1 while the region's usage is not known lately: checks take its fallback share.
    pub(crate) region_stale: Family<RegionLabel, Gauge>,
    /// Time since a publication to the region last succeeded.
    pub(crate) region_lag: Family<RegionLabel, Gauge<f64, AtomicU64>>,
    /// Round trip of the last publication to the region.
    pub(crate) region_round_trip: Family<RegionLabel, Gauge<f64, AtomicU64>>,
    /// When a publication to the region last succeeded (Unix seconds).
    pub(crate) region_last_sent: Family<RegionLabel, Gauge<f64, AtomicU64>>,
    /// Keys published to the region.
    pub(crate) region_sent_keys: Family<RegionLabel, Counter>,
    /// Publications to the region that failed.
    pub(crate) region_failures: Family<RegionLabel, Counter>,
    /// Age of the region's last publication to this one.
    pub(crate) region_received_age: Family<RegionLabel, Gauge<f64, AtomicU64>>,
    /// Keys in the region's last publication to this one.
    pub(crate) region_received_keys: Family<RegionLabel, Gauge>,
    /// Charged keys not published because too many waited.
    pub(crate) region_dropped_keys: Counter,
    /// Delayed answers, by how they ended: `answered` after the wait, `drained` at once
    /// by a shutdown, `late` refused (the wait would have outlived the call's deadline).
    pub(crate) delayed_answers: Family<OutcomeLabel, Counter>,
    /// The waits of delayed answers, in seconds.
    pub(crate) delay_seconds: Histogram,
    /// The runtimes whose tasks `runtime_alive_tasks` counts.
    runtimes: Mutex<Vec<tokio::runtime::Handle>>,
    /// One scrape at a time moves the CPU counter to the `/proc` reading.
    process_refresh: Mutex<()>,
    /// Distinct `rule` label values handed out so far (the cardinality cap).
    rule_labels: Mutex<HashSet<Arc<str>>>,
    /// Each (domain, rule label) pair's counters, resolved once: the request path then
    /// pays one pointer-keyed lookup instead of a label-set hash per statistic. Keyed by
    /// the labels' `Arc` addresses, kept alive by the entry so an address is never
    /// reused while cached; emptied when it outgrows [`MAX_CACHED_RULES`] (labels of
    /// replaced rule sets), which loses nothing: the counters live in the families.
    rule_counters: RwLock<HashMap<(usize, usize), CachedCounters, BuildHasherDefault<PtrHasher>>>,
    /// Every (domain, rule label) pair that may have series, so that those of rules a
    /// reload removed can be found and dropped ([`Metrics::forget_rules`]).
    series_rules: Mutex<HashSet<(Arc<str>, Arc<str>)>>,
}

/// The `mode` labels of `sluice_store_fallback_total`: every rule failure mode.
const FAILURE_MODES: [&str; 4] = ["open", "closed", "local", "error"];

/// Most cached rule counter sets before the cache starts over.
const MAX_CACHED_RULES: usize = 4 * MAX_RULE_LABELS;

/// A cache entry: the labels (kept alive) and their counters.
type CachedCounters = (Arc<str>, Arc<str>, Arc<RuleCounters>);

/// A reference hit statistic (`sluice_rule_hits_total{stat}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RuleStat {
    /// `total_hits`.
    TotalHits,
    /// `within_limit`.
    WithinLimit,
    /// `near_limit`.
    NearLimit,
    /// `over_limit`.
    OverLimit,
    /// `shadow_mode`.
    ShadowMode,
    /// `over_limit_with_local_cache`.
    OverLimitWithLocalCache,
    /// `refunded_hits`: hits given back by negative hits (`is_negative_hits`).
    RefundedHits,
}

impl RuleStat {
    const ALL: [RuleStat; 7] = [
        Self::TotalHits,
        Self::WithinLimit,
        Self::NearLimit,
        Self::OverLimit,
        Self::ShadowMode,
        Self::OverLimitWithLocalCache,
        Self::RefundedHits,
    ];

    /// The `stat` label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::TotalHits => "total_hits",
            Self::WithinLimit => "within_limit",
            Self::NearLimit => "near_limit",
            Self::OverLimit => "over_limit",
            Self::ShadowMode => "shadow_mode",
            Self::OverLimitWithLocalCache => "over_limit_with_local_cache",
            Self::RefundedHits => "refunded_hits",
        }
    }
}

/// The `decision` label values.
pub(crate) const DECISIONS: [&str; 5] = [
    "ok",
    "over_limit",
    "near_limit",
    "shadow_over_limit",
    "refund",
];

/// Every counter one rule label can move, each resolved from its family on first use
/// (so untouched series stay absent from `/metrics`, as before) and then kept.
pub(crate) struct RuleCounters {
    /// Domain label.
    domain: Arc<str>,
    /// Rule label.
    rule: Arc<str>,
    /// The per-rule hits family.
    rule_hits: Family<RuleStatLabels, Counter>,
    /// The per-rule decisions family.
    requests: Family<DecisionLabels, Counter>,
    /// Resolved hit counters, in [`RuleStat::ALL`] order.
    hits: [OnceLock<Counter>; 7],
    /// Resolved decision counters, in [`DECISIONS`] order.
    decisions: [OnceLock<Counter>; 5],
}

/// Adds `n` to `counter`, stopping at `u64::MAX`: a client's `hits_addend` near
/// `u64::MAX` must never wrap a counter (Prometheus reads a smaller value as a reset).
fn add_saturating(counter: &Counter, n: u64) {
    let _ = counter
        .inner()
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |value| {
            Some(value.saturating_add(n))
        });
}

impl RuleCounters {
    /// Adds `hits` to statistic `stat` (nothing for zero).
    pub(crate) fn add(&self, stat: RuleStat, hits: u64) {
        if hits == 0 {
            return;
        }
        let index = stat as usize;
        let counter = self.hits[index].get_or_init(|| {
            self.rule_hits
                .get_or_create(&RuleStatLabels {
                    rule: self.rule.clone(),
                    stat: RuleStat::ALL[index].as_str(),
                })
                .clone()
        });
        add_saturating(counter, hits);
    }

    /// Counts one decision; `decision` is one of [`DECISIONS`].
    pub(crate) fn decision(&self, decision: &'static str) {
        let Some(index) = DECISIONS.iter().position(|d| *d == decision) else {
            return;
        };
        self.decisions[index]
            .get_or_init(|| {
                self.requests
                    .get_or_create(&DecisionLabels {
                        domain: self.domain.clone(),
                        rule: self.rule.clone(),
                        decision: DECISIONS[index],
                    })
                    .clone()
            })
            .inc();
    }
}

/// Hashes pointer pairs: the addresses are distinct, folding them is enough.
#[derive(Default)]
pub(crate) struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_usize(&mut self, value: usize) {
        self.0 = (self.0.rotate_left(29) ^ value as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Metrics {
    /// Registers every metric under the `sluice_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let rule_hits = Family::default();
        registry.register(
            "rule_hits",
            "Hits per rule and statistic, as envoyproxy/ratelimit's rate_limit stats",
            rule_hits.clone(),
        );
        let requests = Family::default();
        registry.register(
            "requests",
            "Descriptor decisions per rule",
            requests.clone(),
        );
        let request_duration = Histogram::new(exponential_buckets(0.000_025, 2.0, 16));
        registry.register(
            "request_duration_seconds",
            "Time to answer one ShouldRateLimit call",
            request_duration.clone(),
        );
        let call_errors = Family::default();
        registry.register(
            "call_errors",
            "Failed ShouldRateLimit calls",
            call_errors.clone(),
        );
        let global_shadow_mode = Counter::default();
        registry.register(
            "global_shadow_mode",
            "Calls let through by global shadow mode",
            global_shadow_mode.clone(),
        );
        let domain_not_found = Counter::default();
        registry.register(
            "domain_not_found",
            "Descriptors for a domain without rules",
            domain_not_found.clone(),
        );
        let config_reloads = Family::default();
        registry.register(
            "config_reload",
            "Rule set loads by result",
            config_reloads.clone(),
        );
        let config_rules = Gauge::default();
        registry.register(
            "config_rules",
            "Rules in the active rule set",
            config_rules.clone(),
        );
        let memory_evictions = Counter::default();
        registry.register(
            "memory_evictions",
            "Live counters evicted because the memory store was full",
            memory_evictions.clone(),
        );
        let ledger_written_units = Counter::default();
        registry.register(
            "ledger_written_units",
            "Units of ledger rules written to PostgreSQL",
            ledger_written_units.clone(),
        );
        let ledger_spooled_units = Gauge::default();
        registry.register(
            "ledger_spooled_units",
            "Units of ledger rules sealed in batches and not yet written (the spool)",
            ledger_spooled_units.clone(),
        );
        let ledger_oldest_unwritten = Gauge::default();
        registry.register(
            "ledger_oldest_unwritten_timestamp_seconds",
            "When the oldest unwritten ledger batch was sealed (Unix seconds; 0: none): the lag is time() minus it",
            ledger_oldest_unwritten.clone(),
        );
        let ledger_write_failures = Counter::default();
        registry.register(
            "ledger_write_failures",
            "Failed ledger writes and connection attempts to PostgreSQL",
            ledger_write_failures.clone(),
        );
        let ledger_dropped_units = Counter::default();
        registry.register(
            "ledger_dropped_units",
            "Units of ledger rules never written: the queue or the spool was full",
            ledger_dropped_units.clone(),
        );
        let ledger_restored_units = Counter::default();
        registry.register(
            "ledger_restored_units",
            "Units added to store counters of ledger rules found lower than the ledger",
            ledger_restored_units.clone(),
        );
        let local_decisions = Family::default();
        registry.register(
            "local_decisions",
            "Decisions made without the store, per local layer",
            local_decisions.clone(),
        );
        let lease_outstanding = Family::default();
        registry.register(
            "lease_outstanding_units",
            "Units of the leases this instance holds open (used or not)",
            lease_outstanding.clone(),
        );
        let lease_bound = Family::default();
        registry.register(
            "lease_early_refusal_bound_units",
            "Most units leasing can refuse early, per leased rule: (replicas - 1) x lease size, plus the refill reserve",
            lease_bound.clone(),
        );
        let batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        registry.register("batch_size", "Checks per Redis batch", batch_size.clone());
        let store_durations: Family<OpLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_025, 2.0, 16))
            });
        registry.register(
            "store_duration_seconds",
            "Time of one store call",
            store_durations.clone(),
        );
        let store_errors = Family::default();
        registry.register(
            "store_errors",
            "Failed store calls by kind",
            store_errors.clone(),
        );
        let store_fallbacks = Family::default();
        registry.register(
            "store_fallback",
            "Checks answered by the rule's failure mode because the store failed",
            store_fallbacks.clone(),
        );
        let breaker_state = Family::default();
        registry.register(
            "breaker_state",
            "Store circuit breaker per node: 0 closed, 1 open, 2 half-open",
            breaker_state.clone(),
        );
        let breaker_transitions = Family::default();
        registry.register(
            "breaker_transitions",
            "Store circuit breaker transitions by the state entered",
            breaker_transitions.clone(),
        );
        let xds_connected = Gauge::default();
        registry.register(
            "xds_connected",
            "Whether the xDS stream to the management server is open",
            xds_connected.clone(),
        );
        let xds_responses = Family::default();
        registry.register(
            "xds_responses",
            "xDS responses received, by answer: ack (rules loaded) or nack (rejected)",
            xds_responses.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                features: FEATURES,
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1: the version and optional features of this build",
            build_info.clone(),
        );
        let config_last_success = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "config_last_reload_success_timestamp_seconds",
            "When rules were last loaded, in Unix seconds (0 before the first load)",
            config_last_success.clone(),
        );
        let config_failing = Gauge::default();
        registry.register(
            "config_reload_failing",
            "1 while the last load of new rule content failed, 0 after a success",
            config_failing.clone(),
        );
        let process_resident_memory = Gauge::default();
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the process, in bytes",
            process_resident_memory.clone(),
        );
        let process_cpu = Counter::<f64, AtomicU64>::default();
        registry.register(
            "process_cpu_seconds",
            "User and system CPU time of the process, in seconds",
            process_cpu.clone(),
        );
        let process_open_fds = Gauge::default();
        registry.register(
            "process_open_fds",
            "Open file descriptors of the process",
            process_open_fds.clone(),
        );
        let process_max_fds = Gauge::default();
        registry.register(
            "process_max_fds",
            "The soft limit on open file descriptors",
            process_max_fds.clone(),
        );
        let process_start_time = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "process_start_time_seconds",
            "When the process started, in Unix seconds",
            process_start_time.clone(),
        );
        let runtime_alive_tasks = Gauge::default();
        registry.register(
            "runtime_alive_tasks",
            "Tokio tasks alive on Sluice's runtimes (main and serving threads)",
            runtime_alive_tasks.clone(),
        );
        let delayed_pending = Gauge::default();
        registry.register(
            "delayed_answers_pending",
            "Answers held back by a delay (max_delay), waiting now",
            delayed_pending.clone(),
        );
        let delayed_answers = Family::default();
        registry.register(
            "delayed_answers",
            "Delayed answers by outcome: answered after the wait, drained by a shutdown, or late (refused: past the call's deadline)",
            delayed_answers.clone(),
        );
        let region_link_up = Family::default();
        registry.register(
            "region_link_up",
            "1 while publications to the region succeed and its publications reach this one",
            region_link_up.clone(),
        );
        let region_stale = Family::default();
        registry.register(
            "region_stale",
            "1 while the region's usage is not known lately (no publication from it within the stale time): checks take its fallback share",
            region_stale.clone(),
        );
        let region_lag = Family::default();
        registry.register(
            "region_link_lag_seconds",
            "Time since a publication to the region last succeeded",
            region_lag.clone(),
        );
        let region_round_trip = Family::default();
        registry.register(
            "region_link_round_trip_seconds",
            "Round trip of the last publication to the region",
            region_round_trip.clone(),
        );
        let region_last_sent = Family::default();
        registry.register(
            "region_last_sent_timestamp_seconds",
            "When a publication to the region last succeeded (Unix seconds)",
            region_last_sent.clone(),
        );
        let region_sent_keys = Family::default();
        registry.register(
            "region_sent_keys",
            "Keys of aggregated limits published to the region",
            region_sent_keys.clone(),
        );
        let region_failures = Family::default();
        registry.register(
            "region_publish_failures",
            "Publications to the region that failed (kept and sent again)",
            region_failures.clone(),
        );
        let region_received_age = Family::default();
        registry.register(
            "region_last_received_age_seconds",
            "Age of the region's last publication to this one",
            region_received_age.clone(),
        );
        let region_received_keys = Family::default();
        registry.register(
            "region_last_received_keys",
            "Keys in the region's last publication to this one",
            region_received_keys.clone(),
        );
        let region_dropped_keys = Counter::default();
        registry.register(
            "region_dropped_keys",
            "Charged keys of aggregated limits not published because too many waited",
            region_dropped_keys.clone(),
        );
        let delay_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "delay_seconds",
            "Waits of delayed answers (max_delay), in seconds",
            delay_seconds.clone(),
        );
        Self {
            config_last_success,
            config_failing,
            runtime_alive_tasks,
            delayed_pending,
            region_link_up,
            region_stale,
            region_lag,
            region_round_trip,
            region_last_sent,
            region_sent_keys,
            region_failures,
            region_received_age,
            region_received_keys,
            region_dropped_keys,
            delayed_answers,
            delay_seconds,
            runtimes: Mutex::new(Vec::new()),
            process_resident_memory,
            process_cpu,
            process_open_fds,
            process_max_fds,
            process_start_time,
            process_refresh: Mutex::new(()),
            breaker_state,
            breaker_transitions,
            xds_connected,
            xds_responses,
            registry,
            batch_size,
            store_durations,
            store_errors,
            rule_hits,
            requests,
            request_duration,
            call_errors,
            global_shadow_mode,
            domain_not_found,
            config_reloads,
            config_rules,
            memory_evictions,
            ledger_written_units,
            ledger_spooled_units,
            ledger_oldest_unwritten,
            ledger_write_failures,
            ledger_dropped_units,
            ledger_restored_units,
            local_decisions,
            lease_outstanding,
            lease_bound,
            store_fallbacks,
            rule_labels: Mutex::new(HashSet::new()),
            rule_counters: RwLock::new(HashMap::default()),
            series_rules: Mutex::new(HashSet::new()),
        }
    }

    /// The label for a stats key built from request values (`detailed_metric`,
    /// `value_to_metric`, overrides), capped in length and in number.
    pub(crate) fn rule_label(&self, stats_key: &str) -> Arc<str> {
        let cut;
        let stats_key = if stats_key.len() > MAX_RULE_LABEL_BYTES {
            let mut end = MAX_RULE_LABEL_BYTES - 3;
            while !stats_key.is_char_boundary(end) {
                end -= 1;
            }
            cut = format!("{}...", &stats_key[..end]);
            cut.as_str()
        } else {
            stats_key
        };
        let mut labels = self
            .rule_labels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(existing) = labels.get(stats_key) {
            return existing.clone();
        }
        if labels.len() >= MAX_RULE_LABELS {
            return Arc::from("overflow");
        }
        let label: Arc<str> = Arc::from(stats_key);
        labels.insert(label.clone());
        label
    }

    /// The counters of rule label `rule` in `domain`, created on first use.
    pub(crate) fn rule_counters(&self, domain: &Arc<str>, rule: &Arc<str>) -> Arc<RuleCounters> {
        let id = (
            Arc::as_ptr(domain) as *const u8 as usize,
            Arc::as_ptr(rule) as *const u8 as usize,
        );
        if let Some((_, _, counters)) = self
            .rule_counters
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
        {
            return counters.clone();
        }
        let counters = Arc::new(RuleCounters {
            domain: domain.clone(),
            rule: rule.clone(),
            rule_hits: self.rule_hits.clone(),
            requests: self.requests.clone(),
            hits: Default::default(),
            decisions: Default::default(),
        });
        self.series_rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((domain.clone(), rule.clone()));
        let mut cache = self
            .rule_counters
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= MAX_CACHED_RULES {
            cache.clear();
        }
        cache.insert(id, (domain.clone(), rule.clone(), counters.clone()));
        counters
    }

    /// After a reload: drops every per-rule series (hits, decisions, fallbacks, leases)
    /// whose `rule` label no rule of the new set accounts for. A label is kept when
    /// `kept(label)` holds, or when it extends a kept one with `_value` or `.key`
    /// (labels made from request values under a rule). A dropped label in use again
    /// starts new series from zero, which Prometheus reads as a counter reset.
    pub(crate) fn forget_rules(&self, kept: &dyn Fn(&str) -> bool) {
        let accounted = |label: &str| {
            label == "overflow"
                || kept(label)
                || label
                    .char_indices()
                    .filter(|(_, c)| *c == '_' || *c == '.')
                    .any(|(at, _)| kept(&label[..at]))
        };
        let gone: Vec<(Arc<str>, Arc<str>)> = {
            let mut series = self
                .series_rules
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let gone = series
                .iter()
                .filter(|(_, rule)| !accounted(rule))
                .cloned()
                .collect();
            series.retain(|(_, rule)| accounted(rule));
            gone
        };
        if gone.is_empty() {
            return;
        }
        // Cached counters of a dropped label would count into detached series.
        self.rule_counters
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|_, (_, rule, _)| accounted(rule));
        self.rule_labels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|label| accounted(label));
        for (domain, rule) in gone {
            for stat in RuleStat::ALL {
                self.rule_hits.remove(&RuleStatLabels {
                    rule: rule.clone(),
                    stat: stat.as_str(),
                });
            }
            for decision in DECISIONS {
                self.requests.remove(&DecisionLabels {
                    domain: domain.clone(),
                    rule: rule.clone(),
                    decision,
                });
            }
            for mode in FAILURE_MODES {
                self.store_fallbacks.remove(&FallbackLabels {
                    rule: rule.clone(),
                    mode,
                });
            }
            let label = RuleLabel { rule };
            self.lease_outstanding.remove(&label);
            self.lease_bound.remove(&label);
        }
    }

    /// Counts one decision made by a local layer.
    pub(crate) fn local_decision(&self, layer: &'static str) {
        self.local_decisions
            .get_or_create(&LayerLabel { layer })
            .inc();
    }

    /// Records the duration of one store call.
    pub(crate) fn store_duration(&self, op: &'static str, elapsed: std::time::Duration) {
        self.store_durations
            .get_or_create(&OpLabel { op })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one failed store call.
    pub(crate) fn store_error(&self, kind: &'static str) {
        self.store_errors.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts one check answered by a failure mode.
    pub(crate) fn store_fallback(&self, rule: &Arc<str>, mode: &'static str) {
        let labels = FallbackLabels {
            rule: rule.clone(),
            mode,
        };
        self.store_fallbacks.get_or_create(&labels).inc();
    }

    /// Counts one failed call.
    pub(crate) fn call_error(&self, kind: &'static str) {
        self.call_errors.get_or_create(&KindLabel { kind }).inc();
    }

    /// Records a successful load of rules, made at `loaded_at`.
    pub(crate) fn rules_loaded(&self, loaded_at: SystemTime) {
        let at = loaded_at.duration_since(UNIX_EPOCH).unwrap_or_default();
        self.config_last_success.set(at.as_secs_f64());
        self.config_failing.set(0);
    }

    /// Records a failed load of new rule content.
    pub(crate) fn rules_failed(&self) {
        self.config_failing.set(1);
    }

    /// Counts the tasks of `runtimes` (besides those counted already) in
    /// `sluice_runtime_alive_tasks`.
    pub(crate) fn count_tasks_of(
        &self,
        runtimes: impl IntoIterator<Item = tokio::runtime::Handle>,
    ) {
        self.runtimes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(runtimes);
    }

    /// Moves the task gauge to the runtimes' counts now.
    fn refresh_tasks(&self) {
        let alive: usize = self
            .runtimes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|runtime| runtime.metrics().num_alive_tasks())
            .sum();
        self.runtime_alive_tasks
            .set(i64::try_from(alive).unwrap_or(i64::MAX));
    }

    /// Moves the process metrics to a fresh `/proc` reading.
    fn refresh_process(&self) {
        let Some(sample) = process::sample() else {
            return;
        };
        let _one_at_a_time = self
            .process_refresh
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.process_resident_memory.set(sample.resident_bytes);
        self.process_open_fds.set(sample.open_fds);
        self.process_max_fds.set(sample.max_fds);
        self.process_start_time.set(sample.start_time_seconds);
        let counted = self.process_cpu.get();
        if sample.cpu_seconds > counted {
            self.process_cpu.inc_by(sample.cpu_seconds - counted);
        }
    }

    /// Prometheus text exposition of every metric (the process and task metrics read at
    /// the call).
    pub fn encode(&self) -> String {
        self.refresh_process();
        self.refresh_tasks();
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Longest wait for the last traces at exit.
#[cfg(feature = "otel")]
const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps trace export running; dropping it flushes and stops the exporter.
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    /// The OTLP tracer provider, when exporting.
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider.take() {
            if let Err(error) = provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
                tracing::warn!(%error, "flushing traces failed");
            }
        }
    }
}

/// fred's `interfaces` module warns when a command reaches a client whose router task
/// has ended ("Fatal error sending QUIT command to router"): at shutdown, the QUIT
/// sent to each node's client can race the end of its runtime's tasks, which is
/// harmless. During service the caller gets that error too, and Sluice reports it
/// (failure mode, `sluice_store_errors_total`). So that module logs errors only,
/// unless `level` names fred itself.
fn quiet_client_router(
    filter: tracing_subscriber::EnvFilter,
    level: &str,
) -> tracing_subscriber::EnvFilter {
    if level.contains("fred") {
        return filter;
    }
    match "fred::interfaces=error".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// How spans travel to the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OtlpProtocol {
    /// OTLP/gRPC (port 4317 by convention).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318, path `/v1/traces`).
    Http,
}

/// Where and how traces are exported over OTLP (with the `otel` feature).
#[derive(Clone, Debug, PartialEq)]
pub struct TraceExport {
    /// The protocol.
    pub(crate) protocol: OtlpProtocol,
    /// The collector, with its scheme (`http://collector:4317`); over HTTP, the whole
    /// traces URL (`http://collector:4318/v1/traces`).
    pub(crate) endpoint: String,
    /// The `service.name` resource attribute.
    pub(crate) service_name: String,
    /// The `service.namespace` resource attribute, if any.
    pub(crate) service_namespace: Option<String>,
    /// The `service.instance.id` resource attribute, if any.
    pub(crate) service_instance_id: Option<String>,
    /// Fraction of traces kept (0 to 1), unless a sampled parent decides.
    pub(crate) sampling_ratio: f64,
}

/// Installs logging (and, with the `otel` feature and an export, OTLP trace export of
/// the `rls.request` and `store.check` spans). Must run inside the tokio runtime when
/// exporting: the tonic exporter's channel lives on it.
pub fn init(format: LogFormat, level: &str, export: Option<&TraceExport>) -> TelemetryGuard {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = quiet_client_router(
        tracing_subscriber::EnvFilter::try_new(level)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        level,
    );
    let fmt = match format {
        // Colours only on a terminal: log collectors get plain text.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer().json().boxed(),
    };
    let registry = tracing_subscriber::registry().with(fmt.with_filter(filter));
    #[cfg(feature = "otel")]
    {
        let (layer, provider) = match export.map(otel::layer) {
            Some(Ok((layer, provider))) => (Some(layer), Some(provider)),
            Some(Err(error)) => {
                eprintln!("OTLP trace export disabled: {error}");
                (None, None)
            }
            None => (None, None),
        };
        let _ = registry.with(layer).try_init();
        TelemetryGuard { provider }
    }
    #[cfg(not(feature = "otel"))]
    {
        let installed = registry.try_init().is_ok();
        if let Some(export) = export.filter(|_| installed) {
            tracing::warn!(
                endpoint = %export.endpoint,
                "trace export is asked for (--otlp-endpoint, or TRACING_ENABLED) but this build has no `otel` feature: traces are NOT exported"
            );
        }
        TelemetryGuard {}
    }
}

/// OTLP export over gRPC (tonic) or HTTP.
#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
    use tracing_subscriber::Layer;

    /// Spans exported: Sluice's request and store spans (debug level), whatever the
    /// log filter says.
    const EXPORT_FILTER: &str = "sluice=debug";

    /// A layer exporting spans as `export` says, and the provider to flush on exit.
    pub(super) fn layer<S>(
        export: &super::TraceExport,
    ) -> Result<(Box<dyn Layer<S> + Send + Sync>, SdkTracerProvider), String>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let exporter = match export.protocol {
            super::OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(&export.endpoint)
                .build(),
            super::OtlpProtocol::Http => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(&export.endpoint)
                .build(),
        }
        .map_err(|error| error.to_string())?;
        let optional = [
            ("service.namespace", &export.service_namespace),
            ("service.instance.id", &export.service_instance_id),
        ];
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(export.service_name.clone())
            .with_attributes(optional.into_iter().filter_map(|(key, value)| {
                value
                    .clone()
                    .map(|value| opentelemetry::KeyValue::new(key, value))
            }))
            .build();
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(export.sampling_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("sluice");
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(tracing_subscriber::EnvFilter::new(EXPORT_FILTER))
            .boxed();
        Ok((layer, provider))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fred_router_warnings_are_quiet_unless_fred_is_named() {
        let quiet = |level: &str| {
            quiet_client_router(tracing_subscriber::EnvFilter::new(level), level).to_string()
        };
        assert!(
            quiet("info").contains("fred::interfaces=error"),
            "{}",
            quiet("info")
        );
        assert!(!quiet("info,fred=debug").contains("fred::interfaces=error"));
    }
}
