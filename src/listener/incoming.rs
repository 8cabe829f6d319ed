//! A lane's stream of ready connections (plaintext, or TLS-handshaken) that tonic
//! serves: the sockets the dealer accepted ([`super::lanes`]), each registered with the
//! lane's runtime and prepared in a task of its own, bounded by a timeout. With a
//! connection age, each connection also has a reaper that shuts its socket down once
//! the age and its grace are over, whatever the calls in flight (tonic's own forced
//! close at that point skips the graceful GOAWAY, so it is not used).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
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

/// A connection as tonic serves it: the stream, and the reaper's signal that it ended.
pub(crate) struct ServedIo {
    io: GrpcIo,
    /// Dropped with the connection, which lets its reaper (if any) go at once.
    _ended: Option<oneshot::Sender<()>>,
}

/// Connections ready to serve; dropping it stops taking dealt connections.
pub(crate) struct Incoming {
    ready: mpsc::Receiver<ServedIo>,
    acceptor: JoinHandle<()>,
}

/// Connections accepted elsewhere (see [`super::lanes`]) and sent here as standard
/// sockets: each is registered with this runtime, then prepared (with `tls`, handshaken
/// under the certificates in force at that moment) before it is handed over. With
/// `close_after`, each connection's socket is shut down that long after it is accepted.
pub(crate) fn incoming_dealt(
    mut dealt: mpsc::Receiver<std::net::TcpStream>,
    tls: Option<Arc<ReloadingTls>>,
    close_after: Option<Duration>,
) -> Incoming {
    let (ready_tx, ready) = mpsc::channel(READY_QUEUE);
    let acceptor = tokio::spawn(async move {
        while let Some(stream) = dealt.recv().await {
            if ready_tx.is_closed() {
                return;
            }
            match TcpStream::from_std(stream) {
                Ok(stream) => hand_over(stream, tls.clone(), close_after, ready_tx.clone()),
                Err(error) => tracing::warn!(%error, "gRPC connection not registered"),
            }
        }
    });
    Incoming { ready, acceptor }
}

/// Prepares `stream` in a task of its own, under [`HANDSHAKE_TIMEOUT`], then puts it
/// on `ready`, with a reaper when `close_after` is set.
fn hand_over(
    stream: TcpStream,
    tls: Option<Arc<ReloadingTls>>,
    close_after: Option<Duration>,
    ready: mpsc::Sender<ServedIo>,
) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "unknown".to_owned(), |addr| addr.to_string());
    let reaper = close_after.and_then(|after| reaper(&stream, after));
    tokio::spawn(async move {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, prepare(stream, tls)).await {
            Ok(Ok(io)) => {
                let _ = ready.send(ServedIo { io, _ended: reaper }).await;
            }
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "gRPC connection refused");
            }
            Err(_) => tracing::debug!(%peer, "gRPC connection idle before handshake; closed"),
        }
    });
}

/// Shuts `stream`'s socket down `after` from now unless the connection ends first
/// (the returned sender is dropped). It holds a duplicate of the socket's descriptor,
/// which `shutdown` acts through, and lets it go as soon as the connection ends, so a
/// connection closed early is closed for the peer at once.
fn reaper(stream: &TcpStream, after: Duration) -> Option<oneshot::Sender<()>> {
    use std::os::fd::AsFd;
    let duplicate = match stream.as_fd().try_clone_to_owned() {
        Ok(fd) => std::net::TcpStream::from(fd),
        Err(error) => {
            tracing::warn!(%error, "gRPC connection age not enforced on this connection");
            return None;
        }
    };
    let (ended, mut ended_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(after) => {
                tracing::debug!("gRPC connection past its age and grace; closed");
                let _ = duplicate.shutdown(std::net::Shutdown::Both);
            }
            _ = &mut ended_rx => {}
        }
    });
    Some(ended)
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
    type Item = Result<ServedIo, io::Error>;

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

impl Connected for ServedIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.tcp().connect_info()
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

// === impl ServedIo ===

impl AsyncRead for ServedIo {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServedIo {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    #[inline]
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
