//! The command line: every subcommand and flag, as clap parses them. Turning the
//! `serve` flags and the environment into [`super::Settings`] is the rest of this
//! module's business.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use super::StoreKind;
use crate::service::HeaderMode;
use crate::telemetry::LogFormat;

/// Sluice: a global rate limit service for Envoy. Without a subcommand it serves,
/// configured by the environment alone (as the reference's image is run).
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// What to do (`serve` when none is given).
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

impl Cli {
    /// The subcommand to run: the one given, else `serve` with its defaults and the
    /// environment (Envoy Gateway runs the image with no arguments at all).
    pub fn into_command(self) -> Command {
        self.command
            .unwrap_or_else(|| match Self::parse_from(["sluice", "serve"]).command {
                Some(serve) => serve,
                None => unreachable!("`serve` parses as a subcommand"),
            })
    }
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
    /// The usage ledger in PostgreSQL: `sluice ledger migrate`.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// A descriptor's usage in the current window (asked of a running Sluice's admin
    /// port), or `sluice usage export`.
    Usage(UsageArgs),
    /// Load-test any RLS server: req/s, latency percentiles, OK/OVER_LIMIT/error counts.
    #[cfg(feature = "bench")]
    Bench(Box<crate::bench::BenchArgs>),
    /// Bench only: serve a constant OK over Sluice's gRPC stack (the throughput ceiling).
    #[command(hide = true)]
    #[cfg(feature = "bench")]
    BenchServer(BenchServerArgs),
    /// Bench only: memory store bytes per token-bucket key (RSS growth ÷ keys).
    #[command(hide = true)]
    #[cfg(feature = "bench")]
    BenchMemory(BenchMemoryArgs),
}

/// `sluice ledger ...`.
#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Create the ledger's tables, or bring them to this version's schema.
    Migrate(LedgerMigrateArgs),
}

/// Flags of `sluice ledger migrate`.
#[derive(Debug, Args)]
pub struct LedgerMigrateArgs {
    /// PostgreSQL URL of the usage ledger.
    #[arg(long, env = "SLUICE_LEDGER_URL")]
    pub ledger_url: String,
}

/// `sluice usage --domain D --descriptor k=v`, or `sluice usage export ...`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct UsageArgs {
    /// `export`: the ledger's totals as CSV.
    #[command(subcommand)]
    pub command: Option<UsageCommand>,
    /// Admin address of a running `sluice serve` with `--ledger-url`.
    #[arg(long, env = "SLUICE_ADMIN", default_value = "127.0.0.1:8080")]
    pub admin: String,
    /// Request domain.
    #[arg(long)]
    pub domain: Option<String>,
    /// The descriptor as `key=value,key2=value2`.
    #[arg(long)]
    pub descriptor: Option<String>,
}

/// `sluice usage ...`.
#[derive(Debug, Subcommand)]
pub enum UsageCommand {
    /// Per key and window, the units the ledger holds for windows starting in
    /// [--from, --to), as CSV: what an invoice needs.
    Export(UsageExportArgs),
}

/// Flags of `sluice usage export`.
#[derive(Debug, Args)]
pub struct UsageExportArgs {
    /// PostgreSQL URL of the usage ledger.
    #[arg(long, env = "SLUICE_LEDGER_URL")]
    pub ledger_url: String,
    /// First window start included (`2026-11-01` or RFC 3339; UTC unless a zone is given).
    #[arg(long)]
    pub from: String,
    /// First window start excluded.
    #[arg(long)]
    pub to: String,
    /// Output format: `csv`.
    #[arg(long, default_value = "csv", value_parser = ["csv"])]
    pub(crate) format: String,
}

/// Flags of `sluice explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Rules file or directory.
    #[arg(long, env = "SLUICE_CONFIG", default_value = "config/")]
    pub(crate) config: PathBuf,
    /// Request domain.
    #[arg(long)]
    pub(crate) domain: String,
    /// One descriptor as `key=value,key2=value2` (repeat for several; a value may
    /// contain `=` but not `,`).
    #[arg(long = "descriptor", required = true)]
    pub(crate) descriptors: Vec<String>,
    /// Request-level hits addend.
    #[arg(long, default_value_t = 0)]
    pub(crate) hits_addend: u32,
    /// Merge files of the same domain (the reference's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
    pub merge_domains: Option<bool>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Flags of `sluice bench-server`.
#[cfg(feature = "bench")]
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
#[cfg(feature = "bench")]
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
    /// Rule files or directories [default: the path `serve` would read: SLUICE_CONFIG, or
    /// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, or config/].
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
    pub(crate) config: Option<PathBuf>,
    /// Where rules come from: files at --config, or an xDS management server [default: file, or xds with CONFIG_TYPE=GRPC_XDS_SOTW].
    #[arg(long, env = "SLUICE_CONFIG_SOURCE", value_enum)]
    pub(crate) config_source: Option<ConfigSourceKind>,
    /// xDS management server, `host:port` [default: localhost:18000, or CONFIG_GRPC_XDS_SERVER_URL].
    #[arg(long, env = "SLUICE_XDS_SERVER")]
    pub(crate) xds_server: Option<String>,
    /// Node id given to the xDS server [default: default, or CONFIG_GRPC_XDS_NODE_ID].
    #[arg(long, env = "SLUICE_XDS_NODE_ID")]
    pub(crate) xds_node_id: Option<String>,
    /// gRPC listener (RLS and health) [default: 0.0.0.0:8081, or GRPC_HOST:GRPC_PORT].
    #[arg(long, env = "SLUICE_GRPC_ADDR")]
    pub(crate) grpc_addr: Option<SocketAddr>,
    /// Longest life of a gRPC connection: then the server sends GOAWAY, so clients
    /// reconnect and new replicas get their share (±10 % jitter; 0: never) [default: 24h, or GRPC_MAX_CONNECTION_AGE].
    #[arg(long, env = "SLUICE_GRPC_MAX_CONNECTION_AGE", value_parser = humantime::parse_duration)]
    pub(crate) grpc_max_connection_age: Option<Duration>,
    /// After the age: longest wait for the calls in flight before the connection is closed [default: 1h, or GRPC_MAX_CONNECTION_AGE_GRACE].
    #[arg(long, env = "SLUICE_GRPC_MAX_CONNECTION_AGE_GRACE", value_parser = humantime::parse_duration)]
    pub(crate) grpc_max_connection_age_grace: Option<Duration>,
    /// Admin HTTP listener [default: 0.0.0.0:8080, or HOST:PORT].
    #[arg(long, env = "SLUICE_HTTP_ADDR")]
    pub(crate) http_addr: Option<SocketAddr>,
    /// Counter store [default: memory, or redis when REDIS_URL is set (REDIS_TYPE picks the kind)].
    #[arg(long, env = "SLUICE_STORE", value_enum)]
    pub(crate) store: Option<StoreKind>,
    /// Redis URL: `redis://[user:pass@]host:port[/db]`, `rediss://` for TLS; comma-separated seeds for a cluster; `unix:///path` (or the path) for a Unix socket [or REDIS_URL].
    #[arg(long, env = "SLUICE_REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,
    /// Deadline of one Redis store call.
    #[arg(long, env = "SLUICE_REDIS_TIMEOUT", value_parser = humantime::parse_duration, default_value = "20ms")]
    pub(crate) redis_timeout: Duration,
    /// Longest time the Redis batcher waits for more checks (0: none; a batch takes the
    /// checks queued while its lane was busy).
    #[arg(long, env = "SLUICE_REDIS_BATCH_WINDOW", value_parser = humantime::parse_duration, default_value = "0s")]
    pub(crate) redis_batch_window: Duration,
    /// Most checks in one Redis batch.
    #[arg(long, env = "SLUICE_REDIS_BATCH_MAX", default_value_t = 128)]
    pub(crate) redis_batch_max: usize,
    /// Most store calls waiting for the Redis batcher; beyond it a call fails at once.
    #[arg(long, env = "SLUICE_REDIS_QUEUE", default_value_t = 16_384)]
    pub(crate) redis_queue: usize,
    /// PEM CA bundle trusted for `rediss://` [default: the system roots, or REDIS_TLS_CACERT].
    #[arg(long, env = "SLUICE_REDIS_TLS_CA")]
    pub(crate) redis_tls_ca: Option<PathBuf>,
    /// PEM client certificate chain presented to Redis (mutual TLS; needs --redis-tls-key) [or REDIS_TLS_CLIENT_CERT].
    #[arg(long, env = "SLUICE_REDIS_TLS_CERT")]
    pub(crate) redis_tls_cert: Option<PathBuf>,
    /// PEM private key of --redis-tls-cert [or REDIS_TLS_CLIENT_KEY].
    #[arg(long, env = "SLUICE_REDIS_TLS_KEY")]
    pub(crate) redis_tls_key: Option<PathBuf>,
    /// Accept a Redis certificate whose names do not match the URL host (the chain is
    /// still verified). Host names are checked by default [or REDIS_TLS_SKIP_HOSTNAME_VERIFICATION].
    #[arg(long, env = "SLUICE_REDIS_TLS_INSECURE_SKIP_HOSTNAME")]
    pub(crate) redis_tls_insecure_skip_hostname: bool,
    /// Written before every Redis key, so that deployments sharing one Redis keep
    /// separate counters; may not contain `{` or `}` [default: none, or CACHE_KEY_PREFIX].
    #[arg(long, env = "SLUICE_CACHE_KEY_PREFIX")]
    pub(crate) cache_key_prefix: Option<String>,
    /// Sluice instances sharing the store; the `local` failure mode enforces limit / replicas.
    #[arg(long, env = "SLUICE_REPLICAS", default_value_t = 1)]
    pub(crate) replicas: u32,
    /// This instance's region (`a-z`, `0-9` and `-`, at most 32 characters): limits with
    /// `scope: global` are shared with the --peer-region regions. Needs a Redis store.
    #[arg(long, env = "SLUICE_REGION")]
    pub(crate) region: Option<String>,
    /// Another region and its Redis, as `NAME=URL` (repeat the flag; `;` separates them in
    /// the variable, since a cluster's URL is a comma-separated seed list). The peer's
    /// store is of the same kind, with the same TLS files, auth, timeouts, batching and
    /// key prefix, as the local one: only the URL differs.
    #[arg(
        long = "peer-region",
        env = "SLUICE_PEER_REGIONS",
        value_name = "NAME=URL",
        value_delimiter = ';',
        hide_env_values = true
    )]
    pub(crate) peer_regions: Vec<String>,
    /// How often this instance publishes its usage to the other regions (10ms to 60s) [default: 1s].
    #[arg(long, env = "SLUICE_REGION_SYNC_INTERVAL", value_parser = humantime::parse_duration)]
    pub(crate) region_sync_interval: Option<Duration>,
    /// A peer region whose last usage is older than this is taken to use its fallback
    /// share (longer than --region-sync-interval, at most 10m) [default: 3 × --region-sync-interval].
    #[arg(long, env = "SLUICE_REGION_STALE_AFTER", value_parser = humantime::parse_duration)]
    pub(crate) region_stale_after: Option<Duration>,
    /// Most limit states the memory store holds before evicting.
    #[arg(long, env = "SLUICE_MEMORY_MAX_KEYS", default_value_t = 1_000_000)]
    pub(crate) memory_max_keys: usize,
    /// gRPC serving threads (one current-thread runtime each, connections dealt in turn;
    /// with Redis each has its own batcher and connections) and the main runtime's worker
    /// threads [default: number of cores].
    #[arg(long, env = "SLUICE_WORKERS")]
    pub(crate) workers: Option<usize>,
    /// Log format [default: text, or LOG_FORMAT].
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum)]
    pub(crate) log_format: Option<LogFormat>,
    /// Log filter, e.g. `info` or `sluice=debug` [default: info, or LOG_LEVEL].
    #[arg(long, env = "SLUICE_LOG_LEVEL")]
    pub(crate) log_level: Option<String>,
    /// Rate limit headers to add [default: none, or reference with LIMIT_RESPONSE_HEADERS_ENABLED].
    #[arg(long, env = "SLUICE_RESPONSE_HEADERS", value_enum)]
    pub(crate) response_headers: Option<HeaderMode>,
    /// Merge files of the same domain [default: false, or MERGE_DOMAIN_CONFIG].
    #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
    pub(crate) merge_domains: Option<bool>,
    /// Never refuse: report OVER_LIMIT per descriptor but answer OK [or SHADOW_MODE].
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    pub(crate) shadow_mode: Option<bool>,
    /// Treat every descriptor as a quota descriptor [or QUOTA_MODE].
    #[arg(long, env = "SLUICE_QUOTA_MODE")]
    pub(crate) quota_mode: Option<bool>,
    /// Near-limit threshold as a fraction of the limit [default: 0.8, or NEAR_LIMIT_RATIO].
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO")]
    pub(crate) near_limit_ratio: Option<f32>,
    /// Describe the request in dynamic metadata [or RESPONSE_DYNAMIC_METADATA].
    #[arg(long, env = "SLUICE_DYNAMIC_METADATA")]
    pub(crate) dynamic_metadata: Option<bool>,
    /// When one descriptor would go over, charge no other descriptor of the request [or STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT].
    #[arg(long, env = "SLUICE_STOP_INCREMENT_WHEN_OVER_LIMIT")]
    pub(crate) stop_increment_when_over_limit: Option<bool>,
    /// How often the config path is re-read (content-hash compared) as a backstop to
    /// the file watcher.
    #[arg(long, env = "SLUICE_RELOAD_INTERVAL", value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) reload_interval: Duration,
    /// OTLP/gRPC collector for traces, e.g. `http://otel-collector:4317` (needs the
    /// `otel` cargo feature) [or OTEL_EXPORTER_OTLP_ENDPOINT, see TRACING_ENABLED].
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT")]
    pub(crate) otlp_endpoint: Option<String>,
    /// Also serve the admin port's Prometheus metrics on this address [default: none, or
    /// PROMETHEUS_ADDR with USE_PROMETHEUS].
    #[arg(long, env = "SLUICE_PROMETHEUS_ADDR")]
    pub(crate) prometheus_addr: Option<SocketAddr>,
    /// Path of the metrics on --prometheus-addr [default: /metrics, or PROMETHEUS_PATH].
    #[arg(long, env = "SLUICE_PROMETHEUS_PATH")]
    pub(crate) prometheus_path: Option<String>,
    /// After SIGTERM: time with readiness false before listeners close.
    #[arg(long, env = "SLUICE_DRAIN_DELAY", value_parser = humantime::parse_duration, default_value = "0s")]
    pub(crate) drain_delay: Duration,
    /// After SIGTERM: longest wait for in-flight calls.
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) drain_timeout: Duration,
    /// Serve `POST /explain`, `/debug/shadow` and `/debug/hotkeys`, which show descriptor
    /// values (user ids, IPs).
    #[arg(long, env = "SLUICE_DEBUG_ENDPOINTS")]
    pub(crate) debug_endpoints: bool,
    /// PostgreSQL URL of the usage ledger (`postgres://user:pass@host:5432/db`): the units
    /// admitted for `ledger: true` limits are recorded there. Required by such rules. TLS
    /// as libpq reads it: `?sslmode=verify-full&sslrootcert=FILE` (`sslcert`, `sslkey`).
    #[arg(long, env = "SLUICE_LEDGER_URL")]
    pub(crate) ledger_url: Option<String>,
    /// Create or migrate the ledger's tables at start (else `sluice ledger migrate`).
    #[arg(long, env = "SLUICE_LEDGER_MIGRATE")]
    pub(crate) ledger_migrate: bool,
    /// Longest time admitted units wait before their batch is written to the ledger:
    /// the most usage a crash can lose.
    #[arg(long, env = "SLUICE_LEDGER_INTERVAL", value_parser = humantime::parse_duration, default_value = "1s")]
    pub(crate) ledger_interval: Duration,
    /// Most ledger batches (one per key and window per interval) held while PostgreSQL
    /// is down; beyond it usage is dropped, counted and logged.
    #[arg(long, env = "SLUICE_LEDGER_SPOOL", default_value_t = 1_000_000)]
    pub(crate) ledger_spool: usize,
    /// Most descriptors in one request.
    #[arg(long, env = "SLUICE_MAX_DESCRIPTORS", default_value_t = 64)]
    pub(crate) max_descriptors: usize,
    /// Most entries in one descriptor.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = 32)]
    pub(crate) max_entries: usize,
    /// Longest descriptor key or value, in bytes.
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", default_value_t = 1024)]
    pub(crate) max_value_bytes: usize,
    /// Largest gRPC request message, in bytes.
    #[arg(long, env = "SLUICE_MAX_MESSAGE_BYTES", default_value_t = 1 << 20)]
    pub(crate) max_message_bytes: usize,
    /// Resolve the settings and validate the rules as `serve` would, print what
    /// `sluice check` prints, then exit (0 when both are valid) without serving.
    /// Used by deployment checks (the Helm chart test) to prove a container's arguments.
    #[arg(long, hide = true)]
    pub check_config_only: bool,
    /// gRPC TLS and mTLS.
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
}

/// Where `serve` gets its rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ConfigSourceKind {
    /// Rule files, watched for changes.
    File,
    /// Pushed by an xDS management server (aggregated discovery, state of the world).
    Xds,
}

/// gRPC TLS flags of `sluice serve`.
#[derive(Clone, Debug, Default, Args)]
pub struct TlsArgs {
    /// Serve gRPC over TLS with this PEM certificate chain [or GRPC_SERVER_TLS_CERT with GRPC_SERVER_USE_TLS].
    #[arg(long, env = "SLUICE_GRPC_TLS_CERT")]
    pub(crate) grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of the gRPC certificate [or GRPC_SERVER_TLS_KEY].
    #[arg(long, env = "SLUICE_GRPC_TLS_KEY")]
    pub(crate) grpc_tls_key: Option<PathBuf>,
    /// Require client certificates issued by this PEM CA bundle (mTLS) [or GRPC_CLIENT_TLS_CACERT, or GRPC_SERVER_TLS_CA_CERT].
    #[arg(long, env = "SLUICE_GRPC_TLS_CLIENT_CA")]
    pub(crate) grpc_tls_client_ca: Option<PathBuf>,
    /// Accept only client certificates with one of these DNS or IP SANs (comma list) [or GRPC_CLIENT_TLS_SAN].
    #[arg(long, env = "SLUICE_GRPC_TLS_CLIENT_SAN", value_delimiter = ',')]
    pub(crate) grpc_tls_client_san: Vec<String>,
}
