//! Request validation at the boundary: wire types become [`CheckRequest`]s only when
//! they fit the configured bounds, so nothing past this point sees hostile sizes.

use std::time::Duration;

use crate::limiter::{CheckRequest, Descriptor};
use crate::proto::{rls::RateLimitRequest, types::RateLimitUnit};
use crate::rules::{Entry, LimitOverride, Unit};
use crate::service::ServiceError;

/// Size limits on one request (DESIGN §1). Beyond them the call fails with
/// `INVALID_ARGUMENT` and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestBounds {
    /// Most descriptors in one request.
    pub(crate) max_descriptors: usize,
    /// Most entries in one descriptor.
    pub(crate) max_entries: usize,
    /// Longest key or value, in bytes (also bounds the domain).
    pub(crate) max_value_bytes: usize,
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
pub(crate) fn to_check_request<'a>(
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
        // A negative hit gives back the descriptor's own hits. Without them, it would
        // give back what the request-level `hits_addend` charges: a negative and a
        // positive cost for one descriptor, refused rather than guessed.
        if descriptor.is_negative_hits
            && descriptor.hits_addend.is_none()
            && request.hits_addend > 0
        {
            return Err(invalid(format!(
                "descriptor {index}: is_negative_hits with the request's positive hits_addend \
                 ({}) and no hits_addend of its own: a negative and a positive cost",
                request.hits_addend
            )));
        }
        descriptors.push(Descriptor {
            entries,
            limit_override,
            hits_addend: descriptor.hits_addend,
            refund: descriptor.is_negative_hits,
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

/// The caller's deadline from the `grpc-timeout` header (gRPC over HTTP/2: up to 8
/// digits and a unit, `H`, `M`, `S`, `m`, `u` or `n`); `None` when absent or malformed.
pub fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let text = metadata.get("grpc-timeout")?.to_str().ok()?;
    let split = text.len().checked_sub(1)?;
    let (digits, unit) = (text.get(..split)?, text.get(split..)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value.saturating_mul(3600)),
        "M" => Duration::from_secs(value.saturating_mul(60)),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grpc_timeout() {
        let parse = |text: &str| {
            let mut metadata = tonic::metadata::MetadataMap::new();
            metadata.insert("grpc-timeout", text.parse().expect("ascii"));
            grpc_timeout(&metadata)
        };
        assert_eq!(parse("20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse("1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("500u"), Some(Duration::from_micros(500)));
        assert_eq!(parse("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(parse("123456789m"), None);
        assert_eq!(parse("m"), None);
        assert_eq!(parse("10x"), None);
        assert_eq!(parse("-1m"), None);
        assert_eq!(grpc_timeout(&tonic::metadata::MetadataMap::new()), None);
    }
}
