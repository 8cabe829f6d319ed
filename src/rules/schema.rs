//! The YAML schema: serde structs mirroring envoyproxy/ratelimit's config file, and the
//! reference's key whitelist.
//!
//! A file is parsed twice, as the reference does: once into a generic tree to check every
//! map key against the whitelist (with the reference's messages), then into the typed
//! structs below. Every field is optional so that `key:` (YAML null) reads as the zero
//! value, as Go's yaml.v2 does; scalars read into `String` fields keep their source text
//! (`value: 123` is the string `"123"`).
//!
//! Budgets against hostile YAML (per file, see [`yaml_options`]): at most
//! [`MAX_FILE_BYTES`] of text, 160 levels of YAML nesting (a descriptor level is two YAML
//! levels; rules are capped at 32 levels anyway), 2 000 000 nodes (some 300 000
//! descriptors: split bigger rule sets over several files), 4 000 000 parser events,
//! 1 000 anchors, 1 000 aliases replaying at most 100 000 events in total (no YAML
//! bomb), and one document.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::ConfigError;

/// Largest rule file accepted, in bytes.
pub(crate) const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;

/// Keys allowed anywhere in a file: the reference's whitelist plus Sluice's extensions.
const VALID_KEYS: &[&str] = &[
    // envoyproxy/ratelimit
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // Sluice
    "rate_limits",
    "algorithm",
    "burst",
    "failure_mode",
    "lease",
    "lease_ttl",
    "ledger",
    "on_over_limit",
    "slot",
    "max_in_flight",
    "max_hold",
    "max_delay",
    "scope",
    "sharing",
    "weights",
];

/// The root of a file.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct RawRoot {
    pub(crate) domain: Option<String>,
    pub(crate) descriptors: Option<Vec<RawDescriptor>>,
}

/// One descriptor node.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct RawDescriptor {
    pub(crate) key: Option<String>,
    pub(crate) value: Option<String>,
    pub(crate) rate_limit: Option<RawRateLimit>,
    /// Sluice: several limits checked all-or-nothing.
    pub(crate) rate_limits: Option<Vec<RawRateLimit>>,
    pub(crate) descriptors: Option<Vec<RawDescriptor>>,
    pub(crate) shadow_mode: Option<bool>,
    pub(crate) quota_mode: Option<bool>,
    pub(crate) detailed_metric: Option<bool>,
    pub(crate) value_to_metric: Option<bool>,
    pub(crate) share_threshold: Option<bool>,
    pub(crate) metadata: Option<serde_json::Value>,
    /// Sluice: this entry's value names the request's slot of a concurrency limit
    /// (not part of the counter key).
    pub(crate) slot: Option<bool>,
}

/// A `rate_limit` block (or one item of `rate_limits`).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct RawRateLimit {
    pub(crate) requests_per_unit: Option<u32>,
    pub(crate) unit: Option<String>,
    pub(crate) unlimited: Option<bool>,
    pub(crate) name: Option<String>,
    pub(crate) replaces: Option<Vec<RawReplaces>>,
    /// Sluice: algorithm name.
    pub(crate) algorithm: Option<String>,
    /// Sluice: token bucket / GCRA capacity.
    pub(crate) burst: Option<u32>,
    /// Sluice: what happens when the store fails.
    pub(crate) failure_mode: Option<String>,
    /// Sluice: token leasing, `off`, `auto` or a number of units.
    pub(crate) lease: Option<String>,
    /// Sluice: longest life of a lease (`250ms`, `1s`).
    pub(crate) lease_ttl: Option<String>,
    /// Sluice: record every admitted unit in the usage ledger (PostgreSQL).
    pub(crate) ledger: Option<bool>,
    /// Sluice: `refuse` (default) or `charge`: whether a charge that does not fit
    /// still counts (debt).
    pub(crate) on_over_limit: Option<String>,
    /// Sluice: concurrency limit, most requests in flight.
    pub(crate) max_in_flight: Option<u32>,
    /// Sluice: concurrency limit, longest a slot is held (`60s`).
    pub(crate) max_hold: Option<String>,
    /// Sluice: longest wait a request may be delayed by instead of refused (`2s`).
    pub(crate) max_delay: Option<String>,
    /// Sluice: `regional` (default) or `global`: whether the limit is shared between
    /// regions.
    pub(crate) scope: Option<String>,
    /// Sluice: how a global limit is shared, `split` or `aggregate`.
    pub(crate) sharing: Option<String>,
    /// Sluice: a global limit's weight per region name (1 each when none are given).
    pub(crate) weights: Option<BTreeMap<String, i64>>,
}

/// One item of `replaces`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct RawReplaces {
    pub(crate) name: Option<String>,
}

/// Parser options with the budgets documented in the module comment.
fn yaml_options() -> serde_saphyr::Options {
    let mut alias_limits = serde_saphyr::options::AliasLimits::default();
    alias_limits.max_total_replayed_events = 100_000;
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: 160,
            max_nodes: 2_000_000,
            max_events: 4_000_000,
            max_anchors: 1_000,
            max_aliases: 1_000,
            max_documents: 1,
        },
        alias_limits: alias_limits,
        // yaml.v2 (the reference) reads `0123` as an octal integer, so such a value loads
        // there (as the text "0123" in a string field, as 83 in a number field).
        legacy_octal_numbers: true,
    }
}

/// Parses one file: whitelist check, then the typed structs.
pub(crate) fn parse_file(name: &str, text: &str) -> Result<RawRoot, ConfigError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(ConfigError::sluice(
            name,
            "(file)",
            format!("file is larger than {MAX_FILE_BYTES} bytes"),
        ));
    }
    let tree: Yaml = serde_saphyr::from_str_with_options(text, yaml_options())
        .map_err(|err| yaml_error(name, &err))?;
    match tree {
        Yaml::Map(entries) => validate_keys(name, &entries)?,
        Yaml::Null => {}
        other => {
            return Err(ConfigError::Yaml {
                file: name.to_owned(),
                message: format!("the document is a {}, not a map", other.kind()),
                line: None,
                column: None,
            })
        }
    }
    serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|err| yaml_error(name, &err))
}

fn yaml_error(name: &str, err: &serde_saphyr::Error) -> ConfigError {
    let location = err.location();
    ConfigError::Yaml {
        file: name.to_owned(),
        message: err.render_with_options(serde_saphyr::render_options! {
            snippets: serde_saphyr::SnippetMode::Off,
        }),
        line: location.map(|l| l.line()),
        column: location.map(|l| l.column()),
    }
}

/// The reference's `validateYamlKeys`: every key a string from the whitelist, every list
/// a list of maps, leaves strings, integers, booleans or null. `metadata` is free-form,
/// and the keys of `weights` are region names.
fn validate_keys(name: &str, entries: &[(Yaml, Yaml)]) -> Result<(), ConfigError> {
    for (key, value) in entries {
        let Yaml::Str(key) = key else {
            return Err(ConfigError::reference(
                name,
                format!("config error, key is not of type string: {key}"),
            ));
        };
        if !VALID_KEYS.contains(&key.as_str()) {
            return Err(ConfigError::reference(
                name,
                format!("config error, unknown key '{key}'"),
            ));
        }
        if key == "metadata" || key == "weights" {
            continue;
        }
        match value {
            Yaml::Seq(items) => {
                for item in items {
                    let Yaml::Map(inner) = item else {
                        return Err(ConfigError::reference(
                            name,
                            format!(
                                "config error, yaml file contains list of type other than map: {item}"
                            ),
                        ));
                    };
                    validate_keys(name, inner)?;
                }
            }
            Yaml::Map(inner) => validate_keys(name, inner)?,
            Yaml::Str(_) | Yaml::Int(_) | Yaml::Bool(_) | Yaml::Null => {}
            Yaml::Float(_) => {
                return Err(ConfigError::reference(name, "error checking config"));
            }
        }
    }
    Ok(())
}

/// A generic YAML value that, unlike `serde_json::Value`, keeps non-string map keys.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Yaml {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Yaml>),
    Map(Vec<(Yaml, Yaml)>),
}

// === impl Yaml ===

impl Yaml {
    fn kind(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "boolean",
            Self::Int(_) | Self::Float(_) => "number",
            Self::Str(_) => "string",
            Self::Seq(_) => "list",
            Self::Map(_) => "map",
        }
    }
}

/// Formats like Go's `%v`, which the reference's messages use.
impl fmt::Display for Yaml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Null => f.write_str("<nil>"),
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x}"),
            Self::Str(s) => f.write_str(s),
            Self::Seq(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Self::Map(entries) => {
                f.write_str("map[")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{k}:{v}")?;
                }
                f.write_str("]")
            }
        }
    }
}

impl<'de> Deserialize<'de> for Yaml {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(YamlVisitor)
    }
}

struct YamlVisitor;

impl<'de> Visitor<'de> for YamlVisitor {
    type Value = Yaml;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Yaml, E> {
        Ok(Yaml::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Yaml, E> {
        Ok(Yaml::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Yaml, E> {
        Ok(Yaml::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Yaml, E> {
        Ok(Yaml::Int(v.into()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Yaml, E> {
        Ok(i128::try_from(v).map_or(Yaml::Float(v as f64), Yaml::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Yaml, E> {
        Ok(Yaml::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Yaml, E> {
        Ok(Yaml::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Yaml, E> {
        Ok(Yaml::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Yaml, E> {
        Ok(Yaml::Str(String::from_utf8_lossy(v).into_owned()))
    }
    fn visit_none<E: de::Error>(self) -> Result<Yaml, E> {
        Ok(Yaml::Null)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Yaml, E> {
        Ok(Yaml::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Yaml, D::Error> {
        Yaml::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Yaml, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Yaml::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Yaml, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Yaml::Map(entries))
    }
}
