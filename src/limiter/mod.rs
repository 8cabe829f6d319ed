//! The decision pipeline: turns matched descriptors into store checks, applies the
//! reference's request semantics (unlimited, `replaces`, hits addends, shadow rules) and
//! records per-rule statistics. It knows rules and stores, never the wire format.
//!
//! Hot-key layers (blocked-until cache, pre-check, leases) and store failure modes plug
//! in here, between the rules and the store call.

pub(crate) mod blocked;
pub(crate) mod delay;
pub(crate) mod explain;
pub(crate) mod fallback;
mod hotkeys;
pub(crate) mod lease;
mod matching;
pub(crate) mod meter;
pub(crate) mod precheck;
mod slots;
pub(crate) mod stats;
pub(crate) mod usage;
mod within;

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use crate::algorithm::{Decision, Micros, MICROS_PER_SECOND};
use crate::clock::Clock;
use crate::regions::Sharing;
use crate::rules::{
    stats_name, Entry, FailureMode, LeaseMode, LimitOverride, Matched, Rule, RuleRef, Rules, Scope,
};
use crate::store::{CounterKey, LimitCheck, Store, StoreCheck, StoreError};
use crate::telemetry::{Metrics, RuleCounters, RuleStat};
use blocked::BlockedCache;
use fallback::Fallback;
use hotkeys::{HotKeyLayer, Leased};
use lease::Leases;
use matching::Applies;
use precheck::Precheck;
use within::within;

use crate::ledger::{Ledger, UsageKey};

/// One descriptor of a request, borrowed from the wire message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// Entries in request order.
    pub entries: Vec<Entry<'a>>,
    /// Envoy's per-descriptor limit override.
    pub limit_override: Option<LimitOverride>,
    /// Descriptor-level hits addend; `Some(0)` checks without charging.
    pub hits_addend: Option<u64>,
    /// Envoy's `is_negative_hits`: the descriptor's hits are given back, not charged.
    pub refund: bool,
}

/// A request as the limiter sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckRequest<'a> {
    /// Rule domain.
    pub domain: &'a str,
    /// Descriptors in request order.
    pub descriptors: Vec<Descriptor<'a>>,
    /// Request-level hits addend; 0 means 1.
    pub hits_addend: u64,
}

/// The store check of a descriptor matched to `matched`: its counter key (domain,
/// entries or share patterns, and each limit's algorithm and window) and its limits.
/// The one place a key is made, so every layer and `explain` name the same counters.
pub fn store_check(
    domain: &str,
    entries: &[Entry<'_>],
    matched: &Matched<'_>,
    cost: u64,
) -> StoreCheck {
    let limits: Arc<[LimitCheck]> = matched
        .rule
        .limits
        .iter()
        .map(|limit| LimitCheck {
            algorithm: limit.algorithm,
            quota: limit.quota(),
            sharing: match limit.scope {
                Scope::Aggregate { weights } => Sharing::Aggregate(weights),
                Scope::Regional | Scope::Split { .. } => Sharing::Regional,
            },
        })
        .collect();
    // A concurrency limit's last entry names the request's slot: not its counters.
    let entries = match entries.split_last() {
        Some((_, counted)) if matched.rule.holds_slots() => counted,
        _ => entries,
    };
    let key = CounterKey::new(
        domain,
        entries,
        &matched.share_patterns[..entries.len().min(matched.share_patterns.len())],
        limits
            .iter()
            .map(|limit| (limit.algorithm, limit.quota.period)),
    );
    StoreCheck {
        key,
        limits,
        cost,
        refund: false,
        max_wait: 0,
    }
}

/// The caller's deadlines (from `grpc-timeout`; none without one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deadlines {
    /// Store calls are abandoned then (a share of the caller's time: the failure mode
    /// still answers in time).
    pub(crate) store: Option<Instant>,
    /// The caller gives up then: a delayed answer must be sent before.
    pub(crate) answer: Option<Instant>,
}

/// What applies to one descriptor.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict<'r> {
    /// No limit applies: unknown domain, no match, or replaced by another rule.
    NoLimit,
    /// The rule says `unlimited`.
    Unlimited,
    /// A limit was decided.
    Limited(Limited<'r>),
}

/// A decided descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct Limited<'r> {
    /// The rule that applied.
    pub(crate) rule: RuleRef<'r>,
    /// Which of the rule's limits describes the answer: the refusing one with the
    /// longest wait (the first of equals), else the one with the least remaining.
    pub(crate) limit_index: usize,
    /// That limit's decision.
    pub(crate) decision: Decision,
    /// Whether the answer is OVER_LIMIT (false for shadow rules, whatever the store said).
    pub over_limit: bool,
}

impl Limited<'_> {
    /// The wait this admission is answered after (`max_delay`), if it was delayed.
    pub(crate) fn waits(&self) -> Option<Micros> {
        (self.decision.allowed && self.decision.retry_after > 0)
            .then_some(self.decision.retry_after)
    }

    /// Turns a delayed admission whose wait would outlive the caller's deadline into a
    /// refusal (its reservation stays charged: a refusal never admits past the limit).
    pub(crate) fn refuse_late(&mut self) {
        self.decision.allowed = false;
        self.decision.remaining = 0;
        self.over_limit = !self.rule.shadow_mode;
    }
}

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    /// The store failed and a matched rule's failure mode is `error`.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A negative hit on a rule with a `ledger: true` limit: the ledger records admitted
    /// units only, so a refund there would be undone by the next restore.
    #[error(
        "is_negative_hits on rule {rule}, which has a ledger: true limit: refunds are not \
         recorded in the usage ledger, so they are refused there"
    )]
    RefundOnLedger {
        /// The rule's stats key.
        rule: String,
    },
}

/// Knobs of the reference's request semantics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimiterSettings {
    /// Near-limit threshold as a fraction of the limit (`NEAR_LIMIT_RATIO`, 0.8).
    pub near_limit_ratio: f32,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when one descriptor of a request would
    /// go over its limit, the request's other descriptors are not charged.
    pub stop_increment_when_over_limit: bool,
    /// Count blocked-cache refusals under the reference's `over_limit_with_local_cache`
    /// statistic (the reference has that cache only with `LOCAL_CACHE_SIZE_IN_BYTES`).
    pub report_local_cache: bool,
    /// Sluice instances sharing the store; the `local` failure mode enforces
    /// `limit / replicas`.
    pub replicas: u32,
}

impl Default for LimiterSettings {
    fn default() -> Self {
        Self {
            near_limit_ratio: 0.8,
            stop_increment_when_over_limit: false,
            report_local_cache: false,
            replicas: 1,
        }
    }
}

/// Decides requests against a store.
pub struct Limiter<S> {
    /// Where counters live.
    store: S,
    /// Request semantics.
    settings: LimiterSettings,
    /// Statistics sink.
    metrics: Arc<Metrics>,
    /// Keys the store refused, answered locally until they may pass.
    blocked: BlockedCache,
    /// The store's clock, for the blocked-until cache.
    clock: Arc<dyn Clock>,
    /// Answers checks by failure mode when the store cannot.
    fallback: Fallback,
    /// Hot keys this instance alone has used up, refused without a store call.
    precheck: Precheck,
    /// Whether the pre-check runs (by default only for stores shared with others).
    precheck_on: bool,
    /// Units this instance leased per hot key (only for stores that lease).
    leases: Leases,
    /// Where units admitted for `ledger: true` limits are recorded (never awaited).
    ledger: Option<Arc<Ledger>>,
    /// Answers held back by a delay (`max_delay`).
    delays: delay::Delays,
}

/// A descriptor waiting for its decision.
struct Pending<'r> {
    /// Index of the descriptor in the request.
    index: usize,
    /// The rule that matched.
    rule: RuleRef<'r>,
    /// Label under which its statistics are counted.
    stats_label: Arc<str>,
    /// Hits the request asks for (statistics count these even when not charged).
    hits: u64,
    /// The pre-check called the key hot before the store call: charge its answer.
    precheck_charge: bool,
    /// The request's slot, when the rule is a concurrency limit.
    slot: Option<slots::Slot>,
}

// === impl Limiter ===

impl<S: Store> Limiter<S> {
    /// A limiter over `store`, whose clock is `clock`.
    pub fn new(
        store: S,
        clock: Arc<dyn Clock>,
        settings: LimiterSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let leases = Leases::new(
            lease::DEFAULT_CAPACITY,
            settings.replicas,
            metrics
                .local_decisions
                .get_or_create(&crate::telemetry::LayerLabel { layer: "lease" })
                .clone(),
        );
        Self {
            settings,
            delays: delay::Delays::new(delay::MAX_PENDING, metrics.clone()),
            metrics,
            blocked: BlockedCache::new(blocked::DEFAULT_CAPACITY),
            fallback: Fallback::new(settings.replicas, clock.clone()),
            clock,
            precheck: Precheck::new(precheck::DEFAULT_CAPACITY),
            precheck_on: store.is_shared(),
            leases,
            store,
            ledger: None,
        }
    }

    /// Records the units the store admits for `ledger: true` limits in `ledger`.
    pub(crate) fn with_ledger(mut self, ledger: Option<Arc<Ledger>>) -> Self {
        self.ledger = ledger;
        self
    }

    /// The usage ledger, if one is configured.
    pub(crate) fn ledger(&self) -> Option<&Arc<Ledger>> {
        self.ledger.as_ref()
    }

    /// Turns the local pre-check on or off (it is on for shared stores). Tests turn it
    /// on over a memory store shared by several limiters.
    pub fn with_precheck(mut self, on: bool) -> Self {
        self.precheck_on = on;
        self
    }

    /// The store behind this limiter.
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    /// The answers held back by a delay.
    pub(crate) fn delays(&self) -> &delay::Delays {
        &self.delays
    }

    /// Decides every descriptor of `request` under `rules`; one verdict per descriptor,
    /// in request order.
    pub async fn check<'r>(
        &self,
        rules: &'r Rules,
        request: &CheckRequest<'_>,
    ) -> Result<Vec<Verdict<'r>>, LimiterError> {
        self.check_within(rules, request, Deadlines::default())
            .await
    }

    /// [`Limiter::check`], within the caller's `deadlines` (from `grpc-timeout`): store
    /// calls are abandoned at the store's, past which checks take their rule's failure
    /// mode; a delay (`max_delay`) ends before the answer's. Four steps: match every
    /// descriptor, answer what the local layers can, ask the store the rest, and turn
    /// its decisions into verdicts.
    pub(crate) async fn check_within<'r>(
        &self,
        rules: &'r Rules,
        request: &CheckRequest<'_>,
        deadlines: Deadlines,
    ) -> Result<Vec<Verdict<'r>>, LimiterError> {
        let deadline = deadlines.store;
        let mut verdicts = Vec::with_capacity(request.descriptors.len());
        // Room for the descriptors left is made at the first match (none: no allocation):
        // a grown vector would start at four, and both live across the store's round trip.
        let mut pending = Vec::new();
        let mut checks = Vec::new();
        let replaced = self.match_all(rules, request, &mut verdicts, &mut pending, &mut checks);
        if pending.iter().any(|item| item.rule.delays()) {
            self.allow_waits(&pending, &mut checks, deadlines.answer);
        }
        if let Some(item) = pending
            .iter()
            .zip(&checks)
            .find(|(item, check)| check.refund && item.rule.limits.iter().any(|l| l.ledger))
            .map(|(item, _)| item)
        {
            return Err(LimiterError::RefundOnLedger {
                rule: item.rule.stats_key.to_string(),
            });
        }
        let now = self.clock.now();
        let any_blocked = self
            .answer_locally(
                &replaced,
                &mut pending,
                &mut checks,
                &mut verdicts,
                now,
                deadline,
            )
            .await?;
        if checks.is_empty() {
            return Ok(verdicts);
        }
        if self.settings.stop_increment_when_over_limit {
            Box::pin(self.charge_only_if_none_over(&mut checks, any_blocked, deadline)).await?;
        }
        let (mut decisions, by_store) = self.ask_store(&pending, &checks, deadline).await?;
        if let Some(ledger) = &self.ledger {
            if pending.iter().any(|item| restorable(&item.rule)) {
                // Boxed: only ledger rules pay for this step's future.
                Box::pin(self.restore_from_ledger(
                    ledger,
                    request,
                    (&pending, &checks),
                    &mut decisions,
                    by_store.as_deref(),
                    now,
                    deadline,
                ))
                .await;
            }
        }
        self.store_verdicts(
            request,
            pending,
            &checks,
            &decisions,
            by_store.as_deref(),
            now,
            &mut verdicts,
        );
        Ok(verdicts)
    }

    /// Step 1b, for rules that delay: how long each of their charges may wait
    /// (`max_delay`, within the caller's deadline `answer_by` and the bound on answers
    /// waiting at once).
    fn allow_waits(
        &self,
        pending: &[Pending<'_>],
        checks: &mut [StoreCheck],
        answer_by: Option<Instant>,
    ) {
        let budget = self.delays.budget(answer_by);
        for (item, check) in pending.iter().zip(checks) {
            let max_delay = item.rule.limits.first().map_or(0, |limit| limit.max_delay);
            if !check.refund && check.cost > 0 && max_delay > 0 {
                // At least 1 µs: a rule that delays is always decided as one, so that a
                // sliding log refuses an admission dated behind a reservation it could
                // not wait for (`decide_delayed`).
                check.max_wait = max_delay.min(budget).max(1);
            }
        }
    }

    /// Step 1: matches every descriptor ([`matching::match_descriptor`]). A limited one
    /// becomes a pending check (in `pending` and `checks`, in step); the others get their
    /// verdict now. Returns the names the matched rules replace.
    fn match_all<'r>(
        &self,
        rules: &'r Rules,
        request: &CheckRequest<'_>,
        verdicts: &mut Vec<Verdict<'r>>,
        pending: &mut Vec<Pending<'r>>,
        checks: &mut Vec<StoreCheck>,
    ) -> HashSet<&'r str> {
        let mut replaced = HashSet::new();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            verdicts.push(Verdict::NoLimit);
            let (matched, check, hits) =
                match matching::match_descriptor(rules, request, descriptor, &mut replaced) {
                    Applies::UnknownDomain => {
                        self.metrics.domain_not_found.inc();
                        continue;
                    }
                    Applies::NoMatch => continue,
                    Applies::Unlimited(_) => {
                        verdicts[index] = Verdict::Unlimited;
                        continue;
                    }
                    Applies::Limited {
                        matched,
                        check,
                        hits,
                    } => (matched, check, hits),
                };
            let stats_label = match &matched.stats_key {
                Cow::Borrowed(key) if *key == &*matched.rule.stats_key => {
                    matched.rule.stats_label.clone()
                }
                key => self.metrics.rule_label(&stats_name(key)),
            };
            if checks.capacity() == 0 {
                let left = request.descriptors.len() - index;
                checks.reserve_exact(left);
                pending.reserve_exact(left);
            }
            checks.push(check);
            let slot = slots::slot_of(&matched.rule, &descriptor.entries);
            pending.push(Pending {
                index,
                rule: matched.rule,
                stats_label,
                hits,
                precheck_charge: false,
                slot,
            });
        }
        replaced
    }

    /// Step 2: takes out of `pending` (and `checks`) what needs no store call: a rule
    /// another replaces, a key the store refused recently (blocked-until cache), a
    /// leased unit, a pre-check refusal. Whether any was refused locally.
    async fn answer_locally<'r>(
        &self,
        replaced: &HashSet<&'r str>,
        pending: &mut Vec<Pending<'r>>,
        checks: &mut Vec<StoreCheck>,
        verdicts: &mut [Verdict<'r>],
        now: Micros,
        deadline: Option<Instant>,
    ) -> Result<bool, LimiterError> {
        let mut any_blocked = false;
        // Filtered in place (order kept), so no second pair of vectors is allocated.
        let mut position = 0;
        while position < pending.len() {
            let item: &mut Pending<'r> = &mut pending[position];
            let check = &checks[position];
            let is_replaced = matching::is_replaced(&item.rule, replaced);
            if let (Some(slot), false) = (item.slot, is_replaced) {
                let item = pending.remove(position);
                let check = checks.remove(position);
                let (index, verdict) =
                    Box::pin(self.held(item, &check, slot, now, deadline)).await?;
                verdicts[index] = verdict;
                continue;
            }
            // A refund always reaches the store (no local layer gives hits back), and so
            // does a charge that counts even when refused (`on_over_limit: charge`), and
            // a check that may be delayed (the store reserves the wait).
            let store_only = check.refund || item.rule.answered_by_store_only();
            if (store_only || must_reach_store(check)) && !is_replaced {
                position += 1;
                continue;
            }
            let blocked = if is_replaced || !self.uses_blocked_cache(&item.rule) {
                None
            } else {
                self.blocked.get(check.key, &check.limits, check.cost, now)
            };
            // Then the hot-key layers of shared stores: a lease, else the pre-check.
            let local = if is_replaced || blocked.is_some() {
                None
            } else {
                self.hot_key_layer(item, check, now)
            };
            if !is_replaced && blocked.is_none() && local.is_none() {
                position += 1;
                continue;
            }
            let item = pending.remove(position);
            let check = checks.remove(position);
            if let Some(blocked) = blocked {
                if self.precheck_on && !item.rule.shadow_mode {
                    self.precheck.count(check.key, now);
                }
                let index = item.index;
                any_blocked = true;
                let decision = blocked.decision_at(now);
                verdicts[index] =
                    self.local_verdict(item, "blocked_cache", blocked.limit_index, decision);
                continue;
            }
            match local {
                Some(HotKeyLayer::Lease { units, ttl }) => {
                    // Boxed, as the other rare paths below: held inline, the largest
                    // of them set the size of every request's future (1 680 bytes,
                    // allocated and copied per request, past the allocator's cache).
                    match Box::pin(self.leased(item, &check, units, ttl, deadline)).await {
                        Leased::Answered(index, verdict) => verdicts[index] = verdict,
                        Leased::Unleased(item) => {
                            // The store does not lease: back in line for it.
                            pending.insert(position, item);
                            checks.insert(position, check);
                            position += 1;
                        }
                        Leased::Failed(error) => return Err(error),
                    }
                }
                Some(HotKeyLayer::Refused {
                    limit_index,
                    decision,
                }) => {
                    let index = item.index;
                    any_blocked = true;
                    verdicts[index] = self.local_verdict(item, "precheck", limit_index, decision);
                }
                None => {}
            }
        }
        Ok(any_blocked)
    }

    /// Step 3: asks the store to decide `checks` (one decision per limit, in order). Where
    /// it fails for all of them, or (a cluster shard down) for some, their rules' failure
    /// modes answer instead: then which checks the store decided.
    async fn ask_store(
        &self,
        pending: &[Pending<'_>],
        checks: &[StoreCheck],
        deadline: Option<Instant>,
    ) -> Result<(Vec<Decision>, Option<Vec<bool>>), LimiterError> {
        let expected = checks.iter().map(|c| c.limits.len()).sum();
        let mut decisions = Vec::with_capacity(expected);
        let span = tracing::debug_span!(
            "store.check",
            store = self.store.kind(),
            checks = checks.len()
        );
        let answered = match within(
            deadline,
            &self.metrics,
            self.store.check(checks, &mut decisions).instrument(span),
        )
        .await
        {
            Ok(()) if decisions.len() != expected => Err(StoreError::Protocol(format!(
                "store answered {} decisions for {expected} limits",
                decisions.len()
            ))),
            other => other,
        };
        let mut by_store: Option<Vec<bool>> = None;
        if let Err(error) = answered {
            let (error, failed) = match error {
                StoreError::Partly { failed, error } if decisions.len() == expected => {
                    (*error, Some(failed))
                }
                error => {
                    decisions.clear();
                    decisions.resize(expected, Decision::default());
                    (error, None)
                }
            };
            let decided = Box::pin(self.answer_failed(
                pending,
                checks,
                failed.as_deref(),
                error,
                &mut decisions,
            ))
            .await?;
            by_store = Some(decided);
        }
        Ok((decisions, by_store))
    }

    /// Step 3b, for ledger rules only: where the store's counter is below what the
    /// ledger knows was admitted (Redis restarted empty, flushed, or failed over to a
    /// lagging replica), raise it to that bound before answering, and decide the request
    /// from the raised count. One restore at a time, each after a fresh look at the
    /// counter, so a loss is never restored twice. A store that fails here leaves the
    /// store's first answer.
    #[allow(clippy::too_many_arguments)] // one call site, each argument a step's output
    async fn restore_from_ledger(
        &self,
        ledger: &Ledger,
        request: &CheckRequest<'_>,
        (pending, checks): (&[Pending<'_>], &[StoreCheck]),
        decisions: &mut [Decision],
        by_store: Option<&[bool]>,
        now: Micros,
        deadline: Option<Instant>,
    ) {
        let mut offset = 0;
        for (position, (item, check)) in pending.iter().zip(checks).enumerate() {
            let at = offset;
            offset += check.limits.len();
            let by_the_store = by_store.is_none_or(|by_store| by_store[position]);
            if !restorable(&item.rule) || check.cost == 0 || check.refund || !by_the_store {
                continue;
            }
            let limit = &item.rule.limits[0];
            let decision = decisions[at];
            let descriptor = descriptor_text(&request.descriptors[item.index].entries);
            let key = usage_key(&item.rule, limit, descriptor, &decision, now);
            // Half of the time left at most: the restore's store calls need the rest.
            let read_until = deadline.map(|deadline| {
                let now = Instant::now();
                now + deadline.saturating_duration_since(now) / 2
            });
            let needed = ledger.admitted_before(&key, read_until).await + check.cost;
            if decision.used >= needed {
                continue;
            }
            // One restore at a time; a request that cannot wait for another's is decided
            // from the bound all the same (the other raises the counter).
            if let Some(_one_at_a_time) = ledger.restoring(deadline).await {
                self.raise_to(ledger, &key, check, needed, deadline).await;
            }
            let limit_units = limit.quota().limit;
            let allowed = needed <= limit_units;
            decisions[at] = Decision {
                allowed,
                remaining: if allowed { limit_units - needed } else { 0 },
                reset_after: decision.reset_after,
                retry_after: if allowed { 0 } else { decision.reset_after },
                used: needed,
            };
        }
    }

    /// Raises the counter of `check` to `needed` after a fresh look (another request
    /// may have raised it meanwhile); called under the ledger's restore lock.
    async fn raise_to(
        &self,
        ledger: &Ledger,
        key: &UsageKey,
        check: &StoreCheck,
        needed: u64,
        deadline: Option<Instant>,
    ) {
        let probe = StoreCheck {
            key: check.key,
            limits: check.limits.clone(),
            cost: 0,
            refund: false,
            max_wait: 0,
        };
        let mut seen = Vec::new();
        let looked = within(deadline, &self.metrics, self.store.peek(&probe, &mut seen));
        if looked.await.is_err() {
            return;
        }
        let current = seen.first().map_or(0, |d| d.used);
        if current >= needed {
            return;
        }
        let raise = StoreCheck {
            cost: needed - current,
            ..probe
        };
        let mut raised = Vec::new();
        let call = self.store.check(std::slice::from_ref(&raise), &mut raised);
        if within(deadline, &self.metrics, call).await.is_ok() {
            ledger.restored(key, needed - current);
        }
    }

    /// Step 4: the verdict of each pending check from its decisions (`by_store`: which
    /// checks the store decided, where it failed for some).
    #[allow(clippy::too_many_arguments)] // one call site, each argument a step's output
    fn store_verdicts<'r>(
        &self,
        request: &CheckRequest<'_>,
        pending: Vec<Pending<'r>>,
        checks: &[StoreCheck],
        decisions: &[Decision],
        by_store: Option<&[bool]>,
        now: Micros,
        verdicts: &mut [Verdict<'r>],
    ) {
        let mut offset = 0;
        for (position, (item, check)) in pending.into_iter().zip(checks).enumerate() {
            let limit_decisions = &decisions[offset..offset + check.limits.len()];
            offset += check.limits.len();
            let index = item.index;
            let decided_by = match by_store {
                Some(by_store) if !by_store[position] => DecidedBy::FailureMode,
                _ => DecidedBy::Store,
            };
            // Units the failure mode admits are recorded too: they were served, and
            // the restore then charges them to the store once it answers again.
            match &self.ledger {
                Some(ledger) => {
                    let entries = &request.descriptors[index].entries;
                    let usage = Usage {
                        rule: &item.rule,
                        entries,
                        check,
                        decided_by,
                    };
                    record_usage(ledger, &usage, limit_decisions, now);
                }
                None => warn_no_ledger(&item.rule),
            }
            verdicts[index] = self.verdict(item, check, limit_decisions, now, decided_by);
        }
    }

    /// Puts the failure modes' answers in place of the decisions of the checks the
    /// store failed: those listed in `failed`, or all of them (`None`). Fails the call
    /// when one of them is in the `error` mode. Which checks the store decided.
    async fn answer_failed(
        &self,
        pending: &[Pending<'_>],
        checks: &[StoreCheck],
        failed: Option<&[usize]>,
        error: StoreError,
        decisions: &mut [Decision],
    ) -> Result<Vec<bool>, LimiterError> {
        let mut by_store = vec![true; checks.len()];
        let mut answer = Vec::new();
        let mut offset = 0;
        for (position, (item, check)) in pending.iter().zip(checks).enumerate() {
            let n = check.limits.len();
            if failed.is_none_or(|failed| failed.binary_search(&position).is_ok()) {
                let mode = Fallback::mode(&item.rule);
                self.metrics
                    .store_fallback(&item.stats_label, fallback::mode_name(mode));
                if mode == FailureMode::Error {
                    return Err(LimiterError::Store(error));
                }
                answer.clear();
                self.fallback.decide(mode, check, &mut answer).await;
                for (slot, decided) in decisions[offset..offset + n].iter_mut().zip(&answer) {
                    *slot = *decided;
                }
                by_store[position] = false;
            }
            offset += n;
        }
        Ok(by_store)
    }

    /// The reference's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: if any descriptor would
    /// go over (or `already_over`: one was refused locally), the others are decided
    /// without being charged.
    async fn charge_only_if_none_over(
        &self,
        checks: &mut [StoreCheck],
        already_over: bool,
        deadline: Option<Instant>,
    ) -> Result<(), LimiterError> {
        let mut over = Vec::with_capacity(checks.len());
        let mut decisions = Vec::new();
        for check in checks.iter() {
            // A refund is never over, and is given back whatever the others do.
            if check.refund {
                over.push(false);
                continue;
            }
            decisions.clear();
            within(
                deadline,
                &self.metrics,
                self.store.peek(check, &mut decisions),
            )
            .await?;
            over.push(decisions.iter().any(|d| !d.allowed));
        }
        if already_over || over.contains(&true) {
            for (check, over) in checks.iter_mut().zip(over) {
                // Refunds and charges that always count (`on_over_limit: charge`) keep
                // their cost.
                if !over && !check.refund && !must_reach_store(check) {
                    check.cost = 0;
                }
            }
        }
        Ok(())
    }

    /// Whether `rule` is answered by the blocked-until cache. Never for shadow rules
    /// (DESIGN §6: their refusals reach the store and the shadow report), except in the
    /// reference's compatibility mode (`LOCAL_CACHE_SIZE_IN_BYTES`), whose local cache
    /// counts their refusals under `over_limit_with_local_cache`.
    fn uses_blocked_cache(&self, rule: &Rule) -> bool {
        (!rule.shadow_mode || self.settings.report_local_cache) && !rule.answered_by_store_only()
    }

    /// Builds one descriptor's verdict from its decisions and records statistics. The
    /// store's decisions also feed the pre-check and the blocked-until cache; a failure
    /// mode's never do (the store did not count them, and may be back at once).
    fn verdict<'r>(
        &self,
        item: Pending<'r>,
        check: &StoreCheck,
        decisions: &[Decision],
        now: Micros,
        decided_by: DecidedBy,
    ) -> Verdict<'r> {
        let limit_index = longest_refusal(decisions)
            .or_else(|| {
                decisions
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, d)| d.remaining)
                    .map(|(index, _)| index)
            })
            .unwrap_or(0);
        let Some(decision) = decisions.get(limit_index).copied() else {
            return Verdict::NoLimit;
        };
        if check.refund {
            return self.refunded(item, check, limit_index, decision, decided_by);
        }
        if decided_by == DecidedBy::Store {
            if item.precheck_charge {
                self.precheck
                    .charge(check.key, &check.limits, check.cost, now, decisions);
            }
            if !decision.allowed && self.uses_blocked_cache(&item.rule) {
                self.blocked.insert(
                    check,
                    now,
                    limit_index,
                    &decision,
                    longest_block(&item.rule),
                );
            }
        }
        let limit = check.limits.get(limit_index).map_or(0, |l| l.quota.limit);
        self.record(item, limit_index, decision, limit)
    }

    /// The verdict of a refund: OK with the state it left. What the local layers hold
    /// of the key (a refusal, this instance's own count) is older than the hits it gave
    /// back: forgotten, so that they never refuse what the store would now admit.
    fn refunded<'r>(
        &self,
        item: Pending<'r>,
        check: &StoreCheck,
        limit_index: usize,
        decision: Decision,
        decided_by: DecidedBy,
    ) -> Verdict<'r> {
        if decided_by == DecidedBy::Store {
            self.blocked.forget(check.key, &check.limits);
            if self.precheck_on {
                self.precheck.forget(check.key, &check.limits);
            }
        }
        let counters = self
            .metrics
            .rule_counters(&item.rule.domain, &item.stats_label);
        counters.add(RuleStat::RefundedHits, check.cost);
        counters.decision("refund");
        Verdict::Limited(Limited {
            rule: item.rule,
            limit_index,
            decision,
            over_limit: false,
        })
    }

    /// Records a decided descriptor's statistics and builds its verdict.
    fn record<'r>(
        &self,
        item: Pending<'r>,
        limit_index: usize,
        decision: Decision,
        limit: u64,
    ) -> Verdict<'r> {
        let split = stats::split_hits(&decision, limit, item.hits, self.settings.near_limit_ratio);
        let counters = self
            .metrics
            .rule_counters(&item.rule.domain, &item.stats_label);
        counters.add(RuleStat::TotalHits, item.hits);
        counters.add(RuleStat::WithinLimit, split.within_limit);
        counters.add(RuleStat::NearLimit, split.near_limit);
        counters.add(RuleStat::OverLimit, split.over_limit);
        self.finish(
            item,
            &counters,
            limit_index,
            decision,
            split.near_limit > 0,
            split.over_limit,
        )
    }

    /// A refusal answered by a local layer (`blocked_cache`, `precheck`).
    fn local_verdict<'r>(
        &self,
        item: Pending<'r>,
        layer: &'static str,
        limit_index: usize,
        decision: Decision,
    ) -> Verdict<'r> {
        self.metrics.local_decision(layer);
        let counters = self
            .metrics
            .rule_counters(&item.rule.domain, &item.stats_label);
        counters.add(RuleStat::TotalHits, item.hits);
        counters.add(RuleStat::OverLimit, item.hits);
        if self.settings.report_local_cache {
            counters.add(RuleStat::OverLimitWithLocalCache, item.hits);
        }
        let hits = item.hits;
        self.finish(item, &counters, limit_index, decision, false, hits)
    }

    /// Shadow handling and the per-rule decision count, common to every verdict. A shadow
    /// rule's `shadow_mode` statistic counts the hits over the limit (`over_hits`), as
    /// the reference's does: a request that crosses the limit counts only its hits past
    /// it.
    fn finish<'r>(
        &self,
        item: Pending<'r>,
        counters: &RuleCounters,
        limit_index: usize,
        decision: Decision,
        near: bool,
        over_hits: u64,
    ) -> Verdict<'r> {
        let shadow = item.rule.shadow_mode;
        let outcome = match (decision.allowed, shadow) {
            (false, true) => {
                counters.add(RuleStat::ShadowMode, over_hits);
                "shadow_over_limit"
            }
            (false, false) => "over_limit",
            (true, _) if near => "near_limit",
            (true, _) => "ok",
        };
        counters.decision(outcome);
        Verdict::Limited(Limited {
            rule: item.rule,
            limit_index,
            decision,
            over_limit: !decision.allowed && !shadow,
        })
    }
}

/// How long a refusal of `rule` may stand in the blocked-until cache: until the store's
/// `retry_after`, except for a leased rule, whose units other instances hold come back
/// at most a lease's life and one return round after they stop being used (its stated
/// early-refusal bound): then the store is asked again.
fn longest_block(rule: &Rule) -> Micros {
    match rule.limits.as_slice() {
        [limit] if limit.lease.mode != LeaseMode::Off => {
            let rounds = u64::try_from(lease::RETURN_INTERVAL.as_micros()).unwrap_or(u64::MAX);
            limit.lease.ttl.saturating_add(rounds)
        }
        _ => Micros::MAX,
    }
}

/// Whether `check` charges a limit whose every charge counts (`on_over_limit: charge`):
/// a local refusal would lose the charge, so it goes to the store.
fn must_reach_store(check: &StoreCheck) -> bool {
    check.cost > 0
        && check
            .limits
            .iter()
            .any(|limit| limit.quota.charges_always())
}

/// Who decided a check: only the store's answers feed the local layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DecidedBy {
    /// The shared store.
    Store,
    /// The rule's failure mode, because the store did not answer.
    FailureMode,
}

/// Of a descriptor's limits, the refusing one with the longest `retry_after` (the first
/// of equals): the request passes no sooner, so its answer describes that limit.
fn longest_refusal(decisions: &[Decision]) -> Option<usize> {
    let refusals = decisions.iter().copied().enumerate();
    longest_wait(refusals.filter(|(_, decision)| !decision.allowed)).map(|(index, _)| index)
}

/// Of `refusals` (a limit's index and its refusal), the one with the longest
/// `retry_after`, the first of equals: the store's verdict and the pre-check choose
/// alike.
fn longest_wait(refusals: impl Iterator<Item = (usize, Decision)>) -> Option<(usize, Decision)> {
    refusals.fold(None, |longest, (index, decision)| match longest {
        Some((_, kept)) if decision.retry_after <= kept.retry_after => longest,
        _ => Some((index, decision)),
    })
}

/// Whole seconds until `micros` have passed, rounded up (the reference's
/// `duration_until_reset` granularity).
pub(crate) fn ceil_seconds(micros: u64) -> u64 {
    micros.div_ceil(MICROS_PER_SECOND)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_regions;

/// Says once per process that `ledger: true` limits are served without a ledger
/// (`serve` without `--ledger-url`): their usage is enforced but not recorded.
fn warn_no_ledger(rule: &Rule) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if rule.limits.iter().any(|limit| limit.ledger)
        && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        tracing::error!(
            rule = %rule.stats_key,
            "a ledger: true limit is served without --ledger-url: its usage is not recorded"
        );
    }
}

/// A check whose admitted units a ledger may record.
struct Usage<'a> {
    rule: &'a Rule,
    entries: &'a [Entry<'a>],
    check: &'a StoreCheck,
    decided_by: DecidedBy,
}

/// Records in `ledger` the units admitted for the `ledger: true` limits of the usage's
/// rule (nothing when a limit refused: a refused request was not served). A failure
/// mode's decision carries no store window: its units go to the window `now` is in.
fn record_usage(ledger: &Ledger, usage: &Usage<'_>, decisions: &[Decision], now: Micros) {
    let Usage {
        rule,
        entries,
        check,
        decided_by,
    } = usage;
    // A refund is not written: the ledger's rows are positive (schema version 1).
    if check.cost == 0 || check.refund || !rule.limits.iter().any(|limit| limit.ledger) {
        return;
    }
    if !decisions.iter().all(|decision| decision.allowed) {
        return;
    }
    let descriptor = descriptor_text(entries);
    for (limit, decision) in rule.limits.iter().zip(decisions) {
        if limit.ledger {
            let mut decision = *decision;
            if *decided_by == DecidedBy::FailureMode {
                let period = limit.unit.micros();
                decision.reset_after = period - now % period;
            }
            ledger.record(
                usage_key(rule, limit, descriptor.clone(), &decision, now),
                check.cost,
            );
        }
    }
}

/// Whether a restore from the ledger applies to `rule`: one limit, with a ledger (a
/// rule's limits share one counter key, so one of several cannot be raised alone).
fn restorable(rule: &Rule) -> bool {
    matches!(&rule.limits[..], [limit] if limit.ledger)
}

/// `key=value,key2=value2`, in request order.
fn descriptor_text(entries: &[Entry<'_>]) -> Box<str> {
    let mut descriptor = String::new();
    for (at, entry) in entries.iter().enumerate() {
        if at > 0 {
            descriptor.push(',');
        }
        descriptor.push_str(entry.key);
        descriptor.push('=');
        descriptor.push_str(entry.value);
    }
    descriptor.into()
}

/// The ledger key of `limit` of `rule` for `descriptor`: the window is the one whose
/// end the store reported (`now + reset_after`, on a window boundary: rounding absorbs
/// a skew between this clock and the store's of less than half a window).
fn usage_key(
    rule: &Rule,
    limit: &crate::rules::Limit,
    descriptor: Box<str>,
    decision: &Decision,
    now: Micros,
) -> UsageKey {
    let period = limit.unit.micros();
    let end = (now + decision.reset_after + period / 2) / period * period;
    let window_start = end.saturating_sub(period) / MICROS_PER_SECOND;
    let name = format!(
        "{}:{}",
        rule.stats_key,
        limit.unit.as_upper_str().to_lowercase()
    );
    UsageKey {
        domain: rule.domain.clone(),
        descriptor,
        limit: Arc::from(name),
        window_start,
        window_seconds: limit.unit.seconds(),
    }
}
