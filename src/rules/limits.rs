//! The limits of one descriptor: the reference's `rate_limit` checks, and Sluice's
//! extensions (`algorithm`, `burst`, `failure_mode`, `rate_limits`).

use std::sync::Arc;

use super::schema::{RawDescriptor, RawRateLimit};
use super::{ConfigError, FailureMode, Lease, LeaseMode, Limit, Unit};
use crate::algorithm::{AlgorithmKind, OnOverLimit};

/// Shortest and longest `lease_ttl`.
const LEASE_TTL_RANGE: (u64, u64) = (1_000, 60_000_000);

/// Highest `requests_per_unit` of a `sliding_log` limit: the log keeps every admission
/// instant in the window, and a check reads and decides over the whole log, so both its
/// memory and its cost grow with the limit. In Redis a check costs ~0.24 µs per logged
/// instant: 2.4 ms at 10 000 (the cap before), enough for one hot key to hold its node
/// past the call deadline; ~0.25 ms at 1 000. Larger limits want `sliding_window`.
pub(crate) const MAX_SLIDING_LOG_LIMIT: u32 = 1_000;

/// What a descriptor's `rate_limit`/`rate_limits` compile to.
pub(crate) struct RuleLimits {
    pub(crate) name: Option<Arc<str>>,
    pub(crate) limits: Vec<Limit>,
    pub(crate) unlimited: bool,
    pub(crate) replaces: Vec<Arc<str>>,
}

/// Compiles the limits of descriptor `raw` at YAML `path`; `None` when it has none or
/// they are invalid (the errors are pushed to `errors`).
pub(crate) fn rule_limits(
    file: &str,
    path: &str,
    raw: &RawDescriptor,
    errors: &mut Vec<ConfigError>,
) -> Option<RuleLimits> {
    let before = errors.len();
    let out = match (&raw.rate_limit, &raw.rate_limits) {
        (None, None) => return None,
        (Some(_), Some(_)) => {
            errors.push(ConfigError::sluice(
                file,
                path,
                "rate_limit and rate_limits cannot both be given",
            ));
            return None;
        }
        (Some(one), None) => single(file, &format!("{path}.rate_limit"), one, errors),
        (None, Some(list)) => several(file, &format!("{path}.rate_limits"), list, errors),
    };
    (errors.len() == before).then_some(out)
}

/// The reference's `rate_limit`, plus the extension fields.
fn single(file: &str, path: &str, raw: &RawRateLimit, errors: &mut Vec<ConfigError>) -> RuleLimits {
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
    let replaces = replaces(file, name, raw, errors);
    let limit = unit.and_then(|unit| limit(file, path, raw, unit, errors));
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
        limits.extend(limit(file, &path, raw, unit, errors));
    }
    RuleLimits {
        name: name.map(Arc::from),
        limits,
        unlimited: false,
        replaces: all_replaces,
    }
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
                     sliding_log, token_bucket or gcra)"
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
    let failure_mode = match raw.failure_mode.as_deref().unwrap_or_default() {
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
    };
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
    (errors.len() == before).then_some(Limit {
        requests_per_unit,
        unit,
        algorithm,
        burst: raw.burst,
        failure_mode,
        lease,
        ledger,
        on_over_limit,
    })
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
        match humantime::parse_duration(text).map(|d| u64::try_from(d.as_micros())) {
            Ok(Ok(ttl)) if (LEASE_TTL_RANGE.0..=LEASE_TTL_RANGE.1).contains(&ttl) => {
                lease.ttl = ttl;
            }
            _ => errors.push(ConfigError::sluice(
                file,
                &ttl_path,
                format!("lease_ttl must be a duration from 1ms to 60s (like 250ms), got '{text}'"),
            )),
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
