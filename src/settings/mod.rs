//! Command-line flags and environment → [`Settings`].
//!
//! Precedence: a flag (or its `SLUICE_*` variable) wins; otherwise the
//! envoyproxy/ratelimit variable that maps to it; otherwise the default. Reference
//! variables without meaning here are accepted and reported once as ignored; those with
//! a value Sluice cannot honour (one that would change what is limited or where
//! counters live) are refused ([`reference::REFUSED`]). The command line itself is
//! [`cli`]; each concern resolves in its own module.

pub(crate) mod cli;
mod listener;
mod observability;
pub(crate) mod redis;
pub(crate) mod reference;
mod regions;
mod service;
mod tls;
mod xds;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use cli::{
    CheckArgs, Cli, Command, ConfigSourceKind, ExplainArgs, LedgerCommand, LedgerMigrateArgs,
    ServeArgs, TlsArgs, UsageArgs, UsageCommand, UsageExportArgs,
};
pub(crate) use observability::PrometheusSettings;
pub use regions::RegionSettings;
pub use xds::ConfigSource;

use crate::limiter::LimiterSettings;
use crate::rules::LoadOptions;
use crate::service::{RequestBounds, ResponseOptions};
use crate::store::redis::RedisOptions;
use crate::telemetry::{LogFormat, TraceExport};
pub(crate) use reference::Env;
use reference::Reference;

/// Where counters live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StoreKind {
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
    /// Where rules come from: the files at `config`, or xDS.
    pub config_source: ConfigSource,
    /// gRPC listener address.
    pub grpc_addr: SocketAddr,
    /// Admin listener address.
    pub http_addr: SocketAddr,
    /// Counter store.
    pub(crate) store: StoreKind,
    /// Memory store capacity.
    pub(crate) memory_max_keys: usize,
    /// How to reach Redis (used by the Redis store kinds).
    pub redis: RedisOptions,
    /// This instance's region and its peers' stores, when `--region` is given.
    pub regions: Option<RegionSettings>,
    /// Worker threads (`None`: one per core).
    pub workers: Option<usize>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
    /// How rule files combine, and the regions a global limit is shared between.
    pub load: LoadOptions,
    /// Response shaping.
    pub response: ResponseOptions,
    /// Request semantics of the limiter.
    pub limiter: LimiterSettings,
    /// Request bounds.
    pub bounds: RequestBounds,
    /// Largest gRPC message.
    pub(crate) max_message_bytes: usize,
    /// Backstop rescan period.
    pub(crate) reload_interval: Duration,
    /// Where and how traces are exported, if at all.
    pub tracing: Option<TraceExport>,
    /// A second listener for the Prometheus metrics, if any.
    pub prometheus: Option<PrometheusSettings>,
    /// Readiness-false period before closing listeners.
    pub(crate) drain_delay: Duration,
    /// Longest drain.
    pub(crate) drain_timeout: Duration,
    /// Serve the endpoints that reveal descriptor values.
    pub(crate) debug_endpoints: bool,
    /// The usage ledger, when `--ledger-url` is given.
    pub(crate) ledger: Option<crate::ledger::LedgerSettings>,
    /// Reference variables that were set but mean nothing here.
    pub(crate) ignored_env: Vec<String>,
    /// gRPC connection age (`None`: connections live as long as clients keep them).
    pub(crate) grpc_connection_age: Option<crate::listener::ConnectionAge>,
    /// gRPC TLS (`None`: plaintext).
    pub grpc_tls: Option<crate::listener::tls::TlsSettings>,
}

/// A setting that could not be understood.
#[derive(Debug)]
pub struct SettingsError {
    /// Variable or flag name.
    pub(crate) name: String,
    /// What was given; empty when the error is about a combination of settings.
    pub(crate) value: String,
    /// Why it is wrong.
    pub(crate) reason: String,
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

impl Settings {
    /// Resolves `args` against an environment lookup (`std::env::var` in production),
    /// one concern at a time.
    pub fn resolve(args: &ServeArgs, env: Env<'_>) -> Result<Self, SettingsError> {
        let reference = Reference::new(env);
        reference::refuse(reference)?;
        let (grpc_addr, http_addr) = listener::addresses(args, reference)?;
        let (log_format, log_level) = service::logging(args, reference)?;
        let response = service::response(args, reference)?;
        let limiter = service::limiter(args, reference)?;
        let (store, redis) = redis::store(args, reference)?;
        let regions = regions::regions(args, store, &redis)?;
        let mut load = load_options(args.merge_domains, env)?;
        // Only `serve` shares limits between regions: `check` and `explain` leave it None.
        load.regions = regions.as_ref().map(|regions| regions.plan.clone());
        let tracing = observability::tracing(args, reference)?;
        Ok(Self {
            config: listener::config_path(args.config.as_ref(), reference),
            config_source: xds::config_source(args, reference)?,
            grpc_addr,
            http_addr,
            store,
            memory_max_keys: args.memory_max_keys,
            redis,
            regions,
            workers: args.workers,
            log_format,
            log_level,
            load,
            response,
            limiter,
            bounds: RequestBounds {
                max_descriptors: args.max_descriptors,
                max_entries: args.max_entries,
                max_value_bytes: args.max_value_bytes,
            },
            max_message_bytes: args.max_message_bytes,
            reload_interval: args.reload_interval,
            tracing,
            prometheus: observability::prometheus(args, reference, http_addr)?,
            drain_delay: args.drain_delay,
            drain_timeout: args.drain_timeout,
            debug_endpoints: args.debug_endpoints,
            ledger: ledger(args)?,
            ignored_env: reference::ignored_set(env),
            grpc_tls: tls::grpc_tls(&args.tls, reference)?,
            grpc_connection_age: listener::connection_age(args, reference)?,
        })
    }
}

/// How rule files combine, as `serve` reads them: the flag, else `MERGE_DOMAIN_CONFIG`
/// (`check` and `explain` use it too, so that they agree with `serve`).
pub fn load_options(merge_flag: Option<bool>, env: Env<'_>) -> Result<LoadOptions, SettingsError> {
    Ok(LoadOptions {
        merge_domains: Reference::new(env).pick(merge_flag, "MERGE_DOMAIN_CONFIG")?,
        regions: None,
    })
}

/// The rules path `serve` reads: `flag`, else the reference's `RUNTIME_*` variables,
/// else `config/`.
pub fn config_path(flag: Option<&PathBuf>, env: Env<'_>) -> PathBuf {
    listener::config_path(flag, Reference::new(env))
}

/// The error of a value that is not understood.
fn invalid(name: &str, value: &str, reason: &str) -> SettingsError {
    SettingsError {
        name: name.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod table_tests;
#[cfg(test)]
mod tests;

/// The ledger's settings from the flags (`None` without `--ledger-url`).
fn ledger(args: &ServeArgs) -> Result<Option<crate::ledger::LedgerSettings>, SettingsError> {
    let Some(url) = args.ledger_url.clone().filter(|url| !url.trim().is_empty()) else {
        return Ok(None);
    };
    if args.ledger_interval < Duration::from_millis(10) || args.ledger_spool == 0 {
        return Err(SettingsError {
            name: "--ledger-interval / --ledger-spool".into(),
            value: String::new(),
            reason: "the interval must be at least 10ms and the spool at least 1 batch".into(),
        });
    }
    if let Err(error) = crate::ledger::tls::check(&url) {
        return Err(SettingsError {
            name: "--ledger-url".into(),
            value: crate::ledger::mask(&url),
            reason: error.to_string(),
        });
    }
    Ok(Some(crate::ledger::LedgerSettings {
        url,
        interval: args.ledger_interval,
        spool: args.ledger_spool,
        migrate: args.ledger_migrate,
    }))
}
