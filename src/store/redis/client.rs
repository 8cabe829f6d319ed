//! The fred client: configuration from our settings, and fred errors classed into
//! [`StoreError`]s.
//!
//! fred's defaults are wrong for a rate limiter and are all set here: a reconnect policy
//! (forever, with capped exponential backoff, so a Redis outage heals by itself), a
//! command timeout (`--redis-timeout`), and `max_command_attempts = 1`, so a script call
//! that was in flight when a connection dropped is failed, never re-sent (a re-sent
//! charge would count twice). The connection is made in the background: startup never
//! waits for Redis, and calls made while it is down fail with a timeout.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::error::{Error as FredError, ErrorKind};
use fred::prelude::{
    Builder, Client, ClientLike, Config, EventInterface, ReconnectPolicy, Server, ServerConfig,
};
use fred::types::config::{ClusterDiscoveryPolicy, TlsConfig, TlsConnector};
use percent_encoding::percent_decode_str;
use url::{Host, Url};

use super::tls::RedisTls;
use crate::store::{KeyPrefix, StoreError};
use crate::telemetry::Metrics;

/// Which Redis deployment the URL points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisMode {
    /// One node.
    Standalone,
    /// A Redis Cluster; the URL lists seed nodes.
    Cluster,
    /// A primary found through Sentinel.
    Sentinel,
}

/// How to reach Redis. Its `Debug` masks credentials.
#[derive(Clone)]
pub struct RedisOptions {
    /// Deployment kind.
    pub mode: RedisMode,
    /// `redis://[user:pass@]host:port[/db]`, `rediss://` for TLS; comma-separated seeds
    /// for a cluster (bare `host:port` items are accepted). For Sentinel, either a fred
    /// sentinel URL (`?sentinelServiceName=`) or the reference's `name,host:port,...`.
    /// A Unix socket (standalone only): `unix:///path`, `redis+unix:///path`, or a path.
    pub url: String,
    /// Password, or `user:password` (the reference's `REDIS_AUTH`), for URLs without one.
    pub auth: Option<String>,
    /// Use TLS for items without a scheme (the reference's `REDIS_TLS`).
    pub tls: bool,
    /// Trusted CA, client certificate and host name check for TLS connections.
    pub tls_files: RedisTls,
    /// Deadline of one store call.
    pub timeout: Duration,
    /// Longest time the batcher waits for more checks.
    pub batch_window: Duration,
    /// Most checks in one batch.
    pub batch_max: usize,
    /// Most calls waiting for the batcher; beyond it calls fail at once.
    pub queue: usize,
    /// Written before every key (the reference's `CACHE_KEY_PREFIX`).
    pub key_prefix: KeyPrefix,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("mode", &self.mode)
            .field("url", &mask_url(&self.url))
            .field("auth", &self.auth.as_ref().map(|_| "*****"))
            .field("tls", &self.tls)
            .field("tls_files", &self.tls_files)
            .field("timeout", &self.timeout)
            .field("batch_window", &self.batch_window)
            .field("batch_max", &self.batch_max)
            .field("queue", &self.queue)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

/// Most commands waiting in fred's own queue (for example while reconnecting).
pub(crate) const COMMAND_BUFFER: usize = 16_384;

/// Builds and starts (in the background) a client for `config` (from [`config`]), with
/// the settings of `options` that every client shares.
pub(crate) fn connect(mut config: Config, options: &RedisOptions) -> Result<Client, StoreError> {
    // Redis absent at startup: keep retrying in the background instead of giving up
    // after the first attempt (the reference crash-loops there).
    config.fail_fast = false;
    let timeout = options.timeout;
    let client = Builder::from_config(config)
        .with_performance_config(|perf| perf.default_command_timeout = timeout)
        .with_connection_config(|conn| {
            conn.max_command_attempts = 1;
            conn.connection_timeout = Duration::from_secs(2);
            conn.internal_command_timeout = Duration::from_secs(2);
            conn.tcp.nodelay = Some(true);
            // A password or ACL fixed on the server heals without a restart.
            conn.reconnect_on_auth_error = true;
            // fred's own command queue is unbounded by default: bound it (a full queue
            // is a Backpressure error, i.e. the failure mode, never memory growth).
            conn.max_command_buffer_len = COMMAND_BUFFER;
        })
        // Capped at 500 ms so a Redis that comes back is reconnected within half a second.
        // It starts at 1 ms because fred waits the first delay before the first attempt
        // too: with 50 ms, a client made for a new cluster primary could not carry a call
        // for its first 50 ms, and every call in that time timed out.
        .set_policy(ReconnectPolicy::new_exponential(0, 1, 500, 2))
        .build()
        .map_err(|e| StoreError::Protocol(format!("redis configuration: {}", e.details())))?;
    // Spawns the connection task; it retries in the background per the policy.
    let _task = client.connect();
    Ok(client)
}

/// `config` aimed at the one node `server` (a cluster primary), keeping its credentials
/// and TLS settings.
pub(crate) fn node_config(config: &Config, server: Server) -> Config {
    let mut config = config.clone();
    config.server = ServerConfig::Centralized { server };
    config
}

/// The seed nodes of a cluster configuration (empty for other deployments).
pub(crate) fn seeds(config: &Config) -> Vec<Server> {
    match &config.server {
        ServerConfig::Clustered { hosts, .. } => hosts.clone(),
        _ => Vec::new(),
    }
}

/// fred configuration for `options`.
pub(crate) fn config(options: &RedisOptions) -> Result<Config, StoreError> {
    let bad = |reason: &str| StoreError::Protocol(format!("redis url: {reason}"));
    if let Some(url) = unix_socket_url(&options.url) {
        return unix_config(&url, options);
    }
    let items: Vec<&str> = options
        .url
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .collect();
    // The reference's Sentinel form, `service,host:port,host:port`, names no scheme first.
    let (service_name, items) = match items.split_first() {
        Some((name, hosts)) if options.mode == RedisMode::Sentinel && !name.contains("://") => {
            if name.contains(':') || hosts.is_empty() {
                return Err(bad(&format!(
                    "Sentinel takes redis-sentinel://host:26379?sentinelServiceName=NAME \
                     or NAME,host:26379,..., not `{}`",
                    mask_url(&options.url)
                )));
            }
            (Some((*name).to_owned()), hosts)
        }
        _ => (None, items.as_slice()),
    };
    let (scheme, default_port) = match (options.tls, options.mode) {
        (true, RedisMode::Sentinel) => ("rediss", 26379),
        (false, RedisMode::Sentinel) => ("redis", 26379),
        (true, _) => ("rediss", 6379),
        (false, _) => ("redis", 6379),
    };
    // Positions count from 1, and the Sentinel service name is item 1 when given.
    let first_position = 1 + usize::from(service_name.is_some());
    let endpoints = items
        .iter()
        .enumerate()
        .map(|(index, item)| Endpoint::parse(item, first_position + index, scheme, default_port))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Protocol(e.to_string()))?;
    let Some(first) = endpoints.first() else {
        return Err(bad("empty --redis-url"));
    };
    // Every host the URL names: each item's, then its `?node=` ones.
    let hosts = || -> Vec<Server> {
        endpoints
            .iter()
            .flat_map(|e| std::iter::once(e.server()).chain(e.nodes.iter().cloned()))
            .collect()
    };
    let (server, database) = match options.mode {
        RedisMode::Standalone if endpoints.len() > 1 => {
            return Err(bad(&format!(
                "--store redis takes one URL; a comma-separated list is for redis-cluster \
                 or redis-sentinel: `{}`",
                mask_url(&options.url)
            )))
        }
        RedisMode::Standalone => (
            ServerConfig::Centralized {
                server: first.server(),
            },
            first.database,
        ),
        // A cluster has database 0 only.
        RedisMode::Cluster => (
            ServerConfig::Clustered {
                hosts: hosts(),
                policy: ClusterDiscoveryPolicy::default(),
            },
            None,
        ),
        RedisMode::Sentinel => {
            let Some(service_name) = service_name.or_else(|| first.service_name.clone()) else {
                return Err(bad(&format!(
                    "a Sentinel URL needs ?sentinelServiceName=NAME: `{}`",
                    mask_url(&options.url)
                )));
            };
            (
                ServerConfig::Sentinel {
                    hosts: hosts(),
                    service_name,
                },
                first.database,
            )
        }
    };
    let mut config = Config {
        server,
        username: first.username.clone(),
        password: first.password.clone(),
        database,
        ..Config::default()
    };
    if endpoints.iter().any(|e| e.tls) {
        // fred's own TLS settings would trust the system roots only, with no client
        // certificate: ours carry --redis-ca and the client certificate.
        let tls = options
            .tls_files
            .client_config()
            .map_err(|e| StoreError::Protocol(format!("redis tls: {e}")))?;
        config.tls = Some(TlsConfig::from(TlsConnector::from(tls)));
    } else if options.tls_files.is_set() {
        return Err(bad("TLS options need a rediss:// URL (or REDIS_TLS=true)"));
    }
    apply_auth(&mut config, options);
    Ok(config)
}

/// A `--redis-url` item that cannot be used: which, credentials masked, and why.
#[derive(Debug, thiserror::Error)]
#[error("redis url item {position} `{item}`: {problem}")]
pub(crate) struct UrlError {
    /// Its place in the comma-separated list, from 1.
    position: usize,
    /// The item as [`mask_url`] shows it.
    item: String,
    /// What is wrong with it.
    problem: UrlProblem,
}

/// What is wrong with a `--redis-url` item.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum UrlProblem {
    /// Not a URL at all (the item is not shown: it may hold a password anywhere).
    #[error("not a URL ({0})")]
    Syntax(#[from] url::ParseError),
    /// A scheme other than Redis's or Valkey's.
    #[error(
        "scheme `{0}`: use redis:// or rediss:// (TLS), valkey:// or valkeys://, \
         optionally with -cluster or -sentinel"
    )]
    Scheme(String),
    /// No host between `//` and the port, path or query.
    #[error("no host")]
    NoHost,
    /// A host that is neither an IP address nor a host name.
    #[error("host `{0}` is neither an IP address nor a host name")]
    Host(String),
    /// A path other than `/` and `/N` with N from 0 to 255.
    #[error("database `{0}`: want /0 to /255")]
    Database(String),
    /// The user name or password, percent-decoded, is not UTF-8.
    #[error("the {0} is not UTF-8 once percent-decoded")]
    NotUtf8(&'static str),
}

/// One TCP item of `--redis-url`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Endpoint {
    /// `rediss://` or `valkeys://` (or a bare item under `--redis-tls`).
    tls: bool,
    /// An IP address (IPv6 without its brackets, as Redis itself writes node addresses
    /// and as a TLS server name reads) or a host name.
    host: String,
    /// The item's port, or the mode's default.
    port: u16,
    /// Percent-decoded user name.
    username: Option<String>,
    /// Percent-decoded password.
    password: Option<String>,
    /// `/N`: the database to select.
    database: Option<u8>,
    /// `?sentinelServiceName=`.
    service_name: Option<String>,
    /// `?node=host:port`: more cluster seeds or sentinels.
    nodes: Vec<Server>,
}

impl Endpoint {
    /// Parses `item`, at `position` in the list; a bare `host:port` gets `scheme`, a
    /// missing port `default_port`.
    fn parse(
        item: &str,
        position: usize,
        scheme: &str,
        default_port: u16,
    ) -> Result<Self, UrlError> {
        let (url, _) = parse_item(item, scheme).map_err(|problem| UrlError {
            position,
            item: "*****".into(),
            problem,
        })?;
        Self::from_url(&url, default_port).map_err(|problem| UrlError {
            position,
            item: masked(url),
            problem,
        })
    }

    /// The parts of a parsed item.
    fn from_url(url: &Url, default_port: u16) -> Result<Self, UrlProblem> {
        let base = url
            .scheme()
            .strip_suffix("-cluster")
            .or_else(|| url.scheme().strip_suffix("-sentinel"))
            .unwrap_or(url.scheme());
        let tls = match base {
            "redis" | "valkey" => false,
            "rediss" | "valkeys" => true,
            _ => return Err(UrlProblem::Scheme(url.scheme().to_owned())),
        };
        let (host, port) = host_port(url, default_port)?;
        let database = match url.path().trim_start_matches('/') {
            "" => None,
            db => Some(
                db.parse()
                    .map_err(|_| UrlProblem::Database(db.to_owned()))?,
            ),
        };
        let mut service_name = None;
        let mut nodes = Vec::new();
        // Other parameters are ignored, as fred ignores them.
        for (key, value) in url.query_pairs() {
            match key.as_ref() {
                "sentinelServiceName" => service_name = Some(value.into_owned()),
                "node" => {
                    let (node, _) = parse_item(&value, "redis")?;
                    let (host, port) = host_port(&node, default_port)?;
                    nodes.push(Server::new(host, port));
                }
                _ => {}
            }
        }
        Ok(Self {
            tls,
            host,
            port,
            username: decoded(url.username(), "user name")?,
            password: decoded(url.password().unwrap_or_default(), "password")?,
            database,
            service_name,
            nodes,
        })
    }

    /// The host and port, for fred.
    fn server(&self) -> Server {
        Server::new(self.host.as_str(), self.port)
    }
}

/// `item` parsed as a URL, with `scheme://` put in front of a bare `host:port` (whether
/// it was is the second value).
fn parse_item(item: &str, scheme: &str) -> Result<(Url, bool), UrlProblem> {
    let item = item.trim();
    if item.contains("://") {
        Ok((Url::parse(item)?, false))
    } else {
        Ok((Url::parse(&format!("{scheme}://{item}"))?, true))
    }
}

/// The host fred connects to and the port (`default_port` when the URL names none).
fn host_port(url: &Url, default_port: u16) -> Result<(String, u16), UrlProblem> {
    let host = match url.host() {
        None => return Err(UrlProblem::NoHost),
        Some(Host::Ipv4(ip)) => ip.to_string(),
        Some(Host::Ipv6(ip)) => ip.to_string(),
        // Hosts of non-special schemes such as redis:// are opaque to the url crate:
        // IPv4 addresses come as names.
        Some(Host::Domain(name)) if name.parse::<Ipv4Addr>().is_ok() => name.to_owned(),
        Some(Host::Domain("")) => return Err(UrlProblem::NoHost),
        Some(Host::Domain(name)) => {
            let label = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_');
            let dotted_number = name.chars().all(|c| c.is_ascii_digit() || c == '.');
            if dotted_number || !name.chars().all(|c| label(c) || c == '.') {
                return Err(UrlProblem::Host(name.to_owned()));
            }
            name.to_owned()
        }
    };
    Ok((host, url.port().unwrap_or(default_port)))
}

/// A percent-encoded URL part, decoded; `None` when empty.
fn decoded(part: &str, what: &'static str) -> Result<Option<String>, UrlProblem> {
    let part = percent_decode_str(part)
        .decode_utf8()
        .map_err(|_| UrlProblem::NotUtf8(what))?;
    Ok((!part.is_empty()).then(|| part.into_owned()))
}

/// fred's URL for the Unix domain socket `url` names, if it names one:
/// `unix:///path`, `redis+unix:///path` (or `valkey+unix://`), or a bare absolute path
/// (the reference's `REDIS_SOCKET_TYPE=unix` form).
pub(crate) fn unix_socket_url(url: &str) -> Option<String> {
    let url = url.trim();
    if url.starts_with('/') {
        let mut socket = Url::parse("redis+unix://").ok()?;
        // A bare path is a path, not URL text: a `%` in it is itself.
        socket.set_path(&url.replace('%', "%25"));
        return Some(socket.into());
    }
    let mut socket = Url::parse(url).ok()?;
    match socket.scheme() {
        "redis+unix" | "valkey+unix" => Some(socket.into()),
        "unix" => {
            socket.set_scheme("redis+unix").ok()?;
            Some(socket.into())
        }
        _ => None,
    }
}

/// fred configuration for one Redis server behind the Unix socket `url` (from
/// [`unix_socket_url`]).
fn unix_config(url: &str, options: &RedisOptions) -> Result<Config, StoreError> {
    let bad = |reason: &str| StoreError::Protocol(format!("redis url: {reason}"));
    if options.mode != RedisMode::Standalone {
        return Err(bad(
            "a Unix socket reaches one Redis server: use it with --store redis (REDIS_TYPE=SINGLE)",
        ));
    }
    if options.tls || options.tls_files.is_set() {
        return Err(bad("TLS does not run over a Unix socket"));
    }
    let socket = |url: &Url| -> Result<Config, UrlProblem> {
        let path = percent_decode_str(url.path())
            .decode_utf8()
            .map_err(|_| UrlProblem::NotUtf8("socket path"))?;
        Ok(Config {
            server: ServerConfig::Unix {
                path: path.as_ref().into(),
            },
            username: decoded(url.username(), "user name")?,
            password: decoded(url.password().unwrap_or_default(), "password")?,
            ..Config::default()
        })
    };
    let error = |item, problem| {
        let position = 1;
        StoreError::Protocol(
            UrlError {
                position,
                item,
                problem,
            }
            .to_string(),
        )
    };
    let url = Url::parse(url).map_err(|e| error("*****".into(), e.into()))?;
    let mut config = socket(&url).map_err(|problem| error(masked(url), problem))?;
    apply_auth(&mut config, options);
    Ok(config)
}

/// `REDIS_AUTH` (`password` or `user:password`), where the URL names no password.
fn apply_auth(config: &mut Config, options: &RedisOptions) {
    if config.password.is_none() {
        if let Some(auth) = &options.auth {
            match auth.split_once(':') {
                Some((user, password)) => {
                    config.username = Some(user.to_owned());
                    config.password = Some(password.to_owned());
                }
                None => config.password = Some(auth.clone()),
            }
        }
    }
}

/// Classes a fred error; `timeout` is the deadline that applied.
pub(crate) fn classify(error: &FredError, timeout: Duration) -> StoreError {
    let details = error.details();
    let starts = |prefix: &str| details.starts_with(prefix);
    match error.kind() {
        ErrorKind::Timeout => StoreError::Timeout(timeout),
        // Redis never echoes the password in these replies; fred's details are the reply.
        ErrorKind::Auth => StoreError::Auth(details.to_owned()),
        _ if starts("WRONGPASS") || starts("NOAUTH") => StoreError::Auth(details.to_owned()),
        _ if starts("NOPERM") => StoreError::NoPermission(details.to_owned()),
        _ if starts("OOM") => StoreError::OutOfMemory(details.to_owned()),
        ErrorKind::IO
        | ErrorKind::Canceled
        | ErrorKind::Cluster
        | ErrorKind::Routing
        | ErrorKind::Backpressure
        | ErrorKind::Sentinel
        | ErrorKind::Tls => {
            StoreError::Unavailable(format!("{:?}: {}", error.kind(), error.details()))
        }
        // A redirected (MOVED/ASK) or re-routed call: fred counts it as a second write
        // attempt, which we forbid; it did not run, so it is safe to report as an outage.
        _ if error
            .details()
            .starts_with("Too many failed write attempts") =>
        {
            StoreError::Unavailable(error.details().to_owned())
        }
        _ if is_transient_reply(error.details()) => {
            StoreError::Unavailable(error.details().to_owned())
        }
        _ => StoreError::Protocol(format!("{:?}: {}", error.kind(), error.details())),
    }
}

/// Redis replies that say "not now" rather than "never".
fn is_transient_reply(details: &str) -> bool {
    [
        "LOADING",
        "BUSY",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "MASTERDOWN",
        "READONLY",
        "NOSCRIPT",
    ]
    .iter()
    .any(|prefix| details.starts_with(prefix))
}

/// Whether the error is Redis saying it does not know the script (after a restart or
/// a failover): load it and run it again.
pub(crate) fn is_noscript(error: &FredError) -> bool {
    error.details().starts_with("NOSCRIPT")
}

/// Where a cluster node sent a call that it did not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// `MOVED <slot> <host:port>`: the slot lives on that node now.
    Moved(Server),
    /// `ASK <slot> <host:port>`: the slot is being migrated to that node, which takes the
    /// call only after `ASKING` on the same connection; the slot map is unchanged.
    Ask(Server),
}

/// The redirect in a `MOVED` or `ASK` reply, if the error is one.
pub(crate) fn redirect_of(error: &FredError) -> Option<Redirect> {
    let details = error.details();
    let (kind, rest) = details.split_once(' ')?;
    let mut words = rest.split_whitespace();
    let _slot = words.next()?;
    let (host, port) = words.next()?.rsplit_once(':')?;
    let server = Server::new(host, port.parse().ok()?);
    match kind {
        "MOVED" => Some(Redirect::Moved(server)),
        "ASK" => Some(Redirect::Ask(server)),
        _ => None,
    }
}

/// A URL (or comma-separated URLs) with credentials replaced by `*****`:
/// `redis://foo:bar@redis:6379` → `redis://*****@redis:6379`. An item that is not a URL
/// is `*****` as a whole: where its password is cannot be told.
pub fn mask_url(url: &str) -> String {
    url.split(',')
        .map(|item| {
            let item = item.trim();
            if item.is_empty() || item.starts_with('/') {
                // Nothing, or a socket's path: no credentials.
                return item.to_owned();
            }
            match parse_item(item, "redis") {
                Ok((url, false)) => masked(url),
                Ok((url, true)) => masked(url)
                    .strip_prefix("redis://")
                    .map(str::to_owned)
                    .unwrap_or_default(),
                Err(_) => "*****".to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Logs the client's connection errors (refused, auth, TLS...), once per distinct
/// message per node until it changes or a minute passes, so an outage is visible in the
/// log without flooding it, and counts each in `sluice_store_errors_total{kind}` (a
/// wrong password shows as `auth` there even though calls only time out). Ends when the
/// client is dropped.
pub(crate) fn log_connection_errors(client: &Client, timeout: Duration, metrics: Arc<Metrics>) {
    let last: Arc<Mutex<HashMap<String, (String, Instant)>>> = Arc::default();
    let _task = client.on_error(move |(error, server)| {
        let last = last.clone();
        let metrics = metrics.clone();
        async move {
            let node = server.map_or_else(|| "redis".to_owned(), |server| server.to_string());
            let error = classify(&error, timeout);
            metrics.store_error(error.kind());
            let message = error.to_string();
            let now = Instant::now();
            let mut seen = last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let repeated = seen.get(&node).is_some_and(|(text, at)| {
                *text == message && now.saturating_duration_since(*at) < Duration::from_secs(60)
            });
            if !repeated {
                tracing::warn!(node = %node, error = %message, "redis connection error");
                seen.insert(node, (message, now));
            }
            Ok(())
        }
    });
}

/// `url` with its user name and password replaced by `*****`.
fn masked(mut url: Url) -> String {
    if !url.username().is_empty() || url.password().is_some() {
        // Only a URL without a host refuses credentials, and that one has none.
        let _ = url.set_username("*****");
        let _ = url.set_password(None);
    }
    url.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_credentials() {
        assert_eq!(
            mask_url("redis://foo:bar@redis:6379"),
            "redis://*****@redis:6379"
        );
        assert_eq!(
            mask_url("rediss://u:p@a:1,redis://b:2,c:3"),
            "rediss://*****@a:1,redis://b:2,c:3"
        );
        assert_eq!(mask_url("secret@host:1"), "*****@host:1");
        assert_eq!(mask_url("redis://host:1/0"), "redis://host:1/0");
        assert_eq!(mask_url("redis://u:p@ss@[::1]:1"), "redis://*****@[::1]:1");
        assert_eq!(
            mask_url("mymaster, redis://:pw@s1:26379"),
            "mymaster,redis://*****@s1:26379"
        );
        assert_eq!(
            mask_url("redis+unix://u:pw@x/run/r.sock"),
            "redis+unix://*****@x/run/r.sock"
        );
        assert_eq!(mask_url("/run/r.sock"), "/run/r.sock");
    }

    #[test]
    fn never_shows_the_password_of_a_bad_url() {
        for url in [
            "redis://user:hunter2",
            "redis://user:hunter2@[::1:6379",
            "hunter2@host:port",
            "redis://a:1,redis://u:hunter2@:6379",
        ] {
            let masked = mask_url(url);
            assert!(!masked.contains("hunter2"), "{url} -> {masked}");
            let error = refusal(RedisMode::Cluster, url);
            assert!(error.contains("not a URL"), "{url}: {error}");
            assert!(!error.contains("hunter2"), "{url}: {error}");
        }
        // A URL that parses but is wrong is shown, masked.
        let error = refusal(RedisMode::Standalone, "redis://u:hunter2@h:1/x");
        assert_eq!(
            error,
            "store protocol error: redis url item 1 `redis://*****@h:1/x`: \
             database `x`: want /0 to /255"
        );
    }

    /// Why `config` refuses `url` in `mode` (empty if it does not).
    fn refusal(mode: RedisMode, url: &str) -> String {
        config(&options(mode, url))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    /// Options for `url` in `mode`, nothing else set.
    fn options(mode: RedisMode, url: &str) -> RedisOptions {
        RedisOptions {
            mode,
            url: url.into(),
            auth: None,
            tls: false,
            tls_files: RedisTls::default(),
            timeout: Duration::from_millis(20),
            batch_window: Duration::ZERO,
            batch_max: 128,
            queue: 1024,
            key_prefix: KeyPrefix::default(),
        }
    }

    /// The one server of a standalone configuration.
    fn server_of(config: &Config) -> (String, u16) {
        match &config.server {
            ServerConfig::Centralized { server } => (server.host.to_string(), server.port),
            other => panic!("not standalone: {other:?}"),
        }
    }

    /// The hosts of a cluster or Sentinel configuration, as `host:port`.
    fn hosts_of(config: &Config) -> Vec<String> {
        match &config.server {
            ServerConfig::Clustered { hosts, .. } | ServerConfig::Sentinel { hosts, .. } => hosts
                .iter()
                .map(|s| format!("{}:{}", s.host, s.port))
                .collect(),
            other => panic!("no host list: {other:?}"),
        }
    }

    #[test]
    fn hosts_ports_credentials_and_databases() {
        let standalone = |url: &str| config(&options(RedisMode::Standalone, url)).expect(url);
        let cases = [
            ("redis://10.0.0.1:6380", "10.0.0.1", 6380),
            ("10.0.0.1", "10.0.0.1", 6379),
            // IPv6 without brackets: what the resolver parses and a TLS name reads.
            ("redis://[::1]:6380", "::1", 6380),
            ("[::1]", "::1", 6379),
            ("rediss://[2001:db8::7]:6390/2", "2001:db8::7", 6390),
            (
                "redis://redis-0.redis.svc.cluster.local",
                "redis-0.redis.svc.cluster.local",
                6379,
            ),
            ("my_redis:7000", "my_redis", 7000),
            ("valkey://cache:6379/", "cache", 6379),
        ];
        for (url, host, port) in cases {
            assert_eq!(
                server_of(&standalone(url)),
                (host.to_owned(), port),
                "{url}"
            );
        }
        for (url, user, password) in [
            ("redis://u:p@ss@h:1", Some("u"), "p@ss"),
            ("redis://u:pa:ss@h:1", Some("u"), "pa:ss"),
            ("redis://u:p%40ss@h:1", Some("u"), "p@ss"),
            ("redis://:p%3Ass@h:1", None, "p:ss"),
            ("redis://d%C3%A9v:%F0%9F%94%91@h", Some("dév"), "🔑"),
        ] {
            let config = standalone(url);
            assert_eq!(config.username.as_deref(), user, "{url}");
            assert_eq!(config.password.as_deref(), Some(password), "{url}");
            assert_eq!(server_of(&config).0, "h", "{url}");
        }
        assert_eq!(standalone("redis://h:1/7").database, Some(7));
        assert_eq!(standalone("redis://h:1").database, None);
        assert_eq!(standalone("redis://h:1/").database, None);
    }

    #[test]
    fn bad_urls_are_named_with_the_reason() {
        for (url, reason) in [
            ("http://h:1", "scheme `http`"),
            ("redis://", "no host"),
            ("redis://:6379", "not a URL (empty host)"),
            ("redis://u:p@:6379", "not a URL (empty host)"),
            ("redis://h:99999", "not a URL (invalid port number)"),
            ("redis://[::1:6379", "not a URL (invalid IPv6 address)"),
            ("redis://h:1/256", "database `256`"),
            ("redis://h:1/0/1", "database `0/1`"),
            ("redis://a%20b:1", "host `a%20b`"),
            ("redis://1.2.3.999:1", "host `1.2.3.999`"),
            ("redis://u:%FF@h", "password is not UTF-8"),
            (
                "redis://h:1,h2:2",
                "a comma-separated list is for redis-cluster",
            ),
            ("", "empty --redis-url"),
        ] {
            let error = refusal(RedisMode::Standalone, url);
            assert!(error.contains(reason), "{url}: {error}");
        }
    }

    #[test]
    fn cluster_seeds_in_comma_lists_and_node_parameters() {
        let cluster = |url: &str| config(&options(RedisMode::Cluster, url)).expect(url);
        assert_eq!(
            hosts_of(&cluster(" redis://a:7000 , b:7001,, [::1]:7002 ,c")),
            ["a:7000", "b:7001", "::1:7002", "c:6379"]
        );
        let config = cluster("redis-cluster://u:pw@a:7000?node=b:7001&node=[::1]:7002");
        assert_eq!(hosts_of(&config), ["a:7000", "b:7001", "::1:7002"]);
        assert_eq!(config.password.as_deref(), Some("pw"));
        // A cluster has database 0 only: a path is not selected (as before).
        assert_eq!(cluster("redis://a:7000/3").database, None);
    }

    #[test]
    fn sentinel_forms_of_the_readme() {
        let sentinel = |url: &str| config(&options(RedisMode::Sentinel, url)).expect(url);
        let service = |config: &Config| match &config.server {
            ServerConfig::Sentinel { service_name, .. } => service_name.clone(),
            other => panic!("not sentinel: {other:?}"),
        };
        // fred's form: the service in the query, 26379 by default.
        let config = sentinel("redis-sentinel://:pw@s1?sentinelServiceName=mymaster&node=s2:26380");
        assert_eq!(service(&config), "mymaster");
        assert_eq!(hosts_of(&config), ["s1:26379", "s2:26380"]);
        assert_eq!(config.password.as_deref(), Some("pw"));
        let config = sentinel("redis://s1:26379/2?sentinelServiceName=m");
        assert_eq!(
            (service(&config), config.database),
            ("m".to_owned(), Some(2))
        );
        // The reference's form: the service, then the sentinels.
        let config = sentinel("mymaster, s1:26379, redis://:pw@[::1]:26380/1");
        assert_eq!(service(&config), "mymaster");
        assert_eq!(hosts_of(&config), ["s1:26379", "::1:26380"]);
        for url in ["redis://s1:26379", "mymaster", "s1:26379,s2:26379"] {
            let error = refusal(RedisMode::Sentinel, url);
            assert!(error.contains("sentinelServiceName"), "{url}: {error}");
        }
        let error = refusal(RedisMode::Sentinel, "m, s1:1, redis://s2:1/x");
        assert!(
            error.contains("item 3 `redis://s2:1/x`: database"),
            "{error}"
        );
    }

    #[test]
    fn redirects_are_read_from_moved_and_ask_replies() {
        let moved = FredError::new(ErrorKind::Cluster, "MOVED 3999 127.0.0.1:6381");
        let to = Server::new("127.0.0.1", 6381);
        assert_eq!(redirect_of(&moved), Some(Redirect::Moved(to.clone())));
        let ask = FredError::new(ErrorKind::Cluster, "ASK 3999 127.0.0.1:6381");
        assert_eq!(redirect_of(&ask), Some(Redirect::Ask(to)));
        for other in ["MOVED nonsense", "ASK 1 host:port", "TRYAGAIN x y", "ASK"] {
            let error = FredError::new(ErrorKind::Unknown, other);
            assert_eq!(redirect_of(&error), None, "{other}");
        }
    }

    #[test]
    fn cluster_seeds_and_auth() {
        let options = RedisOptions {
            mode: RedisMode::Cluster,
            url: "a:7000,b:7001".into(),
            auth: Some("user:pw".into()),
            tls: false,
            tls_files: RedisTls::default(),
            timeout: Duration::from_millis(20),
            batch_window: Duration::from_micros(100),
            batch_max: 256,
            queue: 1024,
            key_prefix: KeyPrefix::default(),
        };
        let config = config(&options).expect("config");
        assert_eq!(config.username.as_deref(), Some("user"));
        assert_eq!(config.password.as_deref(), Some("pw"));
        let ServerConfig::Clustered { hosts, .. } = config.server else {
            panic!("not clustered");
        };
        assert_eq!(hosts.len(), 2);
    }

    #[test]
    fn unix_sockets_are_named_by_path_or_scheme() {
        let options = |mode, url: &str| RedisOptions {
            auth: Some("pw".into()),
            ..options(mode, url)
        };
        for url in [
            "/run/redis/redis.sock",
            " unix:///run/redis/redis.sock",
            "redis+unix:///run/redis/redis.sock",
            "valkey+unix:///run/redis/redis.sock",
        ] {
            let config = config(&options(RedisMode::Standalone, url)).expect(url);
            let ServerConfig::Unix { path } = &config.server else {
                panic!("{url}: not a Unix socket: {:?}", config.server);
            };
            assert_eq!(path.to_str(), Some("/run/redis/redis.sock"), "{url}");
            assert_eq!(config.password.as_deref(), Some("pw"), "{url}");
        }
        let credentials = config(&options(
            RedisMode::Standalone,
            "redis+unix://u:p%40ss@localhost/run/my%20redis.sock",
        ))
        .expect("credentials in a socket URL");
        assert!(matches!(
            &credentials.server,
            ServerConfig::Unix { path } if path.to_str() == Some("/run/my redis.sock")
        ));
        assert_eq!(credentials.username.as_deref(), Some("u"));
        assert_eq!(credentials.password.as_deref(), Some("p@ss"));
        let bare = config(&options(RedisMode::Standalone, "/run/100%25 redis?.sock"));
        assert!(matches!(
            &bare.expect("a bare path").server,
            ServerConfig::Unix { path } if path.to_str() == Some("/run/100%25 redis?.sock")
        ));
        assert_eq!(unix_socket_url("redis://a:6379"), None);
        assert_eq!(unix_socket_url("a:6379"), None);
        for (mode, url) in [
            (RedisMode::Cluster, "/run/r.sock"),
            (RedisMode::Sentinel, "unix:///run/r.sock"),
        ] {
            let error = config(&options(mode, url)).err().map(|e| e.to_string());
            let error = error.unwrap_or_default();
            assert!(
                error.contains("Unix socket") && error.contains("--store redis"),
                "{error}"
            );
        }
        let mut tls = options(RedisMode::Standalone, "/run/r.sock");
        tls.tls = true;
        let error = config(&tls)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("TLS"), "{error}");
    }

    #[test]
    fn tls_options_need_a_tls_url() {
        let mut options = RedisOptions {
            mode: RedisMode::Standalone,
            url: "redis://a:6379".into(),
            auth: None,
            tls: false,
            tls_files: RedisTls {
                insecure_skip_hostname: true,
                ..RedisTls::default()
            },
            timeout: Duration::from_millis(20),
            batch_window: Duration::from_micros(100),
            batch_max: 256,
            queue: 1024,
            key_prefix: KeyPrefix::default(),
        };
        let error = config(&options)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("rediss://"), "{error}");
        options.url = "rediss://a:6379".into();
        options.tls_files = RedisTls::default();
        // No CA given: the system roots (a machine without any fails here, clearly).
        let with_system_roots = config(&options).expect("rediss:// with the system roots");
        assert!(with_system_roots.tls.is_some());
        options.url = "a:6379".into();
        options.tls = true;
        let with_tls_flag = config(&options).expect("--redis-tls with the system roots");
        assert!(with_tls_flag.tls.is_some());
    }
}
