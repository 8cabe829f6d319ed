//! Where rules come from: files, or an xDS management server (`--config-source`, or
//! the reference's `CONFIG_TYPE` with its `CONFIG_GRPC_XDS_*`, `XDS_CLIENT_BACKOFF_*`
//! and `FORCE_START_WITHOUT_INITIAL_CONFIG` variables).

use std::path::PathBuf;
use std::time::Duration;

use super::cli::{ConfigSourceKind, ServeArgs};
use super::reference::Reference;
use super::{invalid, SettingsError};
use crate::xds::{Backoff, XdsSettings, XdsTls};

/// Where `serve` gets its rules.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigSource {
    /// Files at the config path.
    Files,
    /// An xDS management server.
    Xds(Box<XdsSettings>),
}

/// The config source: the flag, else `CONFIG_TYPE` (`FILE` or `GRPC_XDS_SOTW`; any
/// other value is refused, since serving files instead would limit nothing).
pub(crate) fn config_source(
    args: &ServeArgs,
    env: Reference<'_>,
) -> Result<ConfigSource, SettingsError> {
    let kind = match (args.config_source, env.get("CONFIG_TYPE")) {
        (Some(kind), _) => kind,
        (None, None) => ConfigSourceKind::File,
        (None, Some(value)) if value == "FILE" => ConfigSourceKind::File,
        (None, Some(value)) if value == "GRPC_XDS_SOTW" => ConfigSourceKind::Xds,
        (None, Some(other)) => {
            return Err(invalid(
                "CONFIG_TYPE",
                &other,
                "expected FILE or GRPC_XDS_SOTW (Sluice has no other config source)",
            ))
        }
    };
    match kind {
        ConfigSourceKind::File => Ok(ConfigSource::Files),
        ConfigSourceKind::Xds => xds(args, env).map(|xds| ConfigSource::Xds(Box::new(xds))),
    }
}

fn xds(args: &ServeArgs, env: Reference<'_>) -> Result<XdsSettings, SettingsError> {
    let defaults = Backoff::default();
    let backoff = Backoff {
        initial: env
            .go_duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")?
            .unwrap_or(defaults.initial),
        max: env
            .go_duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL")?
            .unwrap_or(defaults.max),
        random_factor: match env.get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
            Some(text) => text
                .parse::<f64>()
                .ok()
                .filter(|factor| (0.0..=1.0).contains(factor))
                .ok_or_else(|| {
                    invalid(
                        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
                        &text,
                        "expected a number from 0 to 1",
                    )
                })?,
            None => defaults.random_factor,
        },
        jitter: env
            .bool("XDS_CLIENT_BACKOFF_JITTER")?
            .unwrap_or(defaults.jitter),
    };
    if backoff.initial.is_zero() || backoff.max < backoff.initial {
        return Err(invalid(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            &format!("{:?}", backoff.max),
            "expected a positive initial interval no longer than the maximum",
        ));
    }
    let connect_retry = env
        .go_duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")?
        .unwrap_or(Duration::from_secs(3));
    if connect_retry.is_zero() {
        return Err(invalid(
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "0",
            "expected a positive duration",
        ));
    }
    let tls = if env.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS")?.unwrap_or(false) {
        let path = |name: &str| env.get(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let tls = XdsTls {
            ca: path("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
            cert: path("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            key: path("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
            san: env
                .get("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
                .filter(|v| !v.is_empty()),
        };
        if tls.cert.is_some() != tls.key.is_some() {
            return Err(invalid(
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                "",
                "a client certificate needs CONFIG_GRPC_XDS_CLIENT_TLS_KEY, and a key its certificate",
            ));
        }
        Some(tls)
    } else {
        None
    };
    let server = args
        .xds_server
        .clone()
        .or_else(|| env.get("CONFIG_GRPC_XDS_SERVER_URL"))
        .unwrap_or_else(|| "localhost:18000".into());
    Ok(XdsSettings {
        server,
        node_id: args
            .xds_node_id
            .clone()
            .or_else(|| env.get("CONFIG_GRPC_XDS_NODE_ID"))
            .unwrap_or_else(|| "default".into()),
        node_metadata: pairs(env, "CONFIG_GRPC_XDS_NODE_METADATA", &[':', '='])?,
        headers: headers(env, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")?,
        tls,
        connect_retry,
        backoff,
        force_start: env
            .bool("FORCE_START_WITHOUT_INITIAL_CONFIG")?
            .unwrap_or(false),
    })
}

/// The headers of variable `name` (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`:
/// `header:value,…`), each a valid gRPC metadata name and value.
fn headers(env: Reference<'_>, name: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let headers = pairs(env, name, &[':'])?;
    for (header, value) in &headers {
        let header = header.to_ascii_lowercase();
        if tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(header.as_bytes())
            .is_err()
            || header.ends_with("-bin")
            || tonic::metadata::MetadataValue::try_from(value.as_str()).is_err()
        {
            return Err(invalid(
                name,
                &format!("{header}:{value}"),
                "not a valid gRPC header",
            ));
        }
    }
    Ok(headers
        .into_iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value))
        .collect())
}

/// A comma-separated list of `key<sep>value` pairs (Go envconfig's map syntax).
fn pairs(
    env: Reference<'_>,
    name: &str,
    separators: &[char],
) -> Result<Vec<(String, String)>, SettingsError> {
    let Some(text) = env.get(name).filter(|text| !text.trim().is_empty()) else {
        return Ok(Vec::new());
    };
    text.split(',')
        .map(|pair| {
            pair.split_once(separators)
                .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
                .filter(|(key, _)| !key.is_empty())
                .ok_or_else(|| invalid(name, pair, "expected key:value pairs separated by commas"))
        })
        .collect()
}
