//! Wires the parts together and runs them until shutdown: `run` takes bound listeners
//! (tests bind port 0), the resolved settings and a shutdown future.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::admin::{self, AdminState};
use crate::clock::{Clock, SystemClock};
use crate::exchange::{self, Exchange, Timing};
use crate::lanes::{self, Lanes};
use crate::ledger::Ledger;
use crate::lifecycle::Lifecycle;
use crate::listener::lanes::MakeRouter;
use crate::listener::{self, tls::ReloadingTls, ConnectionAge};
use crate::proto::rls::rate_limit_service_server::RateLimitServiceServer;
use crate::rules::live::{LiveRules, ReloadOutcome};
use crate::rules::watch::{ReloadObserver, Reloader, WatchOptions};
use crate::service::debug::DebugReports;
use crate::service::{GrpcService, Service};
use crate::settings::{ConfigSource, RegionSettings, Settings, StoreKind};
use crate::store::memory::MemoryStore;
use crate::store::redis::links::RegionLinks;
use crate::store::redis::{mask_url, RedisStore};
use crate::store::Store;
use crate::telemetry::{Metrics, ResultLabel};
use crate::xds::{XdsClient, XdsState};

/// gRPC health service name the reference registers.
pub(crate) const HEALTH_SERVICE_NAME: &str = "ratelimit";

/// How often expired memory-store entries are swept.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The listeners `run` serves on, bound by the caller.
pub struct Listeners {
    /// gRPC: RLS and health.
    pub grpc: TcpListener,
    /// Admin HTTP.
    pub http: TcpListener,
    /// Prometheus metrics on an address of their own (`settings.prometheus`); `None`
    /// when not asked for, or when that address is the admin one (the admin listener
    /// then serves them at the Prometheus path too).
    pub prometheus: Option<TcpListener>,
}

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener failed.
    #[error("{listener} listener failed: {source}")]
    Listener {
        /// Which listener.
        listener: &'static str,
        /// The I/O or transport error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store could not be set up (a configuration error, not an outage).
    #[error("store: {0}")]
    Store(String),
    /// The gRPC TLS files could not be loaded at start.
    #[error("gRPC TLS: {0}")]
    Tls(#[from] crate::listener::tls::TlsError),
}

/// Runs Sluice on `listeners` until `shutdown` completes, then drains.
pub async fn run(
    listeners: Listeners,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    run_with_clock(listeners, settings, SystemClock::shared(), shutdown).await
}

/// [`run`] with `clock` for the stores and the limiter (tests drive time with a manual
/// one; Redis keeps its own clock, `TIME`).
pub async fn run_with_clock(
    listeners: Listeners,
    settings: Settings,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let metrics = Arc::new(Metrics::new());
    // The gRPC serving threads, started first: a Redis store makes each lane's batcher
    // and clients on that lane's runtime.
    let lanes =
        Lanes::spawn(lanes::count_for(settings.workers)).map_err(|e| ServerError::Listener {
            listener: "grpc",
            source: Box::new(e),
        })?;
    metrics
        .count_tasks_of(std::iter::once(tokio::runtime::Handle::current()).chain(lanes.handles()));
    match settings.store {
        StoreKind::Memory => {
            let store = Arc::new(
                MemoryStore::new(settings.memory_max_keys, clock.clone())
                    .counting_evictions_in(metrics.memory_evictions.clone()),
            );
            let sweeper = store.clone();
            let sweep = tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_INTERVAL);
                loop {
                    tick.tick().await;
                    sweeper.sweep_expired();
                }
            });
            let result = serve(listeners, settings, store, clock, metrics, lanes, shutdown).await;
            sweep.abort();
            result
        }
        StoreKind::Redis | StoreKind::RedisCluster | StoreKind::RedisSentinel => {
            // Each lane gets its own batcher and clients, on its own runtime, so a call
            // never leaves its lane. Startup waits for Redis at most REDIS_WARM_UP:
            // a Redis that is down does not hold it longer.
            let links = settings
                .regions
                .as_ref()
                .map(|regions| Arc::new(RegionLinks::new(regions.plan.clone())));
            let store = RedisStore::with_lanes(
                &settings.redis,
                metrics.clone(),
                &lanes.handles(),
                links.clone(),
            )
            .map_err(|error| ServerError::Store(error.to_string()))?;
            tracing::info!(
                store = store.kind(),
                url = %mask_url(&settings.redis.url),
                timeout = ?settings.redis.timeout,
                "using redis"
            );
            store.warm_up(REDIS_WARM_UP).await;
            // Publishes usage to the other regions until serving ends (dropped).
            let exchange = match (&settings.regions, links) {
                (Some(regions), Some(links)) => {
                    Some(start_exchange(regions, links, &settings, &metrics)?)
                }
                _ => None,
            };
            let result = serve(listeners, settings, store, clock, metrics, lanes, shutdown).await;
            drop(exchange);
            result
        }
    }
}

/// Starts publishing usage to the other regions of `regions` (`--region`).
fn start_exchange(
    regions: &RegionSettings,
    links: Arc<RegionLinks>,
    settings: &Settings,
    metrics: &Arc<Metrics>,
) -> Result<Exchange, ServerError> {
    let peers: Vec<&str> = regions.peers.iter().map(|(name, _)| &**name).collect();
    tracing::info!(
        region = regions.plan.local_name(),
        peers = ?peers,
        sync_interval = ?regions.sync_interval,
        stale_after = ?regions.stale_after,
        "sharing global limits with other regions"
    );
    let timing = Timing {
        sync_interval: regions.sync_interval,
        stale_after: regions.stale_after,
    };
    exchange::start(
        links,
        &settings.redis,
        &regions.peers,
        timing,
        metrics.clone(),
    )
    .map_err(|error| ServerError::Store(format!("regions: {error}")))
}

/// How long shutdown waits for the ledger to write what it holds.
const LEDGER_FLUSH: Duration = Duration::from_secs(5);

/// How long startup waits for Redis to be connected and its Lua code loaded before
/// serving, so that the first requests find it as ready as the later ones.
const REDIS_WARM_UP: Duration = Duration::from_secs(1);

/// Serves with a given store, the gRPC listener on `lanes`.
async fn serve<S: Store>(
    listeners: Listeners,
    settings: Settings,
    store: S,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    lanes: Lanes,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    for name in &settings.ignored_env {
        let why = crate::settings::reference::why_ignored(name);
        tracing::info!(variable = %name, why, "reference setting ignored");
    }
    let rules = Arc::new(LiveRules::new(settings.config.clone(), settings.load));
    let ledger = settings.ledger.as_ref().map(|ledger| {
        tracing::info!(
            url = %crate::ledger::mask(&ledger.url),
            interval = ?ledger.interval,
            spool = ledger.spool,
            "usage ledger on"
        );
        Arc::new(Ledger::start(
            ledger,
            crate::ledger::instance_id(SystemClock::shared().now() / 1_000),
            metrics.clone(),
        ))
    });
    let service = Service::builder(store, rules.clone())
        .ledger(ledger.clone())
        .clock(clock)
        .limiter_settings(settings.limiter)
        .response(settings.response.clone())
        .bounds(settings.bounds)
        .metrics(metrics.clone())
        .debug_reports(
            settings
                .debug_endpoints
                .then(|| Arc::new(DebugReports::new())),
        )
        .build();
    let service = Arc::new(service);
    let lifecycle = Arc::new(Lifecycle::new());
    let (health, health_service) = tonic_health::server::health_reporter();

    let health_task = tokio::spawn(mirror_health(lifecycle.subscribe(), health.clone()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let force_start = matches!(&settings.config_source, ConfigSource::Xds(xds) if xds.force_start);
    let reporter = Arc::new(ReloadReporter {
        rules: rules.clone(),
        metrics: metrics.clone(),
        lifecycle: lifecycle.clone(),
        ready_without_rules: force_start,
    });
    lifecycle.set_rules_loaded(force_start);
    let (rule_source, xds_state) = match &settings.config_source {
        ConfigSource::Files => {
            let reloader = Reloader::new(
                rules.clone(),
                reporter,
                WatchOptions {
                    rescan_interval: settings.reload_interval,
                    ..WatchOptions::default()
                },
            );
            reloader.load_now().await;
            (tokio::spawn(reloader.run(stop_rx.clone())), None)
        }
        ConfigSource::Xds(xds) => {
            let state = XdsState::new(&xds.server, &metrics);
            let client = XdsClient::new((**xds).clone(), rules.clone(), reporter, state.clone());
            (tokio::spawn(client.run(stop_rx.clone())), Some(state))
        }
    };
    // Leases whose time is up give their unused units back to the other instances.
    let lease_returns = tokio::spawn({
        let service = service.clone();
        async move {
            let mut tick = tokio::time::interval(crate::limiter::lease::RETURN_INTERVAL);
            loop {
                tick.tick().await;
                service.limiter().return_leases(false).await;
            }
        }
    });

    let addr = |listener: &TcpListener| {
        listener
            .local_addr()
            .map_or_else(|_| "unknown".to_owned(), |addr| addr.to_string())
    };
    let (grpc_addr, http_addr) = (addr(&listeners.grpc), addr(&listeners.http));
    let rls = RateLimitServiceServer::new(GrpcService(service.clone()))
        .max_decoding_message_size(settings.max_message_bytes);
    let tls = match settings.grpc_tls.clone() {
        Some(tls) => Some(Arc::new(ReloadingTls::load(tls)?)),
        None => None,
    };
    let (reflection_v1, reflection_v1alpha) = reflection_services();
    let connection_age = settings.grpc_connection_age;
    let make_router: MakeRouter = Arc::new(move || {
        let server = listener::hardened_server();
        match connection_age {
            Some(age) => age.apply(server),
            None => server,
        }
        .add_service(health_service.clone())
        .add_service(rls.clone())
        .add_optional_service(reflection_v1.clone())
        .add_optional_service(reflection_v1alpha.clone())
    });
    let mut grpc = listener::lanes::serve(
        lanes,
        listeners.grpc,
        tls,
        connection_age.map(ConnectionAge::close_after),
        &make_router,
        &stop_rx,
    );
    // Dropping the lanes (after the drain timeout) closes what is left.
    let grpc = async move { grpc.finished().await };
    let admin_state = Arc::new(AdminState {
        service: service.clone(),
        metrics: metrics.clone(),
        lifecycle: lifecycle.clone(),
        debug_endpoints: settings.debug_endpoints,
        xds: xds_state,
    });
    // Without a listener of its own (on the admin address) the admin port's `/metrics`
    // is the Prometheus endpoint.
    let prometheus = match (listeners.prometheus, &settings.prometheus) {
        (Some(listener), Some(settings)) => {
            tracing::info!(prometheus = %addr(&listener), path = %settings.path, "serving Prometheus metrics");
            let server = axum::serve(
                listener,
                admin::metrics_router(metrics.clone(), &settings.path),
            )
            .with_graceful_shutdown(listener::stopped(stop_rx.clone()));
            Some(tokio::spawn(async move {
                if let Err(error) = server.await {
                    tracing::error!(%error, "Prometheus listener failed");
                }
            }))
        }
        _ => None,
    };
    let http = axum::serve(listeners.http, admin::router(admin_state))
        .with_graceful_shutdown(listener::stopped(stop_rx.clone()));
    match &settings.config_source {
        ConfigSource::Files => {
            tracing::info!(grpc = %grpc_addr, http = %http_addr, config = %settings.config.display(), "sluice serving");
        }
        ConfigSource::Xds(xds) => {
            tracing::info!(grpc = %grpc_addr, http = %http_addr, xds = %xds.server, "sluice serving");
        }
    }

    let drain_delay = settings.drain_delay;
    let drain_timeout = settings.drain_timeout;
    let drain_health = health.clone();
    let drain_lifecycle = lifecycle.clone();
    let drain_service = service.clone();
    let drain = async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining");
        drain_lifecycle.start_draining();
        // Delayed answers go out at once: their callers are not kept past the drain.
        drain_service.limiter().delays().drain();
        set_health(&drain_health, false).await;
        tokio::time::sleep(drain_delay).await;
        tracing::info!("listeners closing; waiting for in-flight calls");
        let _ = stop_tx.send(true);
        tokio::time::sleep(drain_timeout).await;
    };

    let servers = async {
        let (grpc, http) = tokio::join!(grpc, http);
        grpc.map_err(|e| ServerError::Listener {
            listener: "grpc",
            source: Box::new(e),
        })?;
        http.map_err(|e| ServerError::Listener {
            listener: "http",
            source: Box::new(e),
        })
    };
    let result = tokio::select! {
        result = servers => result,
        () = drain => {
            tracing::warn!("drain timeout reached; closing remaining connections");
            Ok(())
        }
    };
    rule_source.abort();
    health_task.abort();
    if let Some(prometheus) = prometheus {
        prometheus.abort();
    }
    lease_returns.abort();
    // Bounded: a store that is down must not hold the exit up.
    let returned = service.limiter().return_leases(true);
    if tokio::time::timeout(Duration::from_secs(2), returned)
        .await
        .is_err()
    {
        tracing::warn!("unused lease units not all returned at exit");
    }
    if let Some(ledger) = ledger {
        // Bounded too: what a database that is down keeps is logged as unwritten.
        ledger.flush(LEDGER_FLUSH).await;
        let left = ledger.spooled_units();
        if left > 0 {
            tracing::error!(units = left, "ledger usage not written at exit");
        }
    }
    tracing::info!("sluice stopped");
    result
}

/// Turns reload outcomes into metrics, logs and readiness.
struct ReloadReporter {
    /// The rules, to tell whether any are loaded.
    rules: Arc<LiveRules>,
    /// `sluice_config_reload_total`, `sluice_config_rules`.
    metrics: Arc<Metrics>,
    /// Readiness follows "rules loaded".
    lifecycle: Arc<Lifecycle>,
    /// Ready before any rules load (xDS with `FORCE_START_WITHOUT_INITIAL_CONFIG`).
    ready_without_rules: bool,
}

impl ReloadObserver for ReloadReporter {
    fn reloaded(&self, outcome: &ReloadOutcome) {
        match outcome {
            ReloadOutcome::Unchanged => {}
            ReloadOutcome::Loaded(set) => {
                self.metrics
                    .config_reloads
                    .get_or_create(&ResultLabel { result: "success" })
                    .inc();
                self.metrics.config_rules.set(set.rules.rule_count() as i64);
                // Series of rules this set dropped go now, not at the next restart.
                let labels: std::collections::HashSet<&str> =
                    set.rules.rules().map(|rule| &*rule.stats_label).collect();
                self.metrics
                    .forget_rules(&|label: &str| labels.contains(label));
                self.metrics.rules_loaded(set.loaded_at);
                tracing::info!(
                    version = set.version,
                    rules = set.rules.rule_count(),
                    hash = %set.hash,
                    "rules loaded"
                );
            }
            ReloadOutcome::Failed { errors, repeated } => {
                self.metrics.rules_failed();
                if !repeated {
                    self.metrics
                        .config_reloads
                        .get_or_create(&ResultLabel { result: "error" })
                        .inc();
                    let outcome = if self.rules.current().is_some() {
                        "rules not loaded; previous rules keep serving"
                    } else {
                        "rules not loaded; not ready until they load"
                    };
                    for error in errors {
                        let (line, column) = error.position();
                        tracing::error!(
                            file = %error.file(),
                            line,
                            column,
                            reason = %error.reason(),
                            "{outcome}"
                        );
                    }
                }
            }
        }
        self.lifecycle
            .set_rules_loaded(self.ready_without_rules || self.rules.current().is_some());
    }
}

/// Mirrors readiness into the gRPC health service until the lifecycle is dropped.
async fn mirror_health(mut serving: watch::Receiver<bool>, health: HealthReporter) {
    loop {
        let now = *serving.borrow_and_update();
        set_health(&health, now).await;
        if serving.changed().await.is_err() {
            return;
        }
    }
}

/// Sets both gRPC health names.
async fn set_health(health: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    health.set_service_status("", status).await;
    health.set_service_status(HEALTH_SERVICE_NAME, status).await;
}

/// gRPC server reflection (v1 and v1alpha, for grpcurl and friends) over the RLS and
/// health protos. A descriptor that does not build only costs reflection, with a log line.
fn reflection_services() -> (
    Option<
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
    >,
    Option<
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    >,
) {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let v1 = builder()
        .build_v1()
        .map_err(|error| tracing::warn!(%error, "gRPC reflection (v1) unavailable"))
        .ok();
    let v1alpha = builder()
        .build_v1alpha()
        .map_err(|error| tracing::warn!(%error, "gRPC reflection (v1alpha) unavailable"))
        .ok();
    (v1, v1alpha)
}
