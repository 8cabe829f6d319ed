//! The gRPC listener: accepting connections (plaintext or TLS with optional client
//! certificates, see [`tls`]) and the HTTP/2 limits every connection gets.
//!
//! Accepting never blocks on one client: each connection's first bytes (plaintext) or
//! TLS handshake are awaited in its own task, under [`HANDSHAKE_TIMEOUT`], so idle or
//! slow sockets cannot hold up others and are closed when the timeout passes.

mod incoming;
pub(crate) mod lanes;
pub(crate) mod tls;
mod verify;

use std::time::Duration;

/// Longest wait for a new connection's first byte (plaintext) or TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most concurrent requests (HTTP/2 streams) on one connection.
pub(crate) const MAX_CONCURRENT_STREAMS: u32 = 1024;
/// Largest header block a client may send (HPACK-decoded), in bytes.
pub(crate) const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Streams a client may open and reset before the server accepts them (the HTTP/2
/// "rapid reset" attack, CVE-2023-44487); past it the connection gets GOAWAY.
pub(crate) const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// Streams the server may reset because of client protocol errors before it closes
/// the connection.
pub(crate) const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 256;
/// HTTP/2 PING interval on idle connections (detects dead peers).
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered before the connection is closed.
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Completes when the stop flag turns true (or its sender is gone).
pub(crate) async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// How long a gRPC connection lives: at `max` (spread by ±10 %) the server sends GOAWAY
/// so that the client reconnects (a long-lived HTTP/2 connection otherwise pins a
/// client to one replica), then waits up to `grace` for the calls in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnectionAge {
    /// Age at which the connection is asked to close.
    pub(crate) max: Duration,
    /// Longest wait after that for the calls in flight.
    pub(crate) grace: Duration,
}

impl ConnectionAge {
    /// Applies the age to `server`, drawing its jitter now (each serving thread draws
    /// its own, so connections dealt to different threads end at different times).
    pub(crate) fn apply(self, server: tonic::transport::Server) -> tonic::transport::Server {
        server.max_connection_age(crate::jitter::spread(self.max, 0.1))
    }

    /// When a connection is closed whatever its calls: the grace after the latest
    /// jittered age.
    pub(crate) fn close_after(self) -> Duration {
        self.max.mul_f64(1.1) + self.grace
    }
}

/// A tonic server builder with Sluice's HTTP/2 limits.
pub(crate) fn hardened_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_BYTES))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// Raises this process's open-file soft limit to its hard limit, so many client
/// connections fit (Go, and so the reference, do this at start). Returns the new limit.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    let (_, hard) = rlimit::Resource::NOFILE.get()?;
    rlimit::increase_nofile_limit(hard)
}
