//! `GET /usage`: one descriptor's usage in the current window, per limit, from the store
//! and the ledger, without charging anything.

use std::collections::HashSet;

use serde::Serialize;

use super::matching::{match_descriptor, Applies};
use super::{descriptor_text, usage_key, CheckRequest, Descriptor, Limiter};
use crate::algorithm::MICROS_PER_SECOND;
use crate::rules::{Entry, Rules};
use crate::store::{Store, StoreError};

/// One descriptor's usage.
#[derive(Debug, Serialize)]
pub(crate) struct Usage {
    /// The request's domain.
    pub(crate) domain: String,
    /// `key=value,...` as asked.
    pub(crate) descriptor: String,
    /// `unknown_domain`, `no_match`, `unlimited` or `limited`.
    pub(crate) outcome: &'static str,
    /// Per limit of the matched rule.
    pub(crate) limits: Vec<LimitUsage>,
}

/// One limit's usage in its current window.
#[derive(Debug, Serialize)]
pub(crate) struct LimitUsage {
    /// The ledger's name of the limit (`<stats key>:<unit>`).
    pub(crate) name: String,
    /// Units per window.
    pub(crate) limit: u64,
    /// Algorithm name.
    pub(crate) algorithm: &'static str,
    /// Whether the limit has a ledger.
    pub(crate) ledger: bool,
    /// The window: its start (Unix seconds) and length.
    pub(crate) window_start: u64,
    /// Window length in seconds.
    pub(crate) window_seconds: u64,
    /// Seconds until the window ends (the store's `reset_after`, rounded up).
    pub(crate) reset_seconds: u64,
    /// Units the store counts in the window (refused hits included, for fixed window).
    pub(crate) store_used: u64,
    /// Units the ledger knows were admitted (its rows plus this instance's unwritten
    /// usage): a lower bound. Only for ledger limits.
    pub(crate) ledger_admitted: Option<u64>,
    /// Units a request could still take now: the limit less the larger of the two.
    pub(crate) remaining: u64,
}

impl<S: Store> Limiter<S> {
    /// The usage of `domain` / `entries` (see the module documentation).
    pub(crate) async fn usage(
        &self,
        rules: &Rules,
        domain: &str,
        entries: &[Entry<'_>],
    ) -> Result<Usage, StoreError> {
        let request = CheckRequest {
            domain,
            descriptors: vec![Descriptor {
                entries: entries.to_vec(),
                limit_override: None,
                hits_addend: Some(0),
                refund: false,
            }],
            hits_addend: 0,
        };
        let descriptor = descriptor_text(entries);
        let mut usage = Usage {
            domain: domain.to_owned(),
            descriptor: descriptor.to_string(),
            outcome: "no_match",
            limits: Vec::new(),
        };
        let mut replaced = HashSet::new();
        let (matched, mut check) =
            match match_descriptor(rules, &request, &request.descriptors[0], &mut replaced) {
                Applies::UnknownDomain => {
                    usage.outcome = "unknown_domain";
                    return Ok(usage);
                }
                Applies::NoMatch => return Ok(usage),
                Applies::Unlimited(_) => {
                    usage.outcome = "unlimited";
                    return Ok(usage);
                }
                Applies::Limited { matched, check, .. } => (matched, check),
            };
        usage.outcome = "limited";
        check.cost = 0;
        let mut decisions = Vec::new();
        self.store.peek(&check, &mut decisions).await?;
        let now = self.clock.now();
        for (limit, decision) in matched.rule.limits.iter().zip(&decisions) {
            let key = usage_key(&matched.rule, limit, descriptor.clone(), decision, now);
            let ledger_admitted = match (&self.ledger, limit.ledger) {
                (Some(ledger), true) => Some(ledger.admitted_before(&key, None).await),
                _ => None,
            };
            let quota = limit.quota();
            let used = decision.used.max(ledger_admitted.unwrap_or(0));
            usage.limits.push(LimitUsage {
                name: key.limit.to_string(),
                limit: quota.limit,
                algorithm: limit.algorithm.as_str(),
                ledger: limit.ledger,
                window_start: key.window_start,
                window_seconds: key.window_seconds,
                reset_seconds: decision.reset_after.div_ceil(MICROS_PER_SECOND),
                store_used: decision.used,
                ledger_admitted,
                remaining: quota.limit.saturating_sub(used),
            });
        }
        Ok(usage)
    }
}
