//! xDS resources → rule files: each `RateLimitConfig` becomes the rule file it stands
//! for, so that pushed rules go through the one validation, merge and reload identity
//! that files do (as the reference converts them to its YAML structs).
//!
//! The file is JSON (a subset of YAML), pretty-printed so that an error's line points
//! into it, and named by the resource's name.

use prost::Message;
use serde_json::{json, Map, Value};

use crate::proto::rls_config::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use crate::rules::ConfigFile;

/// The type URL of the rate limit config resource.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Most resources one response may carry.
pub(crate) const MAX_RESOURCES: usize = 10_000;

/// A resource that is not a rate limit config.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ResourceError {
    /// The resource is of another type.
    #[error("resource {index}: type {type_url:?}, expected {TYPE_URL}")]
    WrongType {
        /// Position in the response.
        index: usize,
        /// The type it has.
        type_url: String,
    },
    /// The bytes are not a `RateLimitConfig`.
    #[error("resource {index}: not a RateLimitConfig: {reason}")]
    Undecodable {
        /// Position in the response.
        index: usize,
        /// The decoder's message.
        reason: String,
    },
    /// More resources than [`MAX_RESOURCES`].
    #[error("{count} resources in one response, more than {MAX_RESOURCES}")]
    TooMany {
        /// How many there were.
        count: usize,
    },
}

/// The rule files of a response's resources, in order. Each is named by its resource's
/// name (`resource <index>` when it has none).
pub(crate) fn rule_files(resources: &[prost_types::Any]) -> Result<Vec<ConfigFile>, ResourceError> {
    if resources.len() > MAX_RESOURCES {
        return Err(ResourceError::TooMany {
            count: resources.len(),
        });
    }
    resources
        .iter()
        .enumerate()
        .map(|(index, any)| {
            if any.type_url != TYPE_URL {
                return Err(ResourceError::WrongType {
                    index,
                    type_url: any.type_url.clone(),
                });
            }
            let config = RateLimitConfig::decode(any.value.as_slice()).map_err(|error| {
                ResourceError::Undecodable {
                    index,
                    reason: error.to_string(),
                }
            })?;
            Ok(rule_file(index, &config))
        })
        .collect()
}

/// The rule file `config` stands for.
pub(crate) fn rule_file(index: usize, config: &RateLimitConfig) -> ConfigFile {
    let name = if config.name.is_empty() {
        format!("resource {index}")
    } else {
        config.name.clone()
    };
    let root = json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&root).unwrap_or_default();
    ConfigFile { name, text }
}

/// One descriptor node: the fields a file would carry, empty strings and false flags
/// left out as a file would leave them.
fn descriptor(descriptor: &RateLimitDescriptor) -> Value {
    let mut node = Map::new();
    node.insert("key".into(), descriptor.key.clone().into());
    if !descriptor.value.is_empty() {
        node.insert("value".into(), descriptor.value.clone().into());
    }
    if let Some(policy) = &descriptor.rate_limit {
        node.insert("rate_limit".into(), rate_limit(policy));
    }
    if !descriptor.descriptors.is_empty() {
        let children = descriptor.descriptors.iter().map(self::descriptor);
        node.insert("descriptors".into(), children.collect::<Vec<_>>().into());
    }
    for (flag, set) in [
        ("shadow_mode", descriptor.shadow_mode),
        ("detailed_metric", descriptor.detailed_metric),
        ("quota_mode", descriptor.quota_mode),
    ] {
        if set {
            node.insert(flag.into(), true.into());
        }
    }
    Value::Object(node)
}

/// A `rate_limit` block. The unit is its enum name, as the reference converts it:
/// `UNKNOWN` is what an unlimited policy carries, and an error otherwise.
fn rate_limit(policy: &RateLimitPolicy) -> Value {
    let unit = RateLimitUnit::try_from(policy.unit).map_or_else(
        |_| policy.unit.to_string(),
        |unit| unit.as_str_name().to_owned(),
    );
    let mut block = Map::new();
    block.insert("requests_per_unit".into(), policy.requests_per_unit.into());
    block.insert("unit".into(), unit.into());
    if policy.unlimited {
        block.insert("unlimited".into(), true.into());
    }
    if !policy.name.is_empty() {
        block.insert("name".into(), policy.name.clone().into());
    }
    if !policy.replaces.is_empty() {
        let replaces = policy
            .replaces
            .iter()
            .map(|replace| json!({ "name": replace.name }));
        block.insert("replaces".into(), replaces.collect::<Vec<_>>().into());
    }
    Value::Object(block)
}

#[cfg(test)]
mod tests;
