//! TLS to PostgreSQL, set by the ledger URL's own parameters as libpq reads them, so a
//! `DATABASE_URL` from a managed database works unchanged:
//!
//! - `sslmode`: `disable` (plain), `prefer` (the default: TLS when the server offers it),
//!   `require` (TLS or no connection), `verify-ca` (TLS, the chain checked against the
//!   roots), `verify-full` (the chain and the host name checked);
//! - `sslrootcert`: a PEM bundle of the roots to trust (`system`, or none: the system's);
//!   with it, `require` checks the chain as `verify-ca` does (libpq's rule);
//! - `sslcert` and `sslkey`: a client certificate and its key (PEM).
//!
//! As in libpq, `prefer` and `require` without `sslrootcert` encrypt without checking
//! who answers; `verify-full` is the mode to use across a network. The files are read at
//! each connection, so a rotated certificate is used on the next one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::crypto::{ring, verify_tls12_signature, verify_tls13_signature};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error as RustlsError, RootCertStore,
    SignatureScheme,
};

use crate::pem::{certificates, private_key, PemError};

/// The URL parameters this module reads (tokio-postgres refuses them).
const TLS_PARAMETERS: [&str; 3] = ["sslrootcert", "sslcert", "sslkey"];

/// Why the ledger URL's TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LedgerTlsError {
    /// `sslmode` has a value libpq does not define.
    #[error("sslmode={0}: want disable, prefer, require, verify-ca or verify-full")]
    UnknownMode(String),
    /// A TLS parameter in a `key=value` connection string (only URLs take them).
    #[error("{0} is read from a postgres:// URL only (write the ledger URL as one)")]
    NotAUrl(&'static str),
    /// `sslcert` without `sslkey`, or the other way round.
    #[error("sslcert and sslkey go together")]
    HalfAPair,
    /// A certificate or key file could not be used.
    #[error(transparent)]
    File(#[from] PemError),
    /// No root certificate to trust.
    #[error("no trusted roots: {0}")]
    NoRoots(String),
}

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// Nothing: the connection is encrypted, the server not authenticated.
    Nothing,
    /// The chain, against the roots.
    Chain,
    /// The chain and the host name.
    ChainAndName,
}

/// The TLS parameters of a ledger URL.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LedgerTls {
    /// What tokio-postgres is given for `sslmode`: `disable`, `prefer` or `require`.
    mode: &'static str,
    check: Check,
    root_cert: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
}

/// A ledger URL split in two: what tokio-postgres parses, and the TLS connector.
pub(crate) struct Connection {
    /// The URL without the parameters read here, `sslmode` as tokio-postgres knows it.
    pub(crate) config: String,
    /// The TLS connector (used unless the mode is `disable`).
    pub(crate) tls: MakeRustlsConnect,
}

/// The connection settings of `url`, its files read now.
pub(crate) fn connection(url: &str) -> Result<Connection, LedgerTlsError> {
    let (config, tls) = split(url)?;
    Ok(Connection {
        config,
        tls: MakeRustlsConnect::new(tls.client_config()?),
    })
}

/// Checks the TLS settings of `url` (its mode, and that its files can be used).
pub(crate) fn check(url: &str) -> Result<(), LedgerTlsError> {
    connection(url).map(|_| ())
}

/// Splits `url` into the text tokio-postgres parses and the TLS parameters.
fn split(url: &str) -> Result<(String, LedgerTls), LedgerTlsError> {
    let Ok(mut parsed) = url::Url::parse(url) else {
        // A `key=value` string: tokio-postgres reads its `sslmode` (disable, prefer,
        // require) and refuses the others; the chain is then not checked.
        if let Some(name) = TLS_PARAMETERS
            .into_iter()
            .find(|name| url.contains(&format!("{name}=")))
        {
            return Err(LedgerTlsError::NotAUrl(name));
        }
        let tls = LedgerTls {
            mode: "prefer",
            check: Check::Nothing,
            root_cert: None,
            client: None,
        };
        return Ok((url.to_owned(), tls));
    };
    let mut mode = "prefer".to_owned();
    let mut root_cert = None;
    let (mut cert, mut key) = (None, None);
    let mut kept = Vec::new();
    for (name, value) in parsed.query_pairs() {
        match &*name {
            "sslmode" => mode = value.into_owned(),
            "sslrootcert" => root_cert = Some(value.into_owned()),
            "sslcert" => cert = Some(PathBuf::from(&*value)),
            "sslkey" => key = Some(PathBuf::from(&*value)),
            _ => kept.push((name.into_owned(), value.into_owned())),
        }
    }
    let root_cert = root_cert.filter(|path| path != "system").map(PathBuf::from);
    let (wire_mode, check) = match mode.as_str() {
        "disable" => ("disable", Check::Nothing),
        "prefer" | "require" if root_cert.is_some() => (static_mode(&mode), Check::Chain),
        "prefer" | "require" => (static_mode(&mode), Check::Nothing),
        "verify-ca" => ("require", Check::Chain),
        "verify-full" => ("require", Check::ChainAndName),
        _ => return Err(LedgerTlsError::UnknownMode(mode)),
    };
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(LedgerTlsError::HalfAPair),
    };
    kept.push(("sslmode".to_owned(), wire_mode.to_owned()));
    parsed.query_pairs_mut().clear().extend_pairs(kept);
    let tls = LedgerTls {
        mode: wire_mode,
        check,
        root_cert,
        client,
    };
    Ok((parsed.into(), tls))
}

/// `prefer` or `require` as a static text.
fn static_mode(mode: &str) -> &'static str {
    if mode == "require" {
        "require"
    } else {
        "prefer"
    }
}

// === impl LedgerTls ===

impl LedgerTls {
    /// The rustls configuration: the server checked as `check` says, and the client
    /// certificate when one is given.
    fn client_config(&self) -> Result<ClientConfig, LedgerTlsError> {
        let provider = Arc::new(ring::default_provider());
        let webpki = match self.check {
            Check::Nothing => None,
            Check::Chain | Check::ChainAndName => {
                let roots = Arc::new(roots(self.root_cert.as_deref())?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|error| LedgerTlsError::NoRoots(error.to_string()))?;
                Some(webpki)
            }
        };
        let verifier = Arc::new(Verifier {
            webpki,
            name: self.check == Check::ChainAndName,
            provider: provider.clone(),
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| LedgerTlsError::NoRoots(error.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        match &self.client {
            Some((cert, key)) => builder
                .with_client_auth_cert(certificates(cert)?, private_key(key)?)
                .map_err(|error| crate::pem::invalid(cert, error).into()),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// The roots in `path`, or the system's.
fn roots(path: Option<&Path>) -> Result<RootCertStore, LedgerTlsError> {
    let mut roots = RootCertStore::empty();
    match path {
        Some(path) => {
            for cert in certificates(path)? {
                roots
                    .add(cert)
                    .map_err(|error| crate::pem::invalid(path, error))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(native.certs);
            if added == 0 {
                return Err(LedgerTlsError::NoRoots(
                    "no system CA certificates (give sslrootcert=FILE in the ledger URL)".into(),
                ));
            }
        }
    }
    Ok(roots)
}

/// Checks the server's certificate as the URL asks: nothing (`webpki` is `None`), the
/// chain, or the chain and the name. The handshake's signatures are always checked, so
/// even unchecked TLS is encrypted to the holder of the certificate's key.
#[derive(Debug)]
struct Verifier {
    webpki: Option<Arc<WebPkiServerVerifier>>,
    name: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, RustlsError> {
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // webpki checks the chain before the name: a name error means the chain is good.
            Err(RustlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.name => Ok(ServerCertVerified::assertion()),
            result => result,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_ok(url: &str) -> (String, LedgerTls) {
        split(url).unwrap_or_else(|error| panic!("{url}: {error}"))
    }

    #[test]
    fn libpq_modes_map_to_what_is_checked() {
        let cases = [
            ("postgres://u@h/db", "prefer", Check::Nothing),
            (
                "postgres://u@h/db?sslmode=disable",
                "disable",
                Check::Nothing,
            ),
            (
                "postgres://u@h/db?sslmode=require",
                "require",
                Check::Nothing,
            ),
            (
                "postgres://u@h/db?sslmode=require&sslrootcert=/ca.pem",
                "require",
                Check::Chain,
            ),
            (
                "postgres://u@h/db?sslmode=verify-ca",
                "require",
                Check::Chain,
            ),
            (
                "postgres://u@h/db?sslmode=verify-full",
                "require",
                Check::ChainAndName,
            ),
            (
                "postgres://u@h/db?sslmode=verify-full&sslrootcert=system",
                "require",
                Check::ChainAndName,
            ),
        ];
        for (url, mode, check) in cases {
            let (_, tls) = split_ok(url);
            assert_eq!((tls.mode, tls.check), (mode, check), "{url}");
        }
    }

    #[test]
    fn tokio_postgres_gets_the_url_without_the_files() {
        let (config, tls) = split_ok(
            "postgres://u:p@h:5433/db?application_name=x&sslmode=verify-full\
             &sslrootcert=/r.pem&sslcert=/c.pem&sslkey=/k.pem",
        );
        assert_eq!(
            config,
            "postgres://u:p@h:5433/db?application_name=x&sslmode=require"
        );
        assert_eq!(tls.root_cert, Some(PathBuf::from("/r.pem")));
        assert_eq!(
            tls.client,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        assert!(config.parse::<tokio_postgres::Config>().is_ok());
    }

    #[test]
    fn bad_settings_are_refused_with_their_reason() {
        let cases = [
            ("postgres://h/db?sslmode=allow-ish", "sslmode=allow-ish"),
            (
                "postgres://h/db?sslcert=/c.pem",
                "sslcert and sslkey go together",
            ),
            ("host=h sslrootcert=/r.pem", "postgres:// URL only"),
            (
                "postgres://h/db?sslmode=verify-full&sslrootcert=/no/such/ca.pem",
                "/no/such/ca.pem",
            ),
        ];
        for (url, reason) in cases {
            let error = check(url).expect_err(url).to_string();
            assert!(error.contains(reason), "{url}: {error}");
        }
    }
}
