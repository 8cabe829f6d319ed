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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::error::{Error as FredError, ErrorKind};
use fred::prelude::{
    Builder, Client, ClientLike, Config, EventInterface, ReconnectPolicy, Server, ServerConfig,
};
use fred::types::config::{TlsConfig, TlsConnector};

use super::tls::RedisTls;
use crate::store::StoreError;
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
            .finish()
    }
}

/// Most commands waiting in fred's own queue (for example while reconnecting).
pub const COMMAND_BUFFER: usize = 16_384;

/// Builds and starts (in the background) a client for `config` (from [`config`]), with
/// the settings of `options` that every client shares.
pub fn connect(mut config: Config, options: &RedisOptions) -> Result<Client, StoreError> {
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
pub fn node_config(config: &Config, server: Server) -> Config {
    let mut config = config.clone();
    config.server = ServerConfig::Centralized { server };
    config
}

/// The seed nodes of a cluster configuration (empty for other deployments).
pub fn seeds(config: &Config) -> Vec<Server> {
    match &config.server {
        ServerConfig::Clustered { hosts, .. } => hosts.clone(),
        _ => Vec::new(),
    }
}

/// fred configuration for `options`.
pub fn config(options: &RedisOptions) -> Result<Config, StoreError> {
    let bad = |reason: String| StoreError::Protocol(format!("redis url: {reason}"));
    if let Some(url) = unix_socket_url(&options.url) {
        return unix_config(&url, options);
    }
    let scheme = if options.tls { "rediss" } else { "redis" };
    let items: Vec<String> = options
        .url
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            if item.contains("://") {
                item.to_owned()
            } else {
                format!("{scheme}://{item}")
            }
        })
        .collect();
    // fred would build its own TLS settings from a TLS scheme (system roots only, no
    // client certificate): hand it plain schemes and set ours below.
    let uses_tls = items.iter().any(|item| is_tls_url(item));
    let items: Vec<String> = items.iter().map(|item| plain_scheme(item)).collect();
    let first = items
        .first()
        .ok_or_else(|| bad("empty --redis-url".into()))?;
    let mut config = match options.mode {
        RedisMode::Standalone => Config::from_url_centralized(first),
        RedisMode::Cluster => Config::from_url_clustered(first),
        RedisMode::Sentinel if first.contains("sentinelServiceName") => {
            Config::from_url_sentinel(first)
        }
        RedisMode::Sentinel => {
            // The reference's form: `service,host:port,host:port`.
            let service = options.url.split(',').next().unwrap_or_default().trim();
            let hosts = items[1..]
                .iter()
                .map(|item| parse_host(item))
                .collect::<Result<Vec<_>, _>>()?;
            let mut config = Config::from_url_centralized(items.get(1).unwrap_or(first))
                .map_err(|e| bad(e.details().to_owned()))?;
            config.server = ServerConfig::Sentinel {
                hosts,
                service_name: service.to_owned(),
            };
            Ok(config)
        }
    }
    .map_err(|e| bad(e.details().to_owned()))?;
    if options.mode == RedisMode::Cluster {
        if let ServerConfig::Clustered { hosts, .. } = &mut config.server {
            for item in &items[1..] {
                hosts.push(parse_host(item)?);
            }
        }
    }
    if uses_tls {
        // fred's default trusts the system roots only and offers no client certificate.
        let tls = options
            .tls_files
            .client_config()
            .map_err(|e| StoreError::Protocol(format!("redis tls: {e}")))?;
        config.tls = Some(TlsConfig::from(TlsConnector::from(tls)));
    } else if options.tls_files.is_set() {
        return Err(bad(
            "TLS options need a rediss:// URL (or REDIS_TLS=true)".into()
        ));
    }
    apply_auth(&mut config, options);
    Ok(config)
}

/// fred's URL for the Unix domain socket `url` names, if it names one:
/// `unix:///path`, `redis+unix:///path` (or `valkey+unix://`), or a bare absolute path
/// (the reference's `REDIS_SOCKET_TYPE=unix` form).
pub fn unix_socket_url(url: &str) -> Option<String> {
    let url = url.trim();
    if url.starts_with('/') {
        Some(format!("redis+unix://{url}"))
    } else if let Some(rest) = url.strip_prefix("unix://") {
        Some(format!("redis+unix://{rest}"))
    } else if url.starts_with("redis+unix://") || url.starts_with("valkey+unix://") {
        Some(url.to_owned())
    } else {
        None
    }
}

/// fred configuration for one Redis server behind the Unix socket of `url`.
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
    let mut config = Config::from_url_unix(url).map_err(|e| bad(e.details()))?;
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

/// Whether a URL item asks for TLS (`rediss://`, `rediss-cluster://`, `valkeys://`...).
fn is_tls_url(item: &str) -> bool {
    item.starts_with("rediss") || item.starts_with("valkeys")
}

/// A URL item with its TLS scheme replaced by the plain one.
fn plain_scheme(item: &str) -> String {
    if let Some(rest) = item.strip_prefix("rediss") {
        format!("redis{rest}")
    } else if let Some(rest) = item.strip_prefix("valkeys") {
        format!("valkey{rest}")
    } else {
        item.to_owned()
    }
}

/// `host:port` of a URL item.
fn parse_host(item: &str) -> Result<Server, StoreError> {
    let rest = item.split_once("://").map_or(item, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let rest = rest.split(['/', '?']).next().unwrap_or_default();
    let (host, port) = rest.rsplit_once(':').unwrap_or((rest, "6379"));
    let port = port
        .parse()
        .map_err(|_| StoreError::Protocol(format!("redis url: bad port in {}", mask_url(item))))?;
    Ok(Server::new(host, port))
}

/// Classes a fred error; `timeout` is the deadline that applied.
pub fn classify(error: &FredError, timeout: Duration) -> StoreError {
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
pub fn is_noscript(error: &FredError) -> bool {
    error.details().starts_with("NOSCRIPT")
}

/// Where a cluster node sent a call that it did not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redirect {
    /// `MOVED <slot> <host:port>`: the slot lives on that node now.
    Moved(Server),
    /// `ASK <slot> <host:port>`: the slot is being migrated to that node, which takes the
    /// call only after `ASKING` on the same connection; the slot map is unchanged.
    Ask(Server),
}

/// The redirect in a `MOVED` or `ASK` reply, if the error is one.
pub fn redirect_of(error: &FredError) -> Option<Redirect> {
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
/// `redis://foo:bar@redis:6379` → `redis://*****@redis:6379`.
pub fn mask_url(url: &str) -> String {
    url.split(',')
        .map(|item| match item.rsplit_once('@') {
            Some((before, after)) => {
                let scheme_end = before.find("://").map_or(0, |i| i + 3);
                format!("{}*****@{after}", &before[..scheme_end])
            }
            None => item.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Logs the client's connection errors (refused, auth, TLS...), once per distinct
/// message per node until it changes or a minute passes, so an outage is visible in the
/// log without flooding it, and counts each in `sluice_store_errors_total{kind}` (a
/// wrong password shows as `auth` there even though calls only time out). Ends when the
/// client is dropped.
pub fn log_connection_errors(client: &Client, timeout: Duration, metrics: Arc<Metrics>) {
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
            mode,
            url: url.into(),
            auth: Some("pw".into()),
            tls: false,
            tls_files: RedisTls::default(),
            timeout: Duration::from_millis(20),
            batch_window: Duration::ZERO,
            batch_max: 128,
            queue: 1024,
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
