//! A lane's stream of ready connections (plaintext, or TLS-handshaken) that tonic
//! serves: the sockets the dealer accepted ([`super::lanes`]), each registered with the
//! lane's runtime and prepared in a task of its own, bounded by a timeout. With a
//! connection age, each connection also carries a deadline: once the age and its grace
//! are over, the connection reads as ended, whatever the calls in flight, so tonic
//! drops it and its socket closes (tonic's own forced close at that
//! point skips the graceful GOAWAY, so it is not used). The deadline is a timer polled
//! by the connection's own task: no second task and no second descriptor per
//! connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};
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

/// A connection as tonic serves it: the stream, and when it is closed whatever its
/// calls (with a connection age).
pub(crate) struct ServedIo {
    io: GrpcIo,
    /// Fires when the connection's age and grace are over; from then on the connection
    /// reads as ended and writes fail.
    close_at: Option<Pin<Box<Sleep>>>,
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
/// on `ready`, to be closed `close_after` from now when that is set.
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
    let close_at = close_after.map(|after| Instant::now() + after);
    tokio::spawn(async move {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, prepare(stream, tls)).await {
            Ok(Ok(io)) => {
                let close_at = close_at.map(|at| Box::pin(tokio::time::sleep_until(at)));
                let _ = ready.send(ServedIo { io, close_at }).await;
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

impl ServedIo {
    /// Whether the connection's age and grace are over (registers the caller's waker
    /// otherwise, so the connection's task wakes when they are).
    fn past_age(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(close_at) = self.close_at.as_mut() else {
            return false;
        };
        if close_at.as_mut().poll(cx).is_pending() {
            return false;
        }
        tracing::debug!("gRPC connection past its age and grace; closed");
        true
    }
}

impl AsyncRead for ServedIo {
    /// Reads; once the connection is past its age and grace, a read that would wait
    /// reads as the end of the stream instead, which ends the connection. (The deadline
    /// is looked at only then, so reads with data pay nothing for it.)
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending if this.past_age(cx) => Poll::Ready(Ok(())),
            read => read,
        }
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
