//! Which store keeps the counters, and how to reach Redis: `--store`, the `--redis-*`
//! flags and `--cache-key-prefix`, or the reference's `REDIS_URL`, `REDIS_TYPE`,
//! `REDIS_SOCKET_TYPE`, `REDIS_AUTH`, `REDIS_TLS`, `REDIS_TLS_*` and `CACHE_KEY_PREFIX`.

use std::path::PathBuf;

use super::cli::ServeArgs;
use super::reference::Reference;
use super::{invalid, SettingsError, StoreKind};
use crate::store::redis::client::unix_socket_url;
use crate::store::redis::{RedisMode, RedisOptions, RedisTls};
use crate::store::KeyPrefix;

/// The store kind and the Redis options (used by the Redis kinds only).
pub(crate) fn store(
    args: &ServeArgs,
    env: Reference<'_>,
) -> Result<(StoreKind, RedisOptions), SettingsError> {
    let url = args.redis_url.clone().or_else(|| env.get("REDIS_URL"));
    check_socket_type(args, env, url.as_deref())?;
    let store = match args.store {
        Some(kind) => kind,
        None if url.is_some() => kind_of_reference(env)?,
        None => StoreKind::Memory,
    };
    if store != StoreKind::Memory && url.is_none() {
        return Err(invalid(
            "redis-url",
            "",
            "a Redis store needs --redis-url (or REDIS_URL)",
        ));
    }
    let options = RedisOptions {
        mode: match store {
            StoreKind::RedisCluster => RedisMode::Cluster,
            StoreKind::RedisSentinel => RedisMode::Sentinel,
            _ => RedisMode::Standalone,
        },
        url: url.unwrap_or_default(),
        auth: env.get("REDIS_AUTH").filter(|auth| !auth.is_empty()),
        tls: env.bool("REDIS_TLS")?.unwrap_or(false),
        tls_files: tls_files(args, env)?,
        timeout: args.redis_timeout,
        batch_window: args.redis_batch_window,
        batch_max: args.redis_batch_max,
        queue: args.redis_queue,
        key_prefix: key_prefix(args, env)?,
    };
    Ok((store, options))
}

/// The CA, client certificate and host name check for Redis over TLS: each flag, else
/// the reference's `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`,
/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`.
fn tls_files(args: &ServeArgs, env: Reference<'_>) -> Result<RedisTls, SettingsError> {
    let path = |flag: &Option<PathBuf>, name: &str| {
        flag.clone().or_else(|| {
            env.get(name)
                .filter(|value| !value.is_empty())
                .map(PathBuf::from)
        })
    };
    Ok(RedisTls {
        ca: path(&args.redis_tls_ca, "REDIS_TLS_CACERT"),
        cert: path(&args.redis_tls_cert, "REDIS_TLS_CLIENT_CERT"),
        key: path(&args.redis_tls_key, "REDIS_TLS_CLIENT_KEY"),
        insecure_skip_hostname: args.redis_tls_insecure_skip_hostname
            || env
                .bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")?
                .unwrap_or(false),
    })
}

/// The prefix of every Redis key: the flag, else `CACHE_KEY_PREFIX`, else none.
fn key_prefix(args: &ServeArgs, env: Reference<'_>) -> Result<KeyPrefix, SettingsError> {
    let (name, text) = match &args.cache_key_prefix {
        Some(text) => ("cache-key-prefix", text.clone()),
        None => (
            "CACHE_KEY_PREFIX",
            env.get("CACHE_KEY_PREFIX").unwrap_or_default(),
        ),
    };
    KeyPrefix::new(&text).map_err(|error| invalid(name, &text, &error.to_string()))
}

/// `REDIS_SOCKET_TYPE` must agree with `REDIS_URL`: the reference dials the URL over
/// that network. A flag's URL wins over both.
fn check_socket_type(
    args: &ServeArgs,
    env: Reference<'_>,
    url: Option<&str>,
) -> Result<(), SettingsError> {
    let Some(kind) = env.get("REDIS_SOCKET_TYPE") else {
        return Ok(());
    };
    let url_is_socket = match &args.redis_url {
        Some(_) => None,
        None => url.map(|url| unix_socket_url(url).is_some()),
    };
    match (kind.to_ascii_lowercase().as_str(), url_is_socket) {
        ("unix", Some(false)) => Err(invalid(
            "REDIS_SOCKET_TYPE",
            &kind,
            "unix needs REDIS_URL to be the socket's path",
        )),
        ("tcp", Some(true)) => Err(invalid(
            "REDIS_SOCKET_TYPE",
            &kind,
            "tcp, but REDIS_URL is a Unix socket's path",
        )),
        ("unix" | "tcp", _) => Ok(()),
        _ => Err(invalid("REDIS_SOCKET_TYPE", &kind, "expected tcp or unix")),
    }
}

/// The store kind `REDIS_TYPE` names (with a Redis URL set).
fn kind_of_reference(env: Reference<'_>) -> Result<StoreKind, SettingsError> {
    match env
        .get("REDIS_TYPE")
        .unwrap_or_default()
        .to_ascii_lowercase()
        .as_str()
    {
        "" | "single" => Ok(StoreKind::Redis),
        "cluster" => Ok(StoreKind::RedisCluster),
        "sentinel" => Ok(StoreKind::RedisSentinel),
        other => Err(invalid(
            "REDIS_TYPE",
            other,
            "expected SINGLE, SENTINEL or CLUSTER",
        )),
    }
}
