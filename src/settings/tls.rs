//! gRPC TLS: the `--grpc-tls-*` flags, or the reference's `GRPC_SERVER_*` and
//! `GRPC_CLIENT_TLS_*` variables when `GRPC_SERVER_USE_TLS` is true (and Envoy
//! Gateway's `GRPC_SERVER_TLS_CA_CERT` for the reference's `GRPC_CLIENT_TLS_CACERT`).

use std::path::PathBuf;

use super::cli::TlsArgs;
use super::reference::Reference;
use super::SettingsError;
use crate::listener::tls::TlsSettings;

/// The gRPC TLS settings (`None`: plaintext gRPC). Flags win.
pub(crate) fn grpc_tls(
    args: &TlsArgs,
    env: Reference<'_>,
) -> Result<Option<TlsSettings>, SettingsError> {
    let use_tls = env.bool("GRPC_SERVER_USE_TLS")?.unwrap_or(false);
    let reference = |name: &str| {
        env.get(name)
            .filter(|value| use_tls && !value.is_empty())
            .map(PathBuf::from)
    };
    let cert = args
        .grpc_tls_cert
        .clone()
        .or_else(|| reference("GRPC_SERVER_TLS_CERT"));
    let key = args
        .grpc_tls_key
        .clone()
        .or_else(|| reference("GRPC_SERVER_TLS_KEY"));
    let client_ca = args
        .grpc_tls_client_ca
        .clone()
        .or_else(|| reference("GRPC_CLIENT_TLS_CACERT"))
        .or_else(|| reference("GRPC_SERVER_TLS_CA_CERT"));
    let mut client_sans = san_list(args.grpc_tls_client_san.iter().map(String::as_str));
    if client_sans.is_empty() && use_tls {
        client_sans = san_list(
            env.get("GRPC_CLIENT_TLS_SAN")
                .unwrap_or_default()
                .split(','),
        );
    }
    let fail = |name: &str, reason: &str| SettingsError {
        name: name.to_owned(),
        value: String::new(),
        reason: reason.to_owned(),
    };
    match (cert, key) {
        (Some(cert), Some(key)) => {
            if !client_sans.is_empty() && client_ca.is_none() {
                return Err(fail(
                    "grpc-tls-client-san",
                    "a client SAN allow-list needs --grpc-tls-client-ca",
                ));
            }
            Ok(Some(TlsSettings {
                cert,
                key,
                client_ca,
                client_sans,
            }))
        }
        (None, None) if use_tls => Err(fail(
            "GRPC_SERVER_USE_TLS",
            "TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY",
        )),
        (None, None) if client_ca.is_some() || !client_sans.is_empty() => Err(fail(
            "grpc-tls-client-ca",
            "client certificates need a server certificate (--grpc-tls-cert, --grpc-tls-key)",
        )),
        (None, None) => Ok(None),
        (Some(_), None) => Err(fail("grpc-tls-key", "--grpc-tls-cert needs a key")),
        (None, Some(_)) => Err(fail("grpc-tls-cert", "--grpc-tls-key needs a certificate")),
    }
}

/// The non-empty SANs of a list, trimmed.
fn san_list<'a>(sans: impl Iterator<Item = &'a str>) -> Vec<String> {
    sans.map(str::trim)
        .filter(|san| !san.is_empty())
        .map(str::to_owned)
        .collect()
}
