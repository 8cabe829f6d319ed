//! gRPC TLS settings and the server TLS configuration, re-read from disk when the
//! certificate, key or client CA files change (checked at each new connection, so a
//! rotated certificate is served to the next client without a restart).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};

use super::verify::SanVerifier;
use crate::pem::{certificates, invalid, private_key};
use crate::reloading::Reloading;
use crate::settings::{parse_go_bool, SettingsError};

/// gRPC TLS flags of `sluice serve`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TlsArgs {
    /// Serve gRPC over TLS with this PEM certificate chain [or GRPC_SERVER_TLS_CERT with GRPC_SERVER_USE_TLS].
    #[arg(long, env = "SLUICE_GRPC_TLS_CERT")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of the gRPC certificate [or GRPC_SERVER_TLS_KEY].
    #[arg(long, env = "SLUICE_GRPC_TLS_KEY")]
    pub grpc_tls_key: Option<PathBuf>,
    /// Require client certificates issued by this PEM CA bundle (mTLS) [or GRPC_CLIENT_TLS_CACERT].
    #[arg(long, env = "SLUICE_GRPC_TLS_CLIENT_CA")]
    pub grpc_tls_client_ca: Option<PathBuf>,
    /// Accept only client certificates with one of these DNS or IP SANs (comma list) [or GRPC_CLIENT_TLS_SAN].
    #[arg(long, env = "SLUICE_GRPC_TLS_CLIENT_SAN", value_delimiter = ',')]
    pub grpc_tls_client_san: Vec<String>,
}

/// Resolved gRPC TLS settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle client certificates must chain to (`None`: no client certificate).
    pub client_ca: Option<PathBuf>,
    /// Allowed client SANs (empty: any certificate from the CA).
    pub client_sans: Vec<String>,
}

/// Why the TLS files could not be used.
pub use crate::pem::PemError as TlsError;

// === impl TlsSettings ===

impl TlsSettings {
    /// Flags win; the reference's variables apply when `GRPC_SERVER_USE_TLS` is true.
    /// `None`: plaintext gRPC.
    pub fn resolve(
        args: &TlsArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, SettingsError> {
        let use_tls = match env("GRPC_SERVER_USE_TLS") {
            Some(value) => parse_go_bool("GRPC_SERVER_USE_TLS", &value)?,
            None => false,
        };
        let reference = |name: &str| {
            env(name)
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
            .or_else(|| reference("GRPC_CLIENT_TLS_CACERT"));
        let mut client_sans: Vec<String> = args
            .grpc_tls_client_san
            .iter()
            .map(|san| san.trim().to_owned())
            .filter(|san| !san.is_empty())
            .collect();
        if client_sans.is_empty() && use_tls {
            client_sans = env("GRPC_CLIENT_TLS_SAN")
                .unwrap_or_default()
                .split(',')
                .map(|san| san.trim().to_owned())
                .filter(|san| !san.is_empty())
                .collect();
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
                Ok(Some(Self {
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

    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }
}

/// The server TLS configuration, rebuilt when its files change.
pub struct ReloadingTls {
    settings: TlsSettings,
    files: Reloading<ServerConfig>,
}

// === impl ReloadingTls ===

impl ReloadingTls {
    /// Loads the files once; an error here stops startup.
    pub fn load(settings: TlsSettings) -> Result<Self, TlsError> {
        let paths = settings.paths().map(Path::to_path_buf).collect();
        let files = Reloading::load("gRPC TLS", paths, || build(&settings))?;
        Ok(Self { settings, files })
    }

    /// The configuration for a new connection: re-read first if a file changed. A
    /// change that does not load is logged once and the previous configuration kept.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.files.get(|| build(&self.settings))
    }
}

/// Builds the rustls configuration from the files.
fn build(settings: &TlsSettings) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(ring::default_provider());
    let chain = certificates(&settings.cert)?;
    let key = private_key(&settings.key)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(&settings.cert, e))?;
    let builder = match &settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| invalid(ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| invalid(ca, e))?;
            let verifier = SanVerifier::new(verifier, &settings.client_sans)
                .map_err(|reason| invalid(ca, reason))?;
            builder.with_client_cert_verifier(Arc::new(verifier))
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| invalid(&settings.key, e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
