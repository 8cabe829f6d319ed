//! The gRPC listener's TLS settings and server TLS configuration, re-read from disk when the
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

/// Resolved gRPC TLS settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM certificate chain.
    pub(crate) cert: PathBuf,
    /// PEM private key.
    pub(crate) key: PathBuf,
    /// PEM CA bundle client certificates must chain to (`None`: no client certificate).
    pub(crate) client_ca: Option<PathBuf>,
    /// Allowed client SANs (empty: any certificate from the CA).
    pub client_sans: Vec<String>,
}

/// Why the TLS files could not be used.
pub(crate) use crate::pem::PemError as TlsError;

// === impl TlsSettings ===

impl TlsSettings {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }
}

/// The server TLS configuration, rebuilt when its files change.
pub(crate) struct ReloadingTls {
    settings: TlsSettings,
    files: Reloading<ServerConfig>,
}

// === impl ReloadingTls ===

impl ReloadingTls {
    /// Loads the files once; an error here stops startup.
    pub(crate) fn load(settings: TlsSettings) -> Result<Self, TlsError> {
        let paths = settings.paths().map(Path::to_path_buf).collect();
        let files = Reloading::load("gRPC TLS", paths, || build(&settings))?;
        Ok(Self { settings, files })
    }

    /// The configuration for a new connection: re-read first if a file changed. A
    /// change that does not load is logged once and the previous configuration kept.
    pub(crate) fn config(&self) -> Arc<ServerConfig> {
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
