//! Which store keeps the counters, and how to reach Redis: `--store` and the
//! `--redis-*` flags, or the reference's `REDIS_URL`, `REDIS_TYPE`, `REDIS_SOCKET_TYPE`,
//! `REDIS_AUTH` and `REDIS_TLS`.

use super::cli::ServeArgs;
use super::reference::Reference;
use super::{invalid, SettingsError, StoreKind};
use crate::store::redis::client::unix_socket_url;
use crate::store::redis::{RedisMode, RedisOptions, RedisTls};

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
        tls_files: RedisTls {
            ca: args.redis_tls_ca.clone(),
            cert: args.redis_tls_cert.clone(),
            key: args.redis_tls_key.clone(),
            insecure_skip_hostname: args.redis_tls_insecure_skip_hostname,
        },
        timeout: args.redis_timeout,
        batch_window: args.redis_batch_window,
        batch_max: args.redis_batch_max,
        queue: args.redis_queue,
    };
    Ok((store, options))
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
