//! A lane's stream of ready connections (plaintext, or TLS-handshaken) that tonic
//! serves: the sockets the dealer accepted ([`super::lanes`]), each registered with the
//! lane's runtime and prepared in a task of its own, bounded by a timeout.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::tls::ReloadingTls;
use super::HANDSHAKE_TIMEOUT;

/// Ready connections waiting for tonic; past this, taking dealt connections waits.
const READY_QUEUE: usize = 1024;

/// One accepted gRPC connection.
pub(crate) enum GrpcIo {
    /// Plaintext HTTP/2.
    Plain(TcpStream),
    /// HTTP/2 over TLS.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// Connections ready to serve; dropping it stops taking dealt connections.
pub(crate) struct Incoming {
    ready: mpsc::Receiver<GrpcIo>,
    acceptor: JoinHandle<()>,
}

/// Connections accepted elsewhere (see [`super::lanes`]) and sent here as standard
/// sockets: each is registered with this runtime, then prepared (with `tls`, handshaken
/// under the certificates in force at that moment) before it is handed over.
pub(crate) fn incoming_dealt(
    mut dealt: mpsc::Receiver<std::net::TcpStream>,
    tls: Option<Arc<ReloadingTls>>,
) -> Incoming {
    let (ready_tx, ready) = mpsc::channel(READY_QUEUE);
    let acceptor = tokio::spawn(async move {
        while let Some(stream) = dealt.recv().await {
            if ready_tx.is_closed() {
                return;
            }
            match TcpStream::from_std(stream) {
                Ok(stream) => hand_over(stream, tls.clone(), ready_tx.clone()),
                Err(error) => tracing::warn!(%error, "gRPC connection not registered"),
            }
        }
    });
    Incoming { ready, acceptor }
}

/// Prepares `stream` in a task of its own, under [`HANDSHAKE_TIMEOUT`], then puts it
/// on `ready`.
fn hand_over(stream: TcpStream, tls: Option<Arc<ReloadingTls>>, ready: mpsc::Sender<GrpcIo>) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "unknown".to_owned(), |addr| addr.to_string());
    tokio::spawn(async move {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, prepare(stream, tls)).await {
            Ok(Ok(io)) => {
                let _ = ready.send(io).await;
            }
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "gRPC connection refused");
            }
            Err(_) => tracing::debug!(%peer, "gRPC connection idle before handshake; closed"),
        }
    });
}

/// Waits for the client's first bytes (plaintext) or completes the TLS handshake.
async fn prepare(stream: TcpStream, tls: Option<Arc<ReloadingTls>>) -> io::Result<GrpcIo> {
    match tls {
        None => {
            // Data (or EOF): `readable()` alone may wake spuriously.
            stream.peek(&mut [0u8; 1]).await?;
            Ok(GrpcIo::Plain(stream))
        }
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
            let stream = acceptor.accept(stream).await?;
            Ok(GrpcIo::Tls(Box::new(stream)))
        }
    }
}

// === impl Incoming ===

impl Stream for Incoming {
    type Item = Result<GrpcIo, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.ready.poll_recv(cx).map(|io| io.map(Ok))
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

// === impl GrpcIo ===

impl GrpcIo {
    fn tcp(&self) -> &TcpStream {
        match self {
            GrpcIo::Plain(stream) => stream,
            GrpcIo::Tls(stream) => stream.get_ref().0,
        }
    }
}

impl Connected for GrpcIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp().connect_info()
    }
}

impl AsyncRead for GrpcIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcIo::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            GrpcIo::Tls(stream) => Pin::new(&mut **stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for GrpcIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            GrpcIo::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            GrpcIo::Tls(stream) => Pin::new(&mut **stream).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            GrpcIo::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            GrpcIo::Tls(stream) => Pin::new(&mut **stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            GrpcIo::Plain(stream) => stream.is_write_vectored(),
            GrpcIo::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcIo::Plain(stream) => Pin::new(stream).poll_flush(cx),
            GrpcIo::Tls(stream) => Pin::new(&mut **stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcIo::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            GrpcIo::Tls(stream) => Pin::new(&mut **stream).poll_shutdown(cx),
        }
    }
}
