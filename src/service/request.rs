//! Request validation at the boundary: wire types become [`CheckRequest`]s only when
//! they fit the configured bounds, so nothing past this point sees hostile sizes.

use crate::limiter::{CheckRequest, Descriptor};
use crate::proto::{rls::RateLimitRequest, types::RateLimitUnit};
use crate::rules::{Entry, LimitOverride, Unit};
use crate::service::ServiceError;

/// Size limits on one request (DESIGN §1). Beyond them the call fails with
/// `INVALID_ARGUMENT` and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestBounds {
    /// Most descriptors in one request.
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
    /// Longest key or value, in bytes (also bounds the domain).
    pub max_value_bytes: usize,
}

impl Default for RequestBounds {
    fn default() -> Self {
        Self {
            max_descriptors: 64,
            max_entries: 32,
            max_value_bytes: 1024,
        }
    }
}

/// Validates `request` against `bounds` and borrows it as a [`CheckRequest`].
pub fn to_check_request<'a>(
    request: &'a RateLimitRequest,
    bounds: &RequestBounds,
) -> Result<CheckRequest<'a>, ServiceError> {
    if request.domain.is_empty() {
        return Err(invalid("rate limit domain must not be empty"));
    }
    if request.domain.len() > bounds.max_value_bytes {
        return Err(invalid(format!(
            "domain is {} bytes, more than the limit of {}",
            request.domain.len(),
            bounds.max_value_bytes
        )));
    }
    if request.descriptors.is_empty() {
        return Err(invalid("rate limit descriptor list must not be empty"));
    }
    if request.descriptors.len() > bounds.max_descriptors {
        return Err(invalid(format!(
            "{} descriptors, more than the limit of {}",
            request.descriptors.len(),
            bounds.max_descriptors
        )));
    }
    let mut descriptors = Vec::with_capacity(request.descriptors.len());
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.len() > bounds.max_entries {
            return Err(invalid(format!(
                "descriptor {index} has {} entries, more than the limit of {}",
                descriptor.entries.len(),
                bounds.max_entries
            )));
        }
        let mut entries = Vec::with_capacity(descriptor.entries.len());
        for (position, entry) in descriptor.entries.iter().enumerate() {
            for (what, text) in [("key", &entry.key), ("value", &entry.value)] {
                if text.len() > bounds.max_value_bytes {
                    return Err(invalid(format!(
                        "descriptor {index} entry {position}: {what} is {} bytes, more than the limit of {}",
                        text.len(),
                        bounds.max_value_bytes
                    )));
                }
            }
            entries.push(Entry {
                key: &entry.key,
                value: &entry.value,
            });
        }
        let limit_override = match &descriptor.limit {
            None => None,
            Some(limit) => Some(LimitOverride {
                requests_per_unit: limit.requests_per_unit,
                unit: unit_from_wire(limit.unit).ok_or_else(|| {
                    invalid(format!(
                        "descriptor {index}: limit override has unknown unit {}",
                        limit.unit
                    ))
                })?,
            }),
        };
        descriptors.push(Descriptor {
            entries,
            limit_override,
            hits_addend: descriptor.hits_addend,
        });
    }
    Ok(CheckRequest {
        domain: &request.domain,
        descriptors,
        hits_addend: u64::from(request.hits_addend),
    })
}

/// The rule unit of a wire `RateLimitUnit`; `None` for UNKNOWN or undefined values.
fn unit_from_wire(unit: i32) -> Option<Unit> {
    Some(match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => return None,
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Week => Unit::Week,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
    })
}

/// An `INVALID_ARGUMENT` error with `reason`.
fn invalid(reason: impl Into<String>) -> ServiceError {
    ServiceError::InvalidArgument(reason.into())
}
