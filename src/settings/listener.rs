//! Where `serve` reads rules from and listens: the config path, the gRPC and admin
//! addresses (flags, or the reference's `RUNTIME_*`, `GRPC_HOST`/`GRPC_PORT`,
//! `HOST`/`PORT`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::cli::ServeArgs;
use super::reference::Reference;
use super::{invalid, SettingsError};
use crate::listener::ConnectionAge;

/// The rules path: the flag, else `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`
/// (the last defaulting to `config`), else `config/`.
pub(crate) fn config_path(flag: Option<&PathBuf>, env: Reference<'_>) -> PathBuf {
    if let Some(path) = flag {
        return path.clone();
    }
    match env.get("RUNTIME_ROOT") {
        Some(root) => {
            let mut path = PathBuf::from(root);
            path.push(env.get("RUNTIME_SUBDIRECTORY").unwrap_or_default());
            path.push(
                env.get("RUNTIME_APPDIRECTORY")
                    .unwrap_or_else(|| "config".into()),
            );
            path
        }
        None => PathBuf::from("config/"),
    }
}

/// The gRPC connection age: the flags, else the reference's `GRPC_MAX_CONNECTION_AGE`
/// and `GRPC_MAX_CONNECTION_AGE_GRACE` (Go durations), else 24 h and 1 h as there. An
/// age of 0 turns it off.
pub(crate) fn connection_age(
    args: &ServeArgs,
    env: Reference<'_>,
) -> Result<Option<ConnectionAge>, SettingsError> {
    let max = match args.grpc_max_connection_age {
        Some(age) => age,
        None => env
            .go_duration("GRPC_MAX_CONNECTION_AGE")?
            .unwrap_or(Duration::from_secs(24 * 3600)),
    };
    let grace = match args.grpc_max_connection_age_grace {
        Some(grace) => grace,
        None => env
            .go_duration("GRPC_MAX_CONNECTION_AGE_GRACE")?
            .unwrap_or(Duration::from_secs(3600)),
    };
    Ok((!max.is_zero()).then_some(ConnectionAge { max, grace }))
}

/// The gRPC and admin addresses.
pub(crate) fn addresses(
    args: &ServeArgs,
    env: Reference<'_>,
) -> Result<(SocketAddr, SocketAddr), SettingsError> {
    let grpc = match args.grpc_addr {
        Some(addr) => addr,
        None => host_port(
            env.get("GRPC_HOST"),
            env.get("GRPC_PORT"),
            "GRPC_PORT",
            8081,
        )?,
    };
    let http = match args.http_addr {
        Some(addr) => addr,
        None => host_port(env.get("HOST"), env.get("PORT"), "PORT", 8080)?,
    };
    Ok((grpc, http))
}

/// `host:port` from the reference's separate host and port variables.
fn host_port(
    host: Option<String>,
    port: Option<String>,
    port_name: &str,
    default_port: u16,
) -> Result<SocketAddr, SettingsError> {
    let port = match port {
        Some(text) => text
            .parse::<u16>()
            .map_err(|_| invalid(port_name, &text, "expected a port number"))?,
        None => default_port,
    };
    let host = host.unwrap_or_else(|| "0.0.0.0".into());
    let text = format!("{host}:{port}");
    text.parse()
        .map_err(|_| invalid(port_name, &text, "expected an IP address and port"))
}
