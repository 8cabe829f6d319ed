//! The limits of one descriptor: the reference's `rate_limit` checks, and Sluice's
//! extensions (`algorithm`, `burst`, `failure_mode`, `rate_limits`, `scope`).

use std::sync::Arc;

use super::schema::{RawDescriptor, RawRateLimit};
use super::{ConfigError, FailureMode, Lease, LeaseMode, Limit, Scope, Unit};
use crate::algorithm::{AlgorithmKind, Micros, OnOverLimit, MICROS_PER_SECOND};
use crate::regions::{RegionError, RegionPlan, RegionWeights, MAX_REGIONS};

/// Shortest and longest `lease_ttl`.
const LEASE_TTL_RANGE: (u64, u64) = (1_000, 60_000_000);

/// Highest `requests_per_unit` of a `sliding_log` limit: the log keeps every admission
/// instant in the window, and a check reads and decides over the whole log, so both its
/// memory and its cost grow with the limit. In Redis a check costs ~0.24 µs per logged
/// instant: 2.4 ms at 10 000 (the cap before), enough for one hot key to hold its node
/// past the call deadline; ~0.25 ms at 1 000. Larger limits want `sliding_window`.
pub(crate) const MAX_SLIDING_LOG_LIMIT: u32 = 1_000;

/// Most slots a concurrency limit holds (`max_in_flight`): each is kept per key (16
/// bytes in memory, one sorted set member in Redis) and read by every call.
pub(crate) const MAX_IN_FLIGHT: u32 = 10_000;

/// `max_hold` when none is given: well above Envoy's default route timeout (15 s), so a
/// request is not reclaimed while it runs, and a lost release costs a minute at most.
pub(crate) const DEFAULT_MAX_HOLD: Micros = 60 * MICROS_PER_SECOND;

/// Shortest and longest `max_hold`.
const MAX_HOLD_RANGE: (Micros, Micros) = (MICROS_PER_SECOND, 86_400 * MICROS_PER_SECOND);

/// Shortest and longest `max_delay`: a delayed answer holds the call open that long.
const MAX_DELAY_RANGE: (Micros, Micros) = (1_000, 60 * MICROS_PER_SECOND);

/// Lowest and highest weight of a region in `weights`.
const WEIGHT_RANGE: (i64, i64) = (1, 1_000);

/// What a descriptor's `rate_limit`/`rate_limits` compile to.
pub(crate) struct RuleLimits {
    pub(crate) name: Option<Arc<str>>,
    pub(crate) limits: Vec<Limit>,
    pub(crate) unlimited: bool,
    pub(crate) replaces: Vec<Arc<str>>,
}

/// Compiles the limits of descriptor `raw` at YAML `path` for an instance of `regions`
/// (none: one region, the whole world); `None` when it has none or they are invalid (the
/// errors are pushed to `errors`).
pub(crate) fn rule_limits(
    file: &str,
    path: &str,
    raw: &RawDescriptor,
    regions: Option<&RegionPlan>,
    errors: &mut Vec<ConfigError>,
) -> Option<RuleLimits> {
    let before = errors.len();
    let out = match (&raw.rate_limit, &raw.rate_limits) {
        (None, None) => {
            if raw.slot == Some(true) {
                errors.push(ConfigError::sluice(
                    file,
                    &format!("{path}.slot"),
                    "slot: true needs a rate_limit with algorithm: concurrency on the same \
                     descriptor",
                ));
            }
            return None;
        }
        (Some(_), Some(_)) => {
            errors.push(ConfigError::sluice(
                file,
                path,
                "rate_limit and rate_limits cannot both be given",
            ));
            return None;
        }
        (Some(one), None) => single(file, &format!("{path}.rate_limit"), one, regions, errors),
        (None, Some(list)) => several(file, &format!("{path}.rate_limits"), list, regions, errors),
    };
    slot_fits(file, path, raw, &out, errors);
    let delayed = out.limits.iter().any(|limit| limit.max_delay > 0);
    if delayed && raw.shadow_mode == Some(true) {
        errors.push(ConfigError::sluice(
            file,
            &format!("{path}.shadow_mode"),
            "shadow_mode cannot be combined with max_delay: a shadow rule never changes an \
             answer, and a delay would hold it",
        ));
    }
    (errors.len() == before).then_some(out)
}

/// A concurrency limit needs `slot: true` on its descriptor (the entry whose value
/// names each request's slot), and `slot: true` needs a concurrency limit.
fn slot_fits(
    file: &str,
    path: &str,
    raw: &RawDescriptor,
    out: &RuleLimits,
    errors: &mut Vec<ConfigError>,
) {
    let concurrency = out
        .limits
        .iter()
        .any(|limit| limit.algorithm == AlgorithmKind::Concurrency);
    let slot = raw.slot == Some(true);
    let slot_path = format!("{path}.slot");
    if concurrency && !slot {
        errors.push(ConfigError::sluice(
            file,
            &slot_path,
            "algorithm: concurrency needs slot: true on its descriptor: the entry whose \
             value names each request's slot (e.g. the x-request-id), so that a release \
             frees only the slot its own request holds",
        ));
    }
    if !slot {
        return;
    }
    if !concurrency && !out.limits.is_empty() {
        errors.push(ConfigError::sluice(
            file,
            &slot_path,
            "slot: true needs algorithm: concurrency (a rate limit counts requests, not \
             slots)",
        ));
    }
    if raw.value.as_deref().is_some_and(|value| !value.is_empty()) {
        errors.push(ConfigError::sluice(
            file,
            &format!("{path}.value"),
            "a slot descriptor takes no value: each request names its own slot",
        ));
    }
    refuse_given(
        file,
        path,
        &[
            (raw.detailed_metric == Some(true), "detailed_metric"),
            (raw.value_to_metric == Some(true), "value_to_metric"),
        ],
        |field| {
            format!("{field} cannot be used with slot: true: every request's slot name would become a metric name")
        },
        errors,
    );
}

/// The reference's `rate_limit`, plus the extension fields.
fn single(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    regions: Option<&RegionPlan>,
    errors: &mut Vec<ConfigError>,
) -> RuleLimits {
    if raw.algorithm.as_deref() == Some(AlgorithmKind::Concurrency.as_str()) {
        return concurrency(file, path, raw, regions, errors);
    }
    let unlimited = raw.unlimited.unwrap_or(false);
    let name = raw.name.as_deref().unwrap_or_default();
    let unit_name = raw.unit.as_deref().unwrap_or_default();
    let unit = Unit::parse(unit_name);
    if unlimited && unit.is_some() {
        errors.push(ConfigError::reference(
            file,
            "should not specify rate limit unit when unlimited",
        ));
    } else if !unlimited && unit.is_none() {
        errors.push(ConfigError::reference(
            file,
            format!("invalid rate limit unit '{unit_name}'"),
        ));
    }
    if unlimited {
        refuse_given(
            file,
            path,
            &[
                (raw.scope.is_some(), "scope"),
                (raw.sharing.is_some(), "sharing"),
                (raw.weights.is_some(), "weights"),
            ],
            |field| format!("{field} does not apply to unlimited: nothing is counted"),
            errors,
        );
    }
    let replaces = replaces(file, name, raw, errors);
    let limit = unit.and_then(|unit| limit(file, path, raw, unit, regions, errors));
    RuleLimits {
        name: (!name.is_empty()).then(|| name.into()),
        limits: if unlimited {
            Vec::new()
        } else {
            limit.into_iter().collect()
        },
        unlimited,
        replaces,
    }
}

/// Sluice's `rate_limits`: several limits checked all-or-nothing.
fn several(
    file: &str,
    path: &str,
    list: &[RawRateLimit],
    regions: Option<&RegionPlan>,
    errors: &mut Vec<ConfigError>,
) -> RuleLimits {
    if list.is_empty() {
        errors.push(ConfigError::sluice(
            file,
            path,
            "rate_limits must list at least one limit",
        ));
    }
    let mut name: Option<&str> = None;
    let mut limits = Vec::with_capacity(list.len());
    let mut all_replaces = Vec::new();
    for (i, raw) in list.iter().enumerate() {
        let path = format!("{path}[{i}]");
        if raw.unlimited.unwrap_or(false) {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.unlimited"),
                "unlimited cannot be used inside rate_limits; use rate_limit",
            ));
            continue;
        }
        let this_name = raw.name.as_deref().unwrap_or_default();
        if !this_name.is_empty() {
            match name {
                Some(other) if other != this_name => errors.push(ConfigError::sluice(
                    file,
                    &format!("{path}.name"),
                    format!("all limits of one descriptor share one name, found '{other}' and '{this_name}'"),
                )),
                _ => name = Some(this_name),
            }
        }
        all_replaces.extend(replaces(file, this_name, raw, errors));
        if raw.algorithm.as_deref() == Some(AlgorithmKind::Concurrency.as_str()) {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.algorithm"),
                "algorithm: concurrency is only supported on a single rate_limit",
            ));
            continue;
        }
        if raw.max_delay.is_some() {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.max_delay"),
                "max_delay is only supported on a single rate_limit (a delay reserves one \
                 limit's wait; several limits are decided all-or-nothing)",
            ));
        }
        if raw.lease.is_some() || raw.lease_ttl.is_some() {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.lease"),
                "lease is only supported on a single rate_limit (a lease is one \
                 limit's units; several limits are decided all-or-nothing)",
            ));
        }
        let unit_name = raw.unit.as_deref().unwrap_or_default();
        let Some(unit) = Unit::parse(unit_name) else {
            errors.push(ConfigError::reference(
                file,
                format!("invalid rate limit unit '{unit_name}'"),
            ));
            continue;
        };
        limits.extend(limit(file, &path, raw, unit, regions, errors));
    }
    RuleLimits {
        name: name.map(Arc::from),
        limits,
        unlimited: false,
        replaces: all_replaces,
    }
}

/// `algorithm: concurrency`: `max_in_flight` slots, each held at most `max_hold`; the
/// rate fields mean nothing there and are refused.
fn concurrency(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    regions: Option<&RegionPlan>,
    errors: &mut Vec<ConfigError>,
) -> RuleLimits {
    let before = errors.len();
    let given = [
        (raw.unit.is_some(), "unit"),
        (raw.requests_per_unit.is_some(), "requests_per_unit"),
        (raw.unlimited.is_some(), "unlimited"),
        (raw.burst.is_some(), "burst"),
        (raw.lease.is_some() || raw.lease_ttl.is_some(), "lease"),
        (raw.ledger.is_some(), "ledger"),
        (raw.on_over_limit.is_some(), "on_over_limit"),
        (raw.max_delay.is_some(), "max_delay"),
    ];
    for (_, field) in given.iter().filter(|(given, _)| *given) {
        errors.push(ConfigError::sluice(
            file,
            &format!("{path}.{field}"),
            format!(
                "{field} does not apply to algorithm: concurrency, which limits requests in \
                 flight (max_in_flight, max_hold)"
            ),
        ));
    }
    let in_flight_path = format!("{path}.max_in_flight");
    let max_in_flight = match raw.max_in_flight {
        None => {
            errors.push(ConfigError::sluice(
                file,
                &in_flight_path,
                "algorithm: concurrency needs max_in_flight: the most requests in flight per key",
            ));
            0
        }
        Some(n) if !(1..=MAX_IN_FLIGHT).contains(&n) => {
            errors.push(ConfigError::sluice(
                file,
                &in_flight_path,
                format!("max_in_flight must be from 1 to {MAX_IN_FLIGHT}, got {n}"),
            ));
            0
        }
        Some(n) => n,
    };
    let max_hold = match raw.max_hold.as_deref() {
        None => DEFAULT_MAX_HOLD,
        Some(text) => duration(
            file,
            &format!("{path}.max_hold"),
            text,
            MAX_HOLD_RANGE,
            "max_hold must be a duration from 1s to 24h (like 60s)",
            errors,
        ),
    };
    let name = raw.name.as_deref().unwrap_or_default();
    let replaces = replaces(file, name, raw, errors);
    let failure_mode = failure_mode(file, path, raw, errors);
    let mut limit = Limit {
        requests_per_unit: max_in_flight,
        // Not a rate: `max_hold` is the period.
        unit: Unit::Second,
        algorithm: AlgorithmKind::Concurrency,
        burst: None,
        failure_mode,
        lease: Lease::default(),
        ledger: false,
        on_over_limit: OnOverLimit::Refuse,
        max_hold,
        max_delay: 0,
        scope: Scope::Regional,
    };
    scope(file, path, raw, regions, &mut limit, errors);
    RuleLimits {
        name: (!name.is_empty()).then(|| name.into()),
        limits: (errors.len() == before)
            .then_some(limit)
            .into_iter()
            .collect(),
        unlimited: false,
        replaces,
    }
}

/// A duration field's value in µs within `range` (inclusive), else `why` is pushed
/// (with the text given) and 0 returned.
fn duration(
    file: &str,
    path: &str,
    text: &str,
    range: (Micros, Micros),
    why: &str,
    errors: &mut Vec<ConfigError>,
) -> Micros {
    match humantime::parse_duration(text).map(|d| u64::try_from(d.as_micros())) {
        Ok(Ok(micros)) if (range.0..=range.1).contains(&micros) => micros,
        _ => {
            errors.push(ConfigError::sluice(
                file,
                path,
                format!("{why}, got '{text}'"),
            ));
            0
        }
    }
}

/// `failure_mode`: `open` (default), `closed`, `local` or `error`.
fn failure_mode(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    errors: &mut Vec<ConfigError>,
) -> FailureMode {
    match raw.failure_mode.as_deref().unwrap_or_default() {
        "" | "open" => FailureMode::Open,
        "closed" => FailureMode::Closed,
        "local" => FailureMode::Local,
        "error" => FailureMode::Error,
        other => {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.failure_mode"),
                format!("unknown failure_mode '{other}' (expected open, closed, local or error)"),
            ));
            FailureMode::Open
        }
    }
}

/// `max_delay`: only token bucket, GCRA and sliding log reserve a later instant every
/// later request sees ([`AlgorithmKind::delays`]); a delay is never leased (it must reach the store)
/// nor combined with a debt (a charge that always counts is never delayed).
fn max_delay(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    algorithm: AlgorithmKind,
    errors: &mut Vec<ConfigError>,
) -> Micros {
    let Some(text) = raw.max_delay.as_deref() else {
        return 0;
    };
    let path = format!("{path}.max_delay");
    let delay = duration(
        file,
        &path,
        text,
        MAX_DELAY_RANGE,
        "max_delay must be a duration from 1ms to 60s (like 2s)",
        errors,
    );
    let mut refuse = |why: String| errors.push(ConfigError::sluice(file, &path, why));
    if !algorithm.delays() {
        refuse(format!(
            "max_delay is only valid with algorithm token_bucket, gcra or sliding_log (they \
             reserve a later instant every later request sees), not {}",
            algorithm.as_str()
        ));
    }
    if raw.lease.is_some() {
        refuse("max_delay cannot be combined with lease: a delay is reserved in the store".into());
    }
    if raw.on_over_limit.as_deref() == Some(OnOverLimit::Charge.as_str()) {
        refuse(
            "max_delay cannot be combined with on_over_limit: charge: a charge that always \
             counts is never delayed"
                .into(),
        );
    }
    delay
}

/// The reference's `replaces` checks.
fn replaces(
    file: &str,
    name: &str,
    raw: &RawRateLimit,
    errors: &mut Vec<ConfigError>,
) -> Vec<Arc<str>> {
    let list = raw.replaces.as_deref().unwrap_or_default();
    for item in list {
        let replaced = item.name.as_deref().unwrap_or_default();
        if replaced.is_empty() {
            errors.push(ConfigError::reference(
                file,
                "should not have an empty replaces entry",
            ));
        } else if replaced == name {
            errors.push(ConfigError::reference(
                file,
                "replaces should not contain name of same descriptor",
            ));
        }
    }
    list.iter()
        .map(|item| Arc::from(item.name.as_deref().unwrap_or_default()))
        .collect()
}

/// One limit with its extension fields checked.
fn limit(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    unit: Unit,
    regions: Option<&RegionPlan>,
    errors: &mut Vec<ConfigError>,
) -> Option<Limit> {
    let before = errors.len();
    let requests_per_unit = raw.requests_per_unit.unwrap_or(0);
    let algorithm = match raw.algorithm.as_deref().unwrap_or_default() {
        "" => AlgorithmKind::default(),
        name => AlgorithmKind::parse(name).unwrap_or_else(|| {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.algorithm"),
                format!(
                    "unknown algorithm '{name}' (expected fixed_window, sliding_window, \
                     sliding_log, token_bucket, gcra or concurrency)"
                ),
            ));
            AlgorithmKind::default()
        }),
    };
    if let Some(burst) = raw.burst {
        let path = format!("{path}.burst");
        if !matches!(algorithm, AlgorithmKind::TokenBucket | AlgorithmKind::Gcra) {
            errors.push(ConfigError::sluice(
                file,
                &path,
                format!(
                    "burst is only valid with algorithm token_bucket or gcra, not {}",
                    algorithm.as_str()
                ),
            ));
        } else if burst == 0 {
            errors.push(ConfigError::sluice(file, &path, "burst must be at least 1"));
        }
    }
    let failure_mode = failure_mode(file, path, raw, errors);
    refuse_given(
        file,
        path,
        &[
            (raw.max_in_flight.is_some(), "max_in_flight"),
            (raw.max_hold.is_some(), "max_hold"),
        ],
        |field| format!("{field} is only valid with algorithm: concurrency"),
        errors,
    );
    let max_delay = max_delay(file, path, raw, algorithm, errors);
    if algorithm == AlgorithmKind::SlidingLog && requests_per_unit > MAX_SLIDING_LOG_LIMIT {
        errors.push(ConfigError::sluice(
            file,
            &format!("{path}.requests_per_unit"),
            format!(
                "sliding_log allows at most {MAX_SLIDING_LOG_LIMIT} requests_per_unit \
                 (every check reads the whole log; sliding_window suits larger limits), \
                 got {requests_per_unit}"
            ),
        ));
    }
    let lease = lease(file, path, raw, algorithm, requests_per_unit, errors);
    let ledger = raw.ledger.unwrap_or(false);
    if ledger {
        ledger_fits(file, path, algorithm, &lease, errors);
    }
    let on_over_limit = on_over_limit(file, path, raw, algorithm, lease, errors);
    let mut limit = Limit {
        requests_per_unit,
        unit,
        algorithm,
        burst: raw.burst,
        failure_mode,
        lease,
        ledger,
        on_over_limit,
        max_hold: 0,
        max_delay,
        scope: Scope::Regional,
    };
    scope(file, path, raw, regions, &mut limit, errors);
    (errors.len() == before).then_some(limit)
}

/// `scope`, `sharing` and `weights`: how `limit` is shared between the regions of
/// `regions` (none: one region, the whole world). A `split` limit's numbers become this
/// region's share.
fn scope(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    regions: Option<&RegionPlan>,
    limit: &mut Limit,
    errors: &mut Vec<ConfigError>,
) {
    let sharing_path = format!("{path}.sharing");
    match raw.scope.as_deref().unwrap_or_default() {
        "" | "regional" => {
            refuse_given(
                file,
                path,
                &[
                    (raw.sharing.is_some(), "sharing"),
                    (raw.weights.is_some(), "weights"),
                ],
                |field| {
                    format!(
                        "{field} needs scope: global (a regional limit is enforced whole \
                         in each region)"
                    )
                },
                errors,
            );
            return;
        }
        "global" => {}
        other => {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.scope"),
                format!("unknown scope '{other}' (expected regional or global)"),
            ));
            return;
        }
    }
    let aggregate = match raw.sharing.as_deref() {
        Some("split") => false,
        Some("aggregate") => true,
        None => {
            errors.push(ConfigError::sluice(
                file,
                &sharing_path,
                "scope: global needs sharing: split (each region enforces a static share of \
                 the limit) or aggregate (each region counts the other regions' usage too)",
            ));
            return;
        }
        Some(other) => {
            errors.push(ConfigError::sluice(
                file,
                &sharing_path,
                format!("unknown sharing '{other}' (expected split or aggregate)"),
            ));
            return;
        }
    };
    let Some(weights) = weights(file, path, raw, regions, errors) else {
        return;
    };
    if aggregate {
        aggregate_fits(file, &sharing_path, limit, errors);
        limit.scope = Scope::Aggregate { weights };
    } else {
        split(file, path, regions, weights, limit, errors);
    }
}

/// A global limit's `weights` by region index (1 each when none are given); without a
/// plan, one region (index 0) of weight 1. `None` when they are invalid.
fn weights(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    regions: Option<&RegionPlan>,
    errors: &mut Vec<ConfigError>,
) -> Option<RegionWeights> {
    let before = errors.len();
    let path = format!("{path}.weights");
    let mut refuse = |why: String| errors.push(ConfigError::sluice(file, &path, why));
    let given = raw.weights.as_ref();
    if given.is_some_and(|given| given.len() > MAX_REGIONS) {
        refuse(RegionError::TooMany.to_string());
    }
    for (name, &weight) in given.into_iter().flatten() {
        if let Err(err) = RegionPlan::new(name, []) {
            refuse(err.to_string());
        } else if let Some(plan) = regions.filter(|plan| plan.index_of(name).is_none()) {
            refuse(format!(
                "region {name:?} is not one of the regions ({})",
                plan.names().join(", ")
            ));
        }
        if !(WEIGHT_RANGE.0..=WEIGHT_RANGE.1).contains(&weight) {
            refuse(format!(
                "the weight of region {name:?} must be from {} to {}, got {weight}",
                WEIGHT_RANGE.0, WEIGHT_RANGE.1
            ));
        }
    }
    let mut weights = RegionWeights::default();
    let Some(plan) = regions else {
        weights.0[0] = 1;
        return (errors.len() == before).then_some(weights);
    };
    let mut missing = Vec::new();
    for (index, name) in plan.names().iter().enumerate() {
        weights.0[index] = match given.map(|given| given.get(&**name)) {
            None => 1,
            Some(Some(&weight)) => u16::try_from(weight).unwrap_or(0),
            Some(None) => {
                missing.push(format!("{name:?}"));
                0
            }
        };
    }
    if !missing.is_empty() {
        refuse(format!(
            "weights leave out region {}: every region needs a weight",
            missing.join(", ")
        ));
    }
    (errors.len() == before).then_some(weights)
}

/// `sharing: split`: with a plan, the limit's numbers (`requests_per_unit` or
/// `max_in_flight`, and `burst`) become this region's share of them by `weights`, and
/// every region's share must be at least 1; without one, the limit is whole.
fn split(
    file: &str,
    path: &str,
    regions: Option<&RegionPlan>,
    weights: RegionWeights,
    limit: &mut Limit,
    errors: &mut Vec<ConfigError>,
) {
    limit.scope = Scope::Split {
        global_limit: limit.requests_per_unit,
        global_burst: limit.burst,
        weights,
    };
    let Some(plan) = regions else {
        return;
    };
    let field = if limit.algorithm == AlgorithmKind::Concurrency {
        "max_in_flight"
    } else {
        "requests_per_unit"
    };
    let share = |field: &str, total: u32, errors: &mut Vec<ConfigError>| {
        let weights: Vec<u64> = weights.0[..plan.names().len()]
            .iter()
            .map(|&weight| u64::from(weight))
            .collect();
        let shares = crate::regions::split(u64::from(total), &weights);
        if let Some(empty) = shares.iter().position(|&share| share == 0) {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.{field}"),
                format!(
                    "{field} {total} split by weights leaves region {:?} a share of 0",
                    plan.names()[empty]
                ),
            ));
        }
        u32::try_from(shares[plan.local()]).unwrap_or(total)
    };
    limit.requests_per_unit = share(field, limit.requests_per_unit, errors);
    limit.burst = limit.burst.map(|burst| share("burst", burst, errors));
    let capacity = limit.burst.unwrap_or(limit.requests_per_unit);
    if let LeaseMode::Units(units) = limit.lease.mode {
        if units > capacity {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.lease"),
                format!(
                    "a lease of {units} units can never be granted by this region's share \
                     of {capacity}"
                ),
            ));
        }
    }
}

/// `sharing: aggregate` adds the other regions' usage to this region's: only counts per
/// aligned window can be added, and only when every unit is counted by the store as it
/// is used.
fn aggregate_fits(file: &str, path: &str, limit: &Limit, errors: &mut Vec<ConfigError>) {
    let mut refuse = |why: String| errors.push(ConfigError::sluice(file, path, why));
    if !matches!(
        limit.algorithm,
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
    ) {
        refuse(format!(
            "sharing: aggregate needs fixed_window or sliding_window: their usage is a count \
             per aligned window that another region's can be added to; use sharing: split \
             for {}",
            limit.algorithm.as_str()
        ));
    }
    if limit.lease.mode != LeaseMode::Off {
        refuse(
            "sharing: aggregate cannot be combined with lease: a lease is taken from this \
             region's count alone"
                .into(),
        );
    }
    if limit.on_over_limit == OnOverLimit::Charge {
        refuse(
            "sharing: aggregate cannot be combined with on_over_limit: charge: a debt is \
             kept in this region's count alone"
                .into(),
        );
    }
    if limit.max_delay > 0 {
        refuse(
            "sharing: aggregate cannot be combined with max_delay: a delay is reserved in \
             this region's store alone"
                .into(),
        );
    }
}

/// `ledger: true` records units per window: only a `fixed_window` limit has windows
/// that the ledger, the store and an invoice all agree on, and only units the store
/// admitted one request at a time are recorded (leased units are charged before they
/// are used, and may be returned).
fn ledger_fits(
    file: &str,
    path: &str,
    algorithm: AlgorithmKind,
    lease: &Lease,
    errors: &mut Vec<ConfigError>,
) {
    let ledger_path = format!("{path}.ledger");
    if algorithm != AlgorithmKind::FixedWindow {
        errors.push(ConfigError::sluice(
            file,
            &ledger_path,
            format!(
                "ledger needs algorithm fixed_window (a quota counts units per calendar-aligned \
                 window), not {}",
                algorithm.as_str()
            ),
        ));
    }
    if lease.mode != LeaseMode::Off {
        errors.push(ConfigError::sluice(
            file,
            &ledger_path,
            "ledger cannot be combined with lease: leased units are charged before they are \
             used and may be returned, so they cannot be recorded as admitted",
        ));
    }
}

/// `on_over_limit`: `refuse` (default) or `charge` (every charge counts, into debt),
/// with the algorithms and options that can keep a debt.
fn on_over_limit(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    algorithm: AlgorithmKind,
    lease: Lease,
    errors: &mut Vec<ConfigError>,
) -> OnOverLimit {
    let path = format!("{path}.on_over_limit");
    let mode = match raw.on_over_limit.as_deref().unwrap_or_default() {
        "" | "refuse" => return OnOverLimit::Refuse,
        "charge" => OnOverLimit::Charge,
        other => {
            errors.push(ConfigError::sluice(
                file,
                &path,
                format!("unknown on_over_limit '{other}' (expected refuse or charge)"),
            ));
            return OnOverLimit::Refuse;
        }
    };
    if algorithm == AlgorithmKind::SlidingLog {
        errors.push(ConfigError::sluice(
            file,
            &path,
            "on_over_limit: charge is not supported by sliding_log: its log dates every \
             unit, so a debt would be one entry per unit charged (use sliding_window, \
             token_bucket or gcra)",
        ));
    }
    if lease.mode != LeaseMode::Off {
        errors.push(ConfigError::sluice(
            file,
            &path,
            "on_over_limit: charge cannot be leased: a lease admits locally what fits, \
             and a charge that does not fit must reach the store",
        ));
    }
    mode
}

/// `lease` and `lease_ttl`: which algorithms can lease, and sizes that can be granted.
fn lease(
    file: &str,
    path: &str,
    raw: &RawRateLimit,
    algorithm: AlgorithmKind,
    requests_per_unit: u32,
    errors: &mut Vec<ConfigError>,
) -> Lease {
    let mut lease = Lease::default();
    let lease_path = format!("{path}.lease");
    lease.mode = match raw.lease.as_deref().unwrap_or_default() {
        "" | "off" => LeaseMode::Off,
        "auto" => LeaseMode::Auto,
        text => match text.parse::<u32>() {
            Ok(0) | Err(_) => {
                errors.push(ConfigError::sluice(
                    file,
                    &lease_path,
                    format!("lease must be off, auto or a number of units ≥ 1, got '{text}'"),
                ));
                LeaseMode::Off
            }
            Ok(units) => LeaseMode::Units(units),
        },
    };
    let capacity = match algorithm {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra => raw.burst.unwrap_or(requests_per_unit),
        _ => requests_per_unit,
    };
    if let LeaseMode::Units(units) = lease.mode {
        if units > capacity {
            errors.push(ConfigError::sluice(
                file,
                &lease_path,
                format!("a lease of {units} units can never be granted by a limit of {capacity}"),
            ));
        }
    }
    if lease.mode != LeaseMode::Off && algorithm == AlgorithmKind::SlidingLog {
        errors.push(ConfigError::sluice(
            file,
            &lease_path,
            "sliding_log cannot lease: its log dates each unit, and leased units are used \
             after they are charged, so the log would free them early; use \
             sliding_window, fixed_window, token_bucket or gcra",
        ));
    }
    if let Some(text) = raw.lease_ttl.as_deref() {
        let ttl_path = format!("{path}.lease_ttl");
        let ttl = duration(
            file,
            &ttl_path,
            text,
            LEASE_TTL_RANGE,
            "lease_ttl must be a duration from 1ms to 60s (like 250ms)",
            errors,
        );
        // 0: refused (the range starts at 1 ms); the default stays.
        if ttl > 0 {
            lease.ttl = ttl;
        }
        if lease.mode == LeaseMode::Off {
            errors.push(ConfigError::sluice(
                file,
                &ttl_path,
                "lease_ttl needs lease: auto or a number of units",
            ));
        }
    }
    lease
}

/// For each `(given, field)` that is given, an error at `path.field` saying `why(field)`.
fn refuse_given(
    file: &str,
    path: &str,
    fields: &[(bool, &str)],
    why: impl Fn(&str) -> String,
    errors: &mut Vec<ConfigError>,
) {
    for &(given, field) in fields {
        if given {
            errors.push(ConfigError::sluice(
                file,
                &format!("{path}.{field}"),
                why(field),
            ));
        }
    }
}
