//! Command-line flags and environment → [`Settings`].
//!
//! Precedence: a flag (or its `SLUICE_*` variable) wins; otherwise the
//! envoyproxy/ratelimit variable that maps to it; otherwise the default. Reference
//! variables without meaning here are accepted and reported once as ignored.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::limiter::LimiterSettings;
use crate::rules::LoadOptions;
use crate::service::{HeaderMode, RequestBounds, ResponseOptions};
use crate::store::redis::{RedisMode, RedisOptions, RedisTls};
use crate::telemetry::LogFormat;

/// Sluice: a global rate limit service for Envoy.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the rate limit service.
    Serve(Box<ServeArgs>),
    /// Validate rule files exactly as `serve` would; print each rule or each error.
    Check(CheckArgs),
    /// Show which rule each descriptor matches and why, without touching any counter.
    Explain(ExplainArgs),
    /// Load-test any RLS server: req/s, latency percentiles, OK/OVER_LIMIT/error counts.
    Bench(Box<crate::bench::BenchArgs>),
    /// Bench only: serve a constant OK over Sluice's gRPC stack (the throughput ceiling).
    #[command(hide = true)]
    BenchServer(BenchServerArgs),
    /// Bench only: memory store bytes per token-bucket key (RSS growth ÷ keys).
    #[command(hide = true)]
    BenchMemory(BenchMemoryArgs),
}

/// Flags of `sluice explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Rules file or directory.
    #[arg(long, env = "SLUICE_CONFIG", default_value = "config/")]
    pub config: PathBuf,
    /// Request domain.
    #[arg(long)]
    pub domain: String,
    /// One descriptor as `key=value,key2=value2` (repeat for several; a value may
    /// contain `=` but not `,`).
    #[arg(long = "descriptor", required = true)]
    pub descriptors: Vec<String>,
    /// Request-level hits addend.
    #[arg(long, default_value_t = 0)]
    pub hits_addend: u32,
    /// Merge files of the same domain (the reference's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
    pub merge_domains: Option<bool>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `sluice bench-server`.
#[derive(Debug, Args)]
pub struct BenchServerArgs {
    /// gRPC listener.
    #[arg(long, default_value = "127.0.0.1:8091")]
    pub grpc_addr: SocketAddr,
    /// Serving threads (one current-thread runtime each) [default: number of cores].
    #[arg(long)]
    pub workers: Option<usize>,
}

/// Flags of `sluice bench-memory`.
#[derive(Debug, Args)]
pub struct BenchMemoryArgs {
    /// Token-bucket keys to insert.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `sluice check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Rule files or directories.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Merge files of the same domain (the reference's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
    pub merge_domains: Option<bool>,
}

/// Flags of `sluice serve`. Options without a default here fall back to the
/// reference's environment variables, then to the documented default.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Rules file or directory [default: config/, or RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY].
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listener (RLS and health) [default: 0.0.0.0:8081, or GRPC_HOST:GRPC_PORT].
    #[arg(long, env = "SLUICE_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// Admin HTTP listener [default: 0.0.0.0:8080, or HOST:PORT].
    #[arg(long, env = "SLUICE_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Counter store [default: memory, or redis when REDIS_URL is set (REDIS_TYPE picks the kind)].
    #[arg(long, env = "SLUICE_STORE", value_enum)]
    pub store: Option<StoreKind>,
    /// Redis URL: `redis://[user:pass@]host:port[/db]`, `rediss://` for TLS; comma-separated seeds for a cluster; `unix:///path` (or the path) for a Unix socket [or REDIS_URL].
    #[arg(long, env = "SLUICE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Deadline of one Redis store call.
    #[arg(long, env = "SLUICE_REDIS_TIMEOUT", value_parser = humantime::parse_duration, default_value = "20ms")]
    pub redis_timeout: Duration,
    /// Longest time the Redis batcher waits for more checks (0: none; a batch takes the
    /// checks queued while its lane was busy).
    #[arg(long, env = "SLUICE_REDIS_BATCH_WINDOW", value_parser = humantime::parse_duration, default_value = "0s")]
    pub redis_batch_window: Duration,
    /// Most checks in one Redis batch.
    #[arg(long, env = "SLUICE_REDIS_BATCH_MAX", default_value_t = 128)]
    pub redis_batch_max: usize,
    /// Most store calls waiting for the Redis batcher; beyond it a call fails at once.
    #[arg(long, env = "SLUICE_REDIS_QUEUE", default_value_t = 16_384)]
    pub redis_queue: usize,
    /// PEM CA bundle trusted for `rediss://` [default: the system roots].
    #[arg(long, env = "SLUICE_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,
    /// PEM client certificate chain presented to Redis (mutual TLS; needs --redis-tls-key).
    #[arg(long, env = "SLUICE_REDIS_TLS_CERT")]
    pub redis_tls_cert: Option<PathBuf>,
    /// PEM private key of --redis-tls-cert.
    #[arg(long, env = "SLUICE_REDIS_TLS_KEY")]
    pub redis_tls_key: Option<PathBuf>,
    /// Accept a Redis certificate whose names do not match the URL host (the chain is
    /// still verified). Host names are checked by default.
    #[arg(long, env = "SLUICE_REDIS_TLS_INSECURE_SKIP_HOSTNAME")]
    pub redis_tls_insecure_skip_hostname: bool,
    /// Sluice instances sharing the store; the `local` failure mode enforces limit / replicas.
    #[arg(long, env = "SLUICE_REPLICAS", default_value_t = 1)]
    pub replicas: u32,
    /// Most limit states the memory store holds before evicting.
    #[arg(long, env = "SLUICE_MEMORY_MAX_KEYS", default_value_t = 1_000_000)]
    pub memory_max_keys: usize,
    /// gRPC serving threads (one current-thread runtime each, connections dealt in turn;
    /// with Redis each has its own batcher and connections) and the main runtime's worker
    /// threads [default: number of cores].
    #[arg(long, env = "SLUICE_WORKERS")]
    pub workers: Option<usize>,
    /// Log format [default: text, or LOG_FORMAT].
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter, e.g. `info` or `sluice=debug` [default: info, or LOG_LEVEL].
    #[arg(long, env = "SLUICE_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Rate limit headers to add [default: none, or reference with LIMIT_RESPONSE_HEADERS_ENABLED].
    #[arg(long, env = "SLUICE_RESPONSE_HEADERS", value_enum)]
    pub response_headers: Option<HeaderMode>,
    /// Merge files of the same domain [default: false, or MERGE_DOMAIN_CONFIG].
    #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
    pub merge_domains: Option<bool>,
    /// Never refuse: report OVER_LIMIT per descriptor but answer OK [or SHADOW_MODE].
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    pub shadow_mode: Option<bool>,
    /// Treat every descriptor as a quota descriptor [or QUOTA_MODE].
    #[arg(long, env = "SLUICE_QUOTA_MODE")]
    pub quota_mode: Option<bool>,
    /// Near-limit threshold as a fraction of the limit [default: 0.8, or NEAR_LIMIT_RATIO].
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO")]
    pub near_limit_ratio: Option<f32>,
    /// Describe the request in dynamic metadata [or RESPONSE_DYNAMIC_METADATA].
    #[arg(long, env = "SLUICE_DYNAMIC_METADATA")]
    pub dynamic_metadata: Option<bool>,
    /// When one descriptor would go over, charge no other descriptor of the request [or STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT].
    #[arg(long, env = "SLUICE_STOP_INCREMENT_WHEN_OVER_LIMIT")]
    pub stop_increment_when_over_limit: Option<bool>,
    /// How often the config path is re-read (content-hash compared) as a backstop to
    /// the file watcher.
    #[arg(long, env = "SLUICE_RELOAD_INTERVAL", value_parser = humantime::parse_duration, default_value = "10s")]
    pub reload_interval: Duration,
    /// OTLP/gRPC collector for traces, e.g. `http://otel-collector:4317` (needs the
    /// `otel` cargo feature) [or OTEL_EXPORTER_OTLP_ENDPOINT].
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// After SIGTERM: time with readiness false before listeners close.
    #[arg(long, env = "SLUICE_DRAIN_DELAY", value_parser = humantime::parse_duration, default_value = "0s")]
    pub drain_delay: Duration,
    /// After SIGTERM: longest wait for in-flight calls.
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub drain_timeout: Duration,
    /// Serve `POST /explain`, `/debug/shadow` and `/debug/hotkeys`, which show descriptor
    /// values (user ids, IPs).
    #[arg(long, env = "SLUICE_DEBUG_ENDPOINTS")]
    pub debug_endpoints: bool,
    /// Most descriptors in one request.
    #[arg(long, env = "SLUICE_MAX_DESCRIPTORS", default_value_t = 64)]
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = 32)]
    pub max_entries: usize,
    /// Longest descriptor key or value, in bytes.
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", default_value_t = 1024)]
    pub max_value_bytes: usize,
    /// Largest gRPC request message, in bytes.
    #[arg(long, env = "SLUICE_MAX_MESSAGE_BYTES", default_value_t = 1 << 20)]
    pub max_message_bytes: usize,
    /// Resolve the settings and validate the rules as `serve` would, print what
    /// `sluice check` prints, then exit (0 when both are valid) without serving.
    /// Used by deployment checks (the Helm chart test) to prove a container's arguments.
    #[arg(long, hide = true)]
    pub check_config_only: bool,
    /// gRPC TLS and mTLS.
    #[command(flatten)]
    pub tls: crate::listener::tls::TlsArgs,
}

/// Where counters live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// In this process's memory (one instance).
    #[default]
    Memory,
    /// One Redis node.
    Redis,
    /// A Redis Cluster (`--redis-url` lists seed nodes).
    RedisCluster,
    /// A Redis primary found through Sentinel.
    RedisSentinel,
}

/// Everything `serve` needs, resolved.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Rules file or directory.
    pub config: PathBuf,
    /// gRPC listener address.
    pub grpc_addr: SocketAddr,
    /// Admin listener address.
    pub http_addr: SocketAddr,
    /// Counter store.
    pub store: StoreKind,
    /// Memory store capacity.
    pub memory_max_keys: usize,
    /// How to reach Redis (used by the Redis store kinds).
    pub redis: RedisOptions,
    /// Worker threads (`None`: one per core).
    pub workers: Option<usize>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
    /// How rule files combine.
    pub load: LoadOptions,
    /// Response shaping.
    pub response: ResponseOptions,
    /// Request semantics of the limiter.
    pub limiter: LimiterSettings,
    /// Request bounds.
    pub bounds: RequestBounds,
    /// Largest gRPC message.
    pub max_message_bytes: usize,
    /// Backstop rescan period.
    pub reload_interval: Duration,
    /// Where traces are exported, if anywhere.
    pub otlp_endpoint: Option<String>,
    /// Readiness-false period before closing listeners.
    pub drain_delay: Duration,
    /// Longest drain.
    pub drain_timeout: Duration,
    /// Serve the endpoints that reveal descriptor values.
    pub debug_endpoints: bool,
    /// Reference variables that were set but mean nothing here.
    pub ignored_env: Vec<String>,
    /// gRPC TLS (`None`: plaintext).
    pub grpc_tls: Option<crate::listener::tls::TlsSettings>,
}

/// A setting that could not be understood.
#[derive(Debug)]
pub struct SettingsError {
    /// Variable or flag name.
    pub name: String,
    /// What was given; empty when the error is about a combination of settings.
    pub value: String,
    /// Why it is wrong.
    pub reason: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.name, self.reason)
        } else {
            write!(
                f,
                "invalid value {:?} for {}: {}",
                self.value, self.name, self.reason
            )
        }
    }
}

impl std::error::Error for SettingsError {}

/// Reference variables accepted and ignored (no meaning for Sluice).
const IGNORED_REFERENCE_ENV: &[&str] = &[
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "GOSTATS_FLUSH_INTERVAL_SECONDS",
    "EXTRA_TAGS",
    "BACKEND_TYPE",
    "CACHE_KEY_PREFIX",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "REDIS_POOL_SIZE",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_SRV",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "RUNTIME_WATCH_ROOT",
    "RUNTIME_IGNOREDOTFILES",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "TRACING_ENABLED",
    "CONFIG_TYPE",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
];

impl Settings {
    /// Resolves `args` against an environment lookup (`std::env::var` in production).
    pub fn resolve(
        args: &ServeArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SettingsError> {
        let reference_bool = |name: &str| -> Result<Option<bool>, SettingsError> {
            env(name)
                .map(|value| parse_go_bool(name, &value))
                .transpose()
        };
        let pick = |flag: Option<bool>, name: &str| -> Result<bool, SettingsError> {
            Ok(match flag {
                Some(value) => value,
                None => reference_bool(name)?.unwrap_or(false),
            })
        };

        let config = match &args.config {
            Some(path) => path.clone(),
            None => match env("RUNTIME_ROOT") {
                Some(root) => {
                    let mut path = PathBuf::from(root);
                    path.push(env("RUNTIME_SUBDIRECTORY").unwrap_or_default());
                    path.push(env("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
                    path
                }
                None => PathBuf::from("config/"),
            },
        };
        let grpc_addr = match args.grpc_addr {
            Some(addr) => addr,
            None => host_port(env("GRPC_HOST"), env("GRPC_PORT"), "GRPC_PORT", 8081)?,
        };
        let http_addr = match args.http_addr {
            Some(addr) => addr,
            None => host_port(env("HOST"), env("PORT"), "PORT", 8080)?,
        };
        let log_format = match args.log_format {
            Some(format) => format,
            None => match env("LOG_FORMAT")
                .as_deref()
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                None | Some("") | Some("text") => LogFormat::Text,
                Some("json") => LogFormat::Json,
                Some(other) => return Err(error("LOG_FORMAT", other, "expected text or json")),
            },
        };
        let log_level = args
            .log_level
            .clone()
            .or_else(|| env("LOG_LEVEL").map(|level| level.to_ascii_lowercase()))
            .unwrap_or_else(|| "info".into());
        let near_limit_ratio = match args.near_limit_ratio {
            Some(ratio) => ratio,
            None => match env("NEAR_LIMIT_RATIO") {
                Some(text) => text
                    .parse()
                    .map_err(|_| error("NEAR_LIMIT_RATIO", &text, "expected a number"))?,
                None => 0.8,
            },
        };
        if !(0.0..=1.0).contains(&near_limit_ratio) {
            return Err(error(
                "near-limit-ratio",
                &near_limit_ratio.to_string(),
                "expected a fraction between 0 and 1",
            ));
        }
        let header_mode = match args.response_headers {
            Some(mode) => mode,
            None if reference_bool("LIMIT_RESPONSE_HEADERS_ENABLED")?.unwrap_or(false) => {
                HeaderMode::Reference
            }
            None => HeaderMode::None,
        };
        let defaults = ResponseOptions::default();
        let response = ResponseOptions {
            global_shadow_mode: pick(args.shadow_mode, "SHADOW_MODE")?,
            global_quota_mode: pick(args.quota_mode, "QUOTA_MODE")?,
            header_mode,
            limit_header: env("LIMIT_LIMIT_HEADER").unwrap_or(defaults.limit_header),
            remaining_header: env("LIMIT_REMAINING_HEADER").unwrap_or(defaults.remaining_header),
            reset_header: env("LIMIT_RESET_HEADER").unwrap_or(defaults.reset_header),
            dynamic_metadata: pick(args.dynamic_metadata, "RESPONSE_DYNAMIC_METADATA")?,
        };
        if let Some(value) = env("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED") {
            parse_go_bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", &value)?;
        }
        let redis_url = args.redis_url.clone().or_else(|| env("REDIS_URL"));
        if let Some(kind) = env("REDIS_SOCKET_TYPE") {
            // The reference dials REDIS_URL over this network; a flag's URL wins over both.
            let url_is_socket = match &args.redis_url {
                Some(_) => None,
                None => redis_url
                    .as_deref()
                    .map(|url| crate::store::redis::client::unix_socket_url(url).is_some()),
            };
            match (kind.to_ascii_lowercase().as_str(), url_is_socket) {
                ("unix", Some(false)) => {
                    return Err(error(
                        "REDIS_SOCKET_TYPE",
                        &kind,
                        "unix needs REDIS_URL to be the socket's path",
                    ))
                }
                ("tcp", Some(true)) => {
                    return Err(error(
                        "REDIS_SOCKET_TYPE",
                        &kind,
                        "tcp, but REDIS_URL is a Unix socket's path",
                    ))
                }
                ("unix" | "tcp", _) => {}
                _ => return Err(error("REDIS_SOCKET_TYPE", &kind, "expected tcp or unix")),
            }
        }
        let store = match args.store {
            Some(kind) => kind,
            None if redis_url.is_some() => match env("REDIS_TYPE")
                .unwrap_or_default()
                .to_ascii_lowercase()
                .as_str()
            {
                "" | "single" => StoreKind::Redis,
                "cluster" => StoreKind::RedisCluster,
                "sentinel" => StoreKind::RedisSentinel,
                other => {
                    return Err(error(
                        "REDIS_TYPE",
                        other,
                        "expected SINGLE, SENTINEL or CLUSTER",
                    ))
                }
            },
            None => StoreKind::Memory,
        };
        if store != StoreKind::Memory && redis_url.is_none() {
            return Err(error(
                "redis-url",
                "",
                "a Redis store needs --redis-url (or REDIS_URL)",
            ));
        }
        let redis = RedisOptions {
            mode: match store {
                StoreKind::RedisCluster => RedisMode::Cluster,
                StoreKind::RedisSentinel => RedisMode::Sentinel,
                _ => RedisMode::Standalone,
            },
            url: redis_url.unwrap_or_default(),
            auth: env("REDIS_AUTH").filter(|auth| !auth.is_empty()),
            tls: reference_bool("REDIS_TLS")?.unwrap_or(false),
            tls_files: RedisTls {
                ca: args.redis_tls_ca.clone(),
                cert: args.redis_tls_cert.clone(),
                key: args.redis_tls_key.clone(),
                insecure_skip_hostname: args.redis_tls_insecure_skip_hostname,
            },
            timeout: args.redis_timeout,
            batch_window: args.redis_batch_window,
            batch_max: args.redis_batch_max,
            queue: args.redis_queue,
        };
        let ignored_env = IGNORED_REFERENCE_ENV
            .iter()
            .filter(|name| env(name).is_some())
            .map(|name| (*name).to_owned())
            .collect();
        Ok(Self {
            config,
            grpc_addr,
            http_addr,
            store,
            memory_max_keys: args.memory_max_keys,
            redis,
            workers: args.workers,
            log_format,
            log_level,
            load: LoadOptions {
                merge_domains: pick(args.merge_domains, "MERGE_DOMAIN_CONFIG")?,
            },
            response,
            limiter: LimiterSettings {
                near_limit_ratio,
                stop_increment_when_over_limit: pick(
                    args.stop_increment_when_over_limit,
                    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
                )?,
                report_local_cache: env("LOCAL_CACHE_SIZE_IN_BYTES")
                    .is_some_and(|size| size.trim().parse::<u64>().is_ok_and(|n| n > 0)),
                replicas: args.replicas.max(1),
            },
            bounds: RequestBounds {
                max_descriptors: args.max_descriptors,
                max_entries: args.max_entries,
                max_value_bytes: args.max_value_bytes,
            },
            max_message_bytes: args.max_message_bytes,
            reload_interval: args.reload_interval,
            otlp_endpoint: args.otlp_endpoint.clone().filter(|e| !e.is_empty()),
            drain_delay: args.drain_delay,
            drain_timeout: args.drain_timeout,
            debug_endpoints: args.debug_endpoints,
            ignored_env,
            grpc_tls: crate::listener::tls::TlsSettings::resolve(&args.tls, env)?,
        })
    }
}

/// Parses a boolean as Go's `strconv.ParseBool` does (the reference's env syntax).
pub fn parse_go_bool(name: &str, value: &str) -> Result<bool, SettingsError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(error(name, other, "expected true or false")),
    }
}

/// `host:port` from the reference's separate host and port variables.
fn host_port(
    host: Option<String>,
    port: Option<String>,
    port_name: &str,
    default_port: u16,
) -> Result<SocketAddr, SettingsError> {
    let port = match port {
        Some(text) => text
            .parse::<u16>()
            .map_err(|_| error(port_name, &text, "expected a port number"))?,
        None => default_port,
    };
    let host = host.unwrap_or_else(|| "0.0.0.0".into());
    let text = format!("{host}:{port}");
    text.parse()
        .map_err(|_| error(port_name, &text, "expected an IP address and port"))
}

fn error(name: &str, value: &str, reason: &str) -> SettingsError {
    SettingsError {
        name: name.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests;
