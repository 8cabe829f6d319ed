//! Proto3 JSON for `POST /json`: the request in, the response out, with the field
//! names, enum names and omitted defaults of the canonical mapping.

use serde_json::{json, Map, Value};

use crate::proto::common::rate_limit_descriptor::{Entry, RateLimitOverride};
use crate::proto::common::RateLimitDescriptor;
use crate::proto::rls::rate_limit_response::{rate_limit::Unit, Code};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::proto::types::RateLimitUnit;

/// Why a JSON body is not a `RateLimitRequest`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct JsonError(String);

/// Parses a proto3 JSON `RateLimitRequest` (camelCase or original field names).
pub(crate) fn parse_request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| JsonError(e.to_string()))?;
    let object = as_object(&value, "request")?;
    let mut request = RateLimitRequest {
        domain: string_field(object, &["domain"])?.unwrap_or_default(),
        ..RateLimitRequest::default()
    };
    if let Some(addend) = uint_field(object, &["hitsAddend", "hits_addend"])? {
        request.hits_addend =
            u32::try_from(addend).map_err(|_| JsonError("hitsAddend out of range".into()))?;
    }
    if let Some(descriptors) = field(object, &["descriptors"]) {
        for descriptor in as_array(descriptors, "descriptors")? {
            request.descriptors.push(parse_descriptor(descriptor)?);
        }
    }
    Ok(request)
}

fn parse_descriptor(value: &Value) -> Result<RateLimitDescriptor, JsonError> {
    let object = as_object(value, "descriptor")?;
    let mut descriptor = RateLimitDescriptor::default();
    if let Some(entries) = field(object, &["entries"]) {
        for entry in as_array(entries, "entries")? {
            let entry = as_object(entry, "entry")?;
            descriptor.entries.push(Entry {
                key: string_field(entry, &["key"])?.unwrap_or_default(),
                value: string_field(entry, &["value"])?.unwrap_or_default(),
            });
        }
    }
    if let Some(limit) = field(object, &["limit"]) {
        let limit = as_object(limit, "limit")?;
        let requests_per_unit =
            uint_field(limit, &["requestsPerUnit", "requests_per_unit"])?.unwrap_or(0);
        let unit = match field(limit, &["unit"]) {
            None | Some(Value::Null) => RateLimitUnit::Unknown,
            Some(Value::String(name)) => RateLimitUnit::from_str_name(name)
                .ok_or_else(|| JsonError(format!("unknown unit {name:?}")))?,
            Some(Value::Number(n)) => n
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .and_then(|n| RateLimitUnit::try_from(n).ok())
                .ok_or_else(|| JsonError(format!("unknown unit {n}")))?,
            Some(_) => return Err(JsonError("unit must be a string".into())),
        };
        descriptor.limit = Some(RateLimitOverride {
            requests_per_unit: u32::try_from(requests_per_unit)
                .map_err(|_| JsonError("requestsPerUnit out of range".into()))?,
            unit: unit as i32,
        });
    }
    if let Some(addend) = uint_field(object, &["hitsAddend", "hits_addend"])? {
        descriptor.hits_addend = Some(addend);
    }
    match ["isNegativeHits", "is_negative_hits"]
        .iter()
        .find_map(|name| object.get(*name))
    {
        None | Some(Value::Null) => {}
        Some(Value::Bool(negative)) => descriptor.is_negative_hits = *negative,
        Some(_) => return Err(JsonError("isNegativeHits must be a boolean".into())),
    }
    Ok(descriptor)
}

/// The canonical proto3 JSON of a response (default values omitted).
pub(crate) fn response_to_json(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if response.overall_code != 0 {
        out.insert("overallCode".into(), code_name(response.overall_code));
    }
    if !response.statuses.is_empty() {
        let statuses = response
            .statuses
            .iter()
            .map(|status| {
                let mut item = Map::new();
                if status.code != 0 {
                    item.insert("code".into(), code_name(status.code));
                }
                if let Some(limit) = &status.current_limit {
                    let mut current = Map::new();
                    if !limit.name.is_empty() {
                        current.insert("name".into(), json!(limit.name));
                    }
                    if limit.requests_per_unit != 0 {
                        current.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                    }
                    if limit.unit != 0 {
                        let unit = Unit::try_from(limit.unit)
                            .map(|u| u.as_str_name().to_owned())
                            .unwrap_or_else(|_| limit.unit.to_string());
                        current.insert("unit".into(), json!(unit));
                    }
                    item.insert("currentLimit".into(), Value::Object(current));
                }
                if status.limit_remaining != 0 {
                    item.insert("limitRemaining".into(), json!(status.limit_remaining));
                }
                if let Some(duration) = &status.duration_until_reset {
                    item.insert(
                        "durationUntilReset".into(),
                        json!(format!("{}s", duration.seconds)),
                    );
                }
                Value::Object(item)
            })
            .collect();
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(metadata) = &response.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_to_json(metadata));
    }
    Value::Object(out)
}

fn code_name(code: i32) -> Value {
    match Code::try_from(code) {
        Ok(code) => json!(code.as_str_name()),
        Err(_) => json!(code),
    }
}

/// JSON of a protobuf `Struct`.
pub fn struct_to_json(value: &prost_types::Struct) -> Value {
    Value::Object(
        value
            .fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(value: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => number_to_json(*n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_to_json).collect()),
    }
}

/// A number as proto3 JSON (Go's protojson) writes it: a whole number without a
/// fraction (`2`, not `2.0`), any other as the shortest decimal.
fn number_to_json(n: f64) -> Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every whole number below is exact
    if n.fract() == 0.0 && n.abs() < EXACT {
        json!(n as i64)
    } else {
        json!(n)
    }
}

fn field<'a>(object: &'a Map<String, Value>, names: &[&str]) -> Option<&'a Value> {
    names.iter().find_map(|name| object.get(*name))
}

fn as_object<'a>(value: &'a Value, what: &str) -> Result<&'a Map<String, Value>, JsonError> {
    value
        .as_object()
        .ok_or_else(|| JsonError(format!("{what} must be an object")))
}

fn as_array<'a>(value: &'a Value, what: &str) -> Result<&'a Vec<Value>, JsonError> {
    value
        .as_array()
        .ok_or_else(|| JsonError(format!("{what} must be a list")))
}

fn string_field(object: &Map<String, Value>, names: &[&str]) -> Result<Option<String>, JsonError> {
    match field(object, names) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(JsonError(format!("{} must be a string", names[0]))),
    }
}

/// A proto3 JSON unsigned integer: a number or a decimal string, in any spelling of a
/// whole number (`2`, `2.0`, `1e1`), as Go's protojson reads it.
fn uint_field(object: &Map<String, Value>, names: &[&str]) -> Result<Option<u64>, JsonError> {
    let bad = || JsonError(format!("{} must be a non-negative integer", names[0]));
    let whole = |n: &serde_json::Number| {
        n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 18_446_744_073_709_551_616.0)
                .map(|f| f as u64)
        })
    };
    match field(object, names) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => whole(n).map(Some).ok_or_else(bad),
        Some(Value::String(s)) => s
            .trim()
            .parse::<serde_json::Number>()
            .ok()
            .filter(|_| s.trim() == s)
            .as_ref()
            .and_then(whole)
            .map(Some)
            .ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_read_and_write_as_protojson_does() {
        for (text, read) in [
            ("2", Some(2)),
            ("2.0", Some(2)),
            ("1e1", Some(10)),
            ("\"7\"", Some(7)),
            ("\"1e1\"", Some(10)),
            ("2.5", None),
            ("-1", None),
            ("\" 7\"", None),
            ("1e30", None),
        ] {
            let object: Map<String, Value> =
                serde_json::from_str(&format!("{{\"hitsAddend\": {text}}}")).expect("JSON");
            assert_eq!(
                uint_field(&object, &["hitsAddend"]).ok().flatten(),
                read,
                "{text}"
            );
        }
        assert_eq!(number_to_json(2.0).to_string(), "2");
        assert_eq!(number_to_json(2.5).to_string(), "2.5");
    }

    #[test]
    fn negative_hits_read_in_both_spellings() {
        let parse = |descriptor: &str| {
            let body = format!(r#"{{"domain": "d", "descriptors": [{descriptor}]}}"#);
            parse_request(body.as_bytes()).map(|r| r.descriptors[0].is_negative_hits)
        };
        let entries = r#""entries": [{"key": "k", "value": "v"}], "hitsAddend": 2"#;
        assert_eq!(parse(&format!("{{{entries}}}")).ok(), Some(false));
        for name in ["isNegativeHits", "is_negative_hits"] {
            let text = format!(r#"{{{entries}, "{name}": true}}"#);
            assert_eq!(parse(&text).ok(), Some(true), "{name}");
        }
        let text = format!(r#"{{{entries}, "isNegativeHits": "yes"}}"#);
        assert!(parse(&text).is_err());
    }
}
