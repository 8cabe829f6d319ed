//! The connection to the management server: TCP, optionally TLS (mutual, with a
//! server name to verify), HTTP/2 for gRPC. The TLS files are read at each
//! connection, so a rotated certificate is used on the next one.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use super::XdsTls;
use crate::pem::{certificates, private_key, PemError};

/// Longest wait for TCP, TLS and HTTP/2 to be up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on an idle stream, so that a server that hangs is noticed.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Longest wait for a ping's answer.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the management server could not be reached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The address is not `host:port`.
    #[error("invalid xDS server address {0:?} (expected host:port)")]
    Address(String),
    /// A TLS file could not be used.
    #[error(transparent)]
    File(#[from] PemError),
    /// rustls refused the configuration.
    #[error("xDS TLS: {0}")]
    Tls(String),
    /// TCP, TLS or HTTP/2 failed.
    #[error("connecting to {server}: {source}")]
    Transport {
        /// The server.
        server: String,
        /// Why.
        source: tonic::transport::Error,
    },
}

/// An HTTP/2 channel to `server` (`host:port`, an `http://` or `https://` prefix
/// allowed), over TLS when `tls` is set.
pub(crate) async fn channel(server: &str, tls: Option<&XdsTls>) -> Result<Channel, ConnectError> {
    let authority = server
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    let uri: Uri = format!("http://{authority}")
        .parse()
        .map_err(|_| ConnectError::Address(server.to_owned()))?;
    let host = uri
        .host()
        .ok_or_else(|| ConnectError::Address(server.to_owned()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if uri.port_u16().is_none() {
        return Err(ConnectError::Address(server.to_owned()));
    }
    let tls = match tls {
        Some(tls) => Some(connector(tls, &host)?),
        None => None,
    };
    let endpoint = Endpoint::from(uri)
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let connect = move |uri: Uri| {
        let tls = tls.clone();
        async move {
            let authority = uri.authority().map(ToString::to_string).unwrap_or_default();
            let tcp = TcpStream::connect(authority).await?;
            tcp.set_nodelay(true)?;
            let stream: Box<dyn Io> = match tls {
                Some((connector, name)) => Box::new(connector.connect(name, tcp).await?),
                None => Box::new(tcp),
            };
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    };
    endpoint
        .connect_with_connector(tower::service_fn(connect))
        .await
        .map_err(|source| ConnectError::Transport {
            server: server.to_owned(),
            source,
        })
}

/// A byte stream: TCP or TLS over TCP.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// The TLS connector of `tls` (files read now) and the name the server must carry.
fn connector(
    tls: &XdsTls,
    host: &str,
) -> Result<(TlsConnector, ServerName<'static>), ConnectError> {
    let name = tls.san.as_deref().unwrap_or(host).to_owned();
    let name = ServerName::try_from(name.clone())
        .map_err(|_| ConnectError::Tls(format!("invalid server name {name:?}")))?;
    let mut roots = RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            for cert in certificates(ca)? {
                roots
                    .add(cert)
                    .map_err(|error| ConnectError::Tls(format!("{}: {error}", ca.display())))?;
            }
        }
        None => {
            let (added, _) =
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if added == 0 {
                return Err(ConnectError::Tls(
                    "no system CA certificates (set CONFIG_GRPC_XDS_SERVER_TLS_CACERT)".into(),
                ));
            }
        }
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|error| ConnectError::Tls(error.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|error| ConnectError::Tls(format!("{}: {error}", cert.display())))?,
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(ConnectError::Tls(
                "a client certificate needs its key and a key its certificate \
                 (CONFIG_GRPC_XDS_CLIENT_TLS_CERT, CONFIG_GRPC_XDS_CLIENT_TLS_KEY)"
                    .into(),
            ))
        }
    };
    // gRPC servers require HTTP/2 to be negotiated.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((TlsConnector::from(Arc::new(config)), name))
}
