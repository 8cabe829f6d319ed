//! Response assembly: per-descriptor statuses, the overall code (shadow and quota
//! modes), rate limit headers and dynamic metadata, as envoyproxy/ratelimit answers.

use std::collections::{BTreeMap, HashMap};

use prost_types::{value::Kind, ListValue, Struct, Value};

use crate::algorithm::{AlgorithmKind, Micros};
use crate::limiter::{ceil_seconds, CheckRequest, Limited, Verdict};
use crate::proto::core::HeaderValue;
use crate::proto::rls::rate_limit_response::{
    rate_limit::Unit as WireUnit, Code, DescriptorStatus, RateLimit,
};
use crate::proto::rls::RateLimitResponse;
use crate::rules::Unit;

/// Which rate limit headers go into `response_headers_to_add`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HeaderMode {
    /// No headers.
    #[default]
    None,
    /// The reference's `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    Reference,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`, plus `Retry-After`.
    Draft,
    /// Both sets.
    All,
}

/// How responses are shaped; fixed for the life of a rule set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseOptions {
    /// `SHADOW_MODE`: an OVER_LIMIT overall code becomes OK (statuses keep theirs).
    pub global_shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is a quota descriptor.
    pub global_quota_mode: bool,
    /// Header set to add.
    pub header_mode: HeaderMode,
    /// Names of the reference's three headers (`LIMIT_*_HEADER`).
    pub limit_header: String,
    /// See `limit_header`.
    pub remaining_header: String,
    /// See `limit_header`.
    pub reset_header: String,
    /// `RESPONSE_DYNAMIC_METADATA`: describe the request in `dynamic_metadata`.
    pub dynamic_metadata: bool,
}

impl Default for ResponseOptions {
    fn default() -> Self {
        Self {
            global_shadow_mode: false,
            global_quota_mode: false,
            header_mode: HeaderMode::None,
            limit_header: "RateLimit-Limit".into(),
            remaining_header: "RateLimit-Remaining".into(),
            reset_header: "RateLimit-Reset".into(),
            dynamic_metadata: false,
        }
    }
}

/// A built response and whether global shadow mode turned OVER_LIMIT into OK.
pub struct Built {
    /// The wire response.
    pub(crate) response: RateLimitResponse,
    /// Global shadow mode let this call through.
    pub(crate) shadowed: bool,
}

/// Assembles the response for `request` from its verdicts.
pub fn build(
    request: &CheckRequest<'_>,
    verdicts: &[Verdict<'_>],
    options: &ResponseOptions,
) -> Built {
    let statuses: Vec<DescriptorStatus> = verdicts.iter().map(status_of).collect();

    // The descriptor the headers describe: the last non-quota one over its limit, else
    // the one with the least remaining (the reference's choice).
    let mut headline: Option<usize> = None;
    let mut least_remaining = u32::MAX;
    let mut any_over = false;
    // Longest wait of the non-quota descriptors over their limit: until then the request
    // is refused whatever the headline says (`Retry-After`).
    let mut longest_retry: Micros = 0;
    let mut quota_groups: HashMap<String, QuotaGroup> = HashMap::new();
    // Quota groups and passed descriptors matter only in quota mode and for dynamic
    // metadata; both vectors stay unallocated otherwise.
    let mut group_of: Vec<Option<String>> = Vec::new();
    let mut passed = Vec::new();
    let track_passed = options.dynamic_metadata;

    for (index, (verdict, status)) in verdicts.iter().zip(&statuses).enumerate() {
        if status.current_limit.is_some() && status.limit_remaining < least_remaining {
            headline = Some(index);
            least_remaining = status.limit_remaining;
        }
        // Every descriptor but an unlimited one takes part, as in the reference: one
        // with no limit (or a replaced one) is a quota descriptor that passed under
        // `QUOTA_MODE`.
        let (over, retry_after, quota_mode) = match verdict {
            Verdict::Unlimited => continue,
            Verdict::NoLimit => (false, 0, options.global_quota_mode),
            Verdict::Limited(limited) => (
                limited.over_limit,
                limited.decision.retry_after,
                options.global_quota_mode || limited.rule.quota_mode,
            ),
        };
        if track_passed && !over {
            passed.push(index);
        }
        if quota_mode {
            let group = quota_group_key(&request.descriptors[index].entries);
            let entry = quota_groups.entry(group.clone()).or_default();
            if over {
                entry.over = true;
                entry.retry_after = entry.retry_after.max(retry_after);
            }
            if group_of.is_empty() {
                group_of.resize(verdicts.len(), None);
            }
            group_of[index] = Some(group);
        } else if over {
            any_over = true;
            headline = Some(index);
            least_remaining = 0;
            longest_retry = longest_retry.max(retry_after);
        }
    }
    let quota_over = !quota_groups.is_empty() && quota_groups.values().all(|group| group.over);
    if quota_over {
        // Every group over: the request passes again when the first group does.
        let first_free = quota_groups.values().map(|group| group.retry_after).min();
        longest_retry = longest_retry.max(first_free.unwrap_or(0));
    }
    let mut overall = if any_over || quota_over {
        Code::OverLimit
    } else {
        Code::Ok
    };

    let mut shadowed = false;
    if overall == Code::OverLimit && options.global_shadow_mode {
        overall = Code::Ok;
        shadowed = true;
    }
    let mut response = RateLimitResponse::default();
    if let Some(index) = headline {
        if let (Verdict::Limited(limited), Some(status)) = (&verdicts[index], statuses.get(index)) {
            // `Retry-After` only on a refusal: never on what global shadow mode let pass.
            let retry_after = (overall == Code::OverLimit).then_some(longest_retry);
            response.response_headers_to_add = headers(limited, status, retry_after, options);
        }
    }
    if options.dynamic_metadata {
        let available: Vec<usize> = passed
            .into_iter()
            .filter(|index| {
                group_of
                    .get(*index)
                    .and_then(Option::as_ref)
                    .is_none_or(|group| !quota_groups.get(group).is_some_and(|group| group.over))
            })
            .collect();
        response.dynamic_metadata = Some(metadata(
            request,
            verdicts,
            &available,
            !quota_groups.is_empty(),
        ));
    }
    response.overall_code = overall as i32;
    response.statuses = statuses;
    Built { response, shadowed }
}

/// The wire status of one verdict.
fn status_of(verdict: &Verdict<'_>) -> DescriptorStatus {
    match verdict {
        Verdict::NoLimit => DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        },
        Verdict::Unlimited => DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..DescriptorStatus::default()
        },
        Verdict::Limited(limited) => {
            let limit = limited.rule.limits.get(limited.limit_index);
            DescriptorStatus {
                code: if limited.over_limit {
                    Code::OverLimit
                } else {
                    Code::Ok
                } as i32,
                current_limit: limit.map(|limit| RateLimit {
                    name: limited.rule.name.as_deref().unwrap_or_default().to_owned(),
                    requests_per_unit: limit.requests_per_unit,
                    // A concurrency limit is no rate: its unit is UNKNOWN.
                    unit: if limit.algorithm == AlgorithmKind::Concurrency {
                        WireUnit::Unknown
                    } else {
                        wire_unit(limit.unit)
                    } as i32,
                }),
                limit_remaining: u32::try_from(limited.decision.remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(prost_types::Duration {
                    seconds: i64::try_from(ceil_seconds(limited.decision.reset_after))
                        .unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                quota: None,
            }
        }
    }
}

/// The wire unit of a rule unit.
pub(crate) fn wire_unit(unit: Unit) -> WireUnit {
    match unit {
        Unit::Second => WireUnit::Second,
        Unit::Minute => WireUnit::Minute,
        Unit::Hour => WireUnit::Hour,
        Unit::Day => WireUnit::Day,
        Unit::Week => WireUnit::Week,
        Unit::Month => WireUnit::Month,
        Unit::Year => WireUnit::Year,
    }
}

/// Headers describing the headline descriptor; `retry_after` (the request's longest
/// wait) when the answer is OVER_LIMIT.
fn headers(
    limited: &Limited<'_>,
    status: &DescriptorStatus,
    retry_after: Option<Micros>,
    options: &ResponseOptions,
) -> Vec<HeaderValue> {
    let Some(limit) = limited.rule.limits.get(limited.limit_index) else {
        return Vec::new();
    };
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |duration| duration.seconds);
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    };
    // A bucket whose burst is above its rate holds more than one unit's worth: the
    // headers describe its capacity, refilled over the time that takes, so that what
    // remains is never above the limit they state.
    let rate = u64::from(limit.requests_per_unit);
    let capacity = u64::from(limit.burst.unwrap_or(limit.requests_per_unit)).max(rate);
    let window = if limit.algorithm == AlgorithmKind::Concurrency {
        // Slots, not a rate: the window is the longest a slot is held.
        ceil_seconds(limit.max_hold)
    } else if capacity > rate {
        (limit.unit.seconds().saturating_mul(capacity)).div_ceil(rate.max(1))
    } else {
        limit.unit.seconds()
    };
    let mut out = Vec::new();
    if matches!(options.header_mode, HeaderMode::Reference | HeaderMode::All) {
        out.push(header(&options.limit_header, capacity.to_string()));
        out.push(header(
            &options.remaining_header,
            status.limit_remaining.to_string(),
        ));
        out.push(header(&options.reset_header, reset.to_string()));
    }
    if matches!(options.header_mode, HeaderMode::Draft | HeaderMode::All) {
        let name = limited
            .rule
            .name
            .as_deref()
            .unwrap_or(&limited.rule.stats_key)
            .replace(['"', '\\'], "_");
        out.push(header(
            "RateLimit-Policy",
            format!("\"{name}\";q={capacity};w={window}"),
        ));
        out.push(header(
            "RateLimit",
            format!("\"{name}\";r={};t={reset}", status.limit_remaining),
        ));
        if let Some(retry_after) = retry_after {
            let retry = ceil_seconds(retry_after).max(1);
            out.push(header("Retry-After", retry.to_string()));
        }
    }
    out
}

/// What a quota group's descriptors say together.
#[derive(Default)]
struct QuotaGroup {
    /// One of them is over its limit (the group is exhausted).
    over: bool,
    /// The longest wait of those over their limit.
    retry_after: Micros,
}

/// The reference's quota group of a descriptor: its backend/model entries if any,
/// else all its entries.
fn quota_group_key(entries: &[crate::rules::Entry<'_>]) -> String {
    let mut backend = "";
    let mut model = "";
    let mut all = String::new();
    for entry in entries {
        match entry.key {
            "backend_name" => backend = entry.value,
            "model_name_override" => model = entry.value,
            _ => {}
        }
        all.push_str(entry.key);
        all.push('=');
        all.push_str(entry.value);
        all.push(';');
    }
    if backend.is_empty() && model.is_empty() {
        all
    } else {
        format!("{backend}|{model}")
    }
}

/// Dynamic metadata: the request, and the merged `metadata` of descriptors that passed.
fn metadata(
    request: &CheckRequest<'_>,
    verdicts: &[Verdict<'_>],
    available: &[usize],
    quota_mode: bool,
) -> Struct {
    let mut fields = BTreeMap::new();
    fields.insert("domain".to_owned(), string_value(request.domain));
    let descriptors = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let mut fields = BTreeMap::new();
            let entries = descriptor
                .entries
                .iter()
                .map(|entry| string_value(&format!("{}={}", entry.key, entry.value)))
                .collect();
            fields.insert("entries".to_owned(), list_value(entries));
            if let Some(limit) = descriptor.limit_override {
                fields.insert(
                    "limit".to_owned(),
                    string_value(&format!(
                        "requests_per_unit:{} unit:{}",
                        limit.requests_per_unit,
                        limit.unit.as_upper_str()
                    )),
                );
            }
            if let Some(addend) = descriptor.hits_addend {
                fields.insert("hitsAddend".to_owned(), number_value(addend as f64));
            }
            struct_value(Struct { fields })
        })
        .collect();
    fields.insert("descriptors".to_owned(), list_value(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            number_value(request.hits_addend as f64),
        );
    }
    let mut merged = Struct::default();
    for index in available {
        if let Some(Verdict::Limited(limited)) = verdicts.get(*index) {
            if let Some(Kind::StructValue(source)) = limited
                .rule
                .metadata
                .as_deref()
                .map(json_to_value)
                .and_then(|v| v.kind)
            {
                merge_first_wins(&mut merged, source);
            }
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_owned(), struct_value(merged));
    }
    if quota_mode {
        let mut seen = std::collections::HashSet::new();
        let mut backends = Vec::new();
        for index in available {
            let entries = &request.descriptors[*index].entries;
            let find = |key: &str| {
                entries
                    .iter()
                    .find(|e| e.key == key)
                    .map_or("", |e| e.value)
            };
            let (backend, model) = (find("backend_name"), find("model_name_override"));
            if (backend.is_empty() && model.is_empty()) || !seen.insert(quota_group_key(entries)) {
                continue;
            }
            let mut pair = BTreeMap::new();
            pair.insert("backend_name".to_owned(), string_value(backend));
            pair.insert("model_name_override".to_owned(), string_value(model));
            backends.push(struct_value(Struct { fields: pair }));
        }
        if !backends.is_empty() {
            fields.insert("passedBackends".to_owned(), list_value(backends));
        }
    }
    Struct { fields }
}

/// Merges `source` into `dest`: nested structs merge, an existing value wins.
fn merge_first_wins(dest: &mut Struct, source: Struct) {
    for (key, value) in source.fields {
        match dest.fields.get_mut(&key) {
            Some(Value {
                kind: Some(Kind::StructValue(existing)),
            }) => {
                if let Some(Kind::StructValue(inner)) = value.kind {
                    merge_first_wins(existing, inner);
                }
            }
            Some(_) => {}
            None => {
                dest.fields.insert(key, value);
            }
        }
    }
}

/// A protobuf `Value` from JSON.
pub(crate) fn json_to_value(json: &serde_json::Value) -> Value {
    let kind = match json {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(map) => Kind::StructValue(Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}

fn string_value(text: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.to_owned())),
    }
}

fn number_value(number: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(number)),
    }
}

fn list_value(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn struct_value(value: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(value)),
    }
}
