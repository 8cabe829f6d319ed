//! Client certificate verification: chain to the configured CA (rustls' WebPKI
//! verifier), then, when an allow-list is set, a DNS or IP subject alternative name
//! from that list (the reference's `GRPC_CLIENT_TLS_SAN`, as a list).

use std::sync::Arc;

use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::client::verify_server_name;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme,
};

/// A CA verifier plus a SAN allow-list.
#[derive(Debug)]
pub(crate) struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<ServerName<'static>>,
}

// === impl SanVerifier ===

impl SanVerifier {
    /// Wraps `inner`; `sans` are DNS names or IP addresses (empty: any SAN).
    pub(crate) fn new(inner: Arc<dyn ClientCertVerifier>, sans: &[String]) -> Result<Self, String> {
        let allowed = sans
            .iter()
            .map(|san| {
                ServerName::try_from(san.as_str())
                    .map(|name| name.to_owned())
                    .map_err(|_| format!("client SAN {san:?} is not a DNS name or IP address"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { inner, allowed })
    }
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.allowed.is_empty() {
            return Ok(verified);
        }
        let parsed = ParsedCertificate::try_from(end_entity)?;
        if self
            .allowed
            .iter()
            .any(|name| verify_server_name(&parsed, name).is_ok())
        {
            Ok(verified)
        } else {
            tracing::debug!("client certificate SAN not in the allow-list");
            Err(Error::InvalidCertificate(CertificateError::NotValidForName))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
