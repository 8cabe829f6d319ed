//! How each descriptor of a request applies, before any counter is read: the one
//! matching step that [`super::Limiter::check`] and [`super::explain`] share, so that
//! what `explain` shows is what a check does.
//!
//! A request is matched in two steps, as the reference does: every descriptor is looked
//! up first ([`match_descriptor`]), collecting the names its rules replace; then a rule
//! whose name is among them is not applied ([`is_replaced`]).

use std::collections::HashSet;

use super::{store_check, CheckRequest, Descriptor};
use crate::rules::{Lookup, Matched, Rule, RuleRef, Rules};
use crate::store::StoreCheck;

/// How one descriptor applies.
pub(crate) enum Applies<'r> {
    /// The request's domain has no rules.
    UnknownDomain,
    /// No rule matches the descriptor.
    NoMatch,
    /// The matched rule is `unlimited`.
    Unlimited(Matched<'r>),
    /// The matched rule limits: its check (counter key, limits, cost) and the hits the
    /// request asks for (statistics count these even when nothing is charged).
    Limited {
        /// The match.
        matched: Matched<'r>,
        /// What the store is asked.
        check: StoreCheck,
        /// Hits asked for.
        hits: u64,
    },
}

/// Looks `descriptor` of `request` up in `rules`. The names its rule replaces go into
/// `replaced` (an `unlimited` rule's too, as in the reference): apply them with
/// [`is_replaced`] once every descriptor of the request is matched.
pub(crate) fn match_descriptor<'r>(
    rules: &'r Rules,
    request: &CheckRequest<'_>,
    descriptor: &Descriptor<'_>,
    replaced: &mut HashSet<&'r str>,
) -> Applies<'r> {
    let matched = match rules.lookup(
        request.domain,
        &descriptor.entries,
        descriptor.limit_override,
    ) {
        Lookup::UnknownDomain => return Applies::UnknownDomain,
        Lookup::NoMatch => return Applies::NoMatch,
        Lookup::Matched(matched) => matched,
    };
    // Only configured rules replace: a request's limit override has no `replaces`.
    if let RuleRef::Borrowed(rule) = matched.rule {
        replaced.extend(rule.replaces.iter().map(|name| &**name));
    }
    if matched.rule.unlimited {
        return Applies::Unlimited(matched);
    }
    let hits = descriptor.hits_addend.unwrap_or(request.hits_addend.max(1));
    let mut check = store_check(request.domain, &descriptor.entries, &matched, hits);
    // A refund of nothing is a check of cost 0.
    check.refund = descriptor.refund && hits > 0;
    Applies::Limited {
        matched,
        check,
        hits,
    }
}

/// Whether another matched rule of the request replaces `rule` (by its name).
pub(crate) fn is_replaced(rule: &Rule, replaced: &HashSet<&str>) -> bool {
    rule.name
        .as_deref()
        .is_some_and(|name| replaced.contains(name))
}
