//! TLS to Redis (`rediss://`): the rustls client configuration handed to fred.
//!
//! Server certificates are checked against `--redis-tls-ca` (a PEM bundle) or, without
//! it, the system roots; the host name of the URL must match the certificate unless
//! `--redis-tls-insecure-skip-hostname` is set (the chain is still verified then). A
//! client certificate (`--redis-tls-cert`, `--redis-tls-key`) is presented for Redis's
//! `tls-auth-clients`. The files are read at startup, and again at the first handshake
//! (a new connection) after one changes, so a rotated CA bundle or client certificate is
//! used on reconnection without a restart; errors name the file, never its content (a
//! key is never logged).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::{ResolvesClientCert, WebPkiServerVerifier};

use crate::pem::{certificates, invalid, private_key, PemError};
use crate::reloading::Reloading;
use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error as RustlsError, RootCertStore,
    SignatureScheme,
};

/// TLS files and checks for connections to Redis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM CA bundle to trust (`None`: the system roots).
    pub(crate) ca: Option<PathBuf>,
    /// PEM client certificate chain (mutual TLS).
    pub(crate) cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub(crate) key: Option<PathBuf>,
    /// Accept a server certificate whose names do not match the URL host (the chain is
    /// still verified). Off by default.
    pub(crate) insecure_skip_hostname: bool,
}

/// A Redis TLS file that could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RedisTlsError {
    /// A certificate or key file could not be used.
    #[error(transparent)]
    File(#[from] PemError),
    /// No root certificate to trust.
    #[error("no trusted roots: {0}")]
    NoRoots(String),
}

// === impl RedisTls ===

impl RedisTls {
    /// Whether any TLS option differs from the defaults.
    pub(crate) fn is_set(&self) -> bool {
        self.ca.is_some()
            || self.cert.is_some()
            || self.key.is_some()
            || self.insecure_skip_hostname
    }

    /// The rustls client configuration for these settings. The CA bundle and the client
    /// certificate are read again at the first handshake after their files change
    /// (rotation without a restart, see [`crate::reloading`]).
    pub(crate) fn client_config(&self) -> Result<ClientConfig, RedisTlsError> {
        let provider = Arc::new(ring::default_provider());
        let verifier = ReloadingVerifier::load(self.clone(), provider.clone())?;
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| RedisTlsError::NoRoots(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let resolver = ReloadingClientCert::load(cert.clone(), key.clone(), provider)?;
                Ok(builder.with_client_cert_resolver(Arc::new(resolver)))
            }
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), None) => {
                Err(invalid(cert, "--redis-tls-cert needs --redis-tls-key").into())
            }
            (None, Some(key)) => Err(invalid(key, "--redis-tls-key needs --redis-tls-cert").into()),
        }
    }

    /// The WebPKI verifier of the CA file as it is now.
    fn verifier(
        &self,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Arc<WebPkiServerVerifier>, RedisTlsError> {
        let roots = Arc::new(self.roots()?);
        WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| RedisTlsError::NoRoots(e.to_string()))
    }

    /// The CA bundle, or the system roots.
    fn roots(&self) -> Result<RootCertStore, RedisTlsError> {
        let mut roots = RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                for cert in certificates(ca)? {
                    roots.add(cert).map_err(|e| invalid(ca, e))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(native.certs);
                if added == 0 {
                    let reason = native
                        .errors
                        .first()
                        .map_or_else(|| "no system CA certificates".to_owned(), |e| e.to_string());
                    return Err(RedisTlsError::NoRoots(format!(
                        "{reason} (give --redis-tls-ca)"
                    )));
                }
            }
        }
        Ok(roots)
    }
}

/// Verifies server certificates like rustls's WebPKI verifier, against the CA bundle
/// as it is on disk; with `insecure_skip_hostname`, a name mismatch is accepted (the
/// chain is still verified).
#[derive(Debug)]
struct ReloadingVerifier {
    /// The settings it is built from.
    tls: RedisTls,
    /// The signature algorithms.
    provider: Arc<CryptoProvider>,
    /// The verifier of the current CA bundle.
    files: Reloading<Arc<WebPkiServerVerifier>>,
}

// === impl ReloadingVerifier ===

impl ReloadingVerifier {
    fn load(tls: RedisTls, provider: Arc<CryptoProvider>) -> Result<Self, RedisTlsError> {
        let paths = tls.ca.iter().cloned().collect();
        let files = Reloading::load("Redis TLS CA", paths, || tls.verifier(&provider))?;
        Ok(Self {
            tls,
            provider,
            files,
        })
    }
}

impl ServerCertVerifier for ReloadingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, RustlsError> {
        // Once per handshake: the moment to see a rotated CA bundle.
        let current = self.files.get(|| self.tls.verifier(&self.provider));
        match current.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // webpki checks the chain before the name: a name error means the chain is good.
            Err(RustlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.tls.insecure_skip_hostname => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        self.files
            .current()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        self.files
            .current()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.files.current().supported_verify_schemes()
    }
}

/// The client certificate and key as they are on disk.
#[derive(Debug)]
struct ReloadingClientCert {
    /// PEM certificate chain.
    cert: PathBuf,
    /// PEM private key.
    key: PathBuf,
    /// Loads the key.
    provider: Arc<CryptoProvider>,
    /// The current pair.
    files: Reloading<CertifiedKey>,
}

// === impl ReloadingClientCert ===

impl ReloadingClientCert {
    fn load(
        cert: PathBuf,
        key: PathBuf,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, RedisTlsError> {
        let paths = vec![cert.clone(), key.clone()];
        let files = Reloading::load("Redis TLS client certificate", paths, || {
            certified_key(&cert, &key, &provider)
        })?;
        Ok(Self {
            cert,
            key,
            provider,
            files,
        })
    }
}

impl ResolvesClientCert for ReloadingClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(
            self.files
                .get(|| certified_key(&self.cert, &self.key, &self.provider)),
        )
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The chain in `cert` with the key in `key`, which must match it.
fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, RedisTlsError> {
    let chain = certificates(cert)?;
    let key_der = private_key(key)?;
    CertifiedKey::from_der(chain, key_der, provider).map_err(|e| invalid(key, e).into())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    fn error_of(tls: &RedisTls) -> String {
        tls.client_config()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn valid_files_build_a_config() {
        let dir = tempfile::tempdir().expect("dir");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["sluice".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let tls = RedisTls {
            ca: Some(write(dir.path(), "ca.pem", &cert.pem())),
            cert: Some(write(dir.path(), "c.pem", &cert.pem())),
            key: Some(write(dir.path(), "k.pem", &key.serialize_pem())),
            insecure_skip_hostname: true,
        };
        assert!(tls.client_config().is_ok(), "{}", error_of(&tls));
    }

    #[test]
    fn bad_files_name_the_file_not_its_content() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("missing.pem");
        let garbage = write(dir.path(), "garbage.pem", "SECRET-KEY-MATERIAL");
        let tls = RedisTls {
            ca: Some(missing.clone()),
            ..RedisTls::default()
        };
        let message = error_of(&tls);
        assert!(
            message.starts_with(&format!("reading {}", missing.display())),
            "{message}"
        );
        let tls = RedisTls {
            ca: Some(garbage.clone()),
            ..RedisTls::default()
        };
        let message = error_of(&tls);
        assert!(message.contains("no PEM certificate"), "{message}");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["sluice".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let ca = write(dir.path(), "ca.pem", &cert.pem());
        let tls = RedisTls {
            ca: Some(ca.clone()),
            cert: Some(ca.clone()),
            key: Some(garbage.clone()),
            insecure_skip_hostname: false,
        };
        let message = error_of(&tls);
        assert!(message.contains("garbage.pem"), "{message}");
        assert!(!message.contains("SECRET"), "key content in {message}");
        let tls = RedisTls {
            ca: Some(ca.clone()),
            cert: Some(ca),
            ..RedisTls::default()
        };
        assert!(error_of(&tls).contains("needs --redis-tls-key"));
    }
}
