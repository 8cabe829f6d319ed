//! Rules pushed over xDS: an aggregated discovery stream (state of the world) to a
//! management server such as Envoy Gateway, for `RateLimitConfig` resources, as the
//! reference's `CONFIG_TYPE=GRPC_XDS_SOTW` provider.
//!
//! Each response is the whole rule set: its resources become rule files
//! ([`resource`]) and are loaded into the live rules exactly as files are (one
//! validation, the same merge rules, counters kept for unchanged rules). A response that
//! loads is ACKed with its version and nonce; one that does not is NACKed with the
//! reason, and the previous rules keep serving. Disconnected, the last good rules keep
//! serving and the client reconnects with [`backoff`].

pub(crate) mod backoff;
mod client;
mod connect;
pub(crate) mod resource;
mod state;

use std::path::PathBuf;
use std::time::Duration;

pub(crate) use backoff::Backoff;
pub(crate) use client::XdsClient;
pub use resource::TYPE_URL;
pub(crate) use state::XdsState;

/// How to reach the management server and what to tell it.
#[derive(Clone, Debug, PartialEq)]
pub struct XdsSettings {
    /// `host:port` of the management server (`CONFIG_GRPC_XDS_SERVER_URL`).
    pub server: String,
    /// The node id the server keys its snapshots by (`CONFIG_GRPC_XDS_NODE_ID`).
    pub(crate) node_id: String,
    /// Node metadata, string values (`CONFIG_GRPC_XDS_NODE_METADATA`).
    pub(crate) node_metadata: Vec<(String, String)>,
    /// Headers sent with the stream (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`).
    pub(crate) headers: Vec<(String, String)>,
    /// TLS to the server (`None`: plaintext).
    pub(crate) tls: Option<XdsTls>,
    /// Wait after a connection attempt fails, spread by ±50 %
    /// (`CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`, default 3 s).
    pub(crate) connect_retry: Duration,
    /// Waits before opening a stream again after one ends or fails.
    pub(crate) backoff: Backoff,
    /// Ready before the first configuration arrives
    /// (`FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub(crate) force_start: bool,
}

/// TLS to the management server. The files are read at each connection, so rotated
/// certificates are used on the next one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct XdsTls {
    /// PEM CA bundle the server's certificate must chain to (`None`: system roots).
    pub(crate) ca: Option<PathBuf>,
    /// PEM client certificate chain (mutual TLS).
    pub(crate) cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub(crate) key: Option<PathBuf>,
    /// Name the server's certificate must carry (`None`: the host of the URL).
    pub(crate) san: Option<String>,
}
