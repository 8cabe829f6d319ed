//! Wires the parts together and runs them until shutdown: `run` takes bound listeners
//! (tests bind port 0), the resolved settings and a shutdown future.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::admin::{self, AdminState};
use crate::clock::{Clock, SystemClock};
use crate::limiter::Limiter;
use crate::listener::{self, tls::ReloadingTls};
use crate::proto::rls::rate_limit_service_server::RateLimitServiceServer;
use crate::rules::live::LiveRules;
use crate::service::{GrpcService, Service};
use crate::settings::{Settings, StoreKind};
use crate::store::memory::MemoryStore;
use crate::store::Store;
use crate::telemetry::{Metrics, ResultLabel};

/// gRPC health service name the reference registers.
pub const HEALTH_SERVICE_NAME: &str = "ratelimit";

/// How often expired memory-store entries are swept.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The listeners `run` serves on, bound by the caller.
pub struct Listeners {
    /// gRPC: RLS and health.
    pub grpc: TcpListener,
    /// Admin HTTP.
    pub http: TcpListener,
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
    /// The gRPC TLS files could not be loaded at start.
    #[error("gRPC TLS: {0}")]
    Tls(#[from] crate::listener::tls::TlsError),
}

/// Readiness and drain state shared by the admin port and the gRPC health service.
#[derive(Debug)]
pub struct Lifecycle {
    /// Set at the start of shutdown: readiness turns false at once.
    draining: AtomicBool,
    /// When the server started.
    started: Instant,
}

impl Lifecycle {
    /// A lifecycle starting now.
    pub fn new() -> Self {
        Self {
            draining: AtomicBool::new(false),
            started: Instant::now(),
        }
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Time since start.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs Sluice on `listeners` until `shutdown` completes, then drains.
pub async fn run(
    listeners: Listeners,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let clock: Arc<dyn Clock> = SystemClock::shared();
    match settings.store {
        StoreKind::Memory => {
            let store = Arc::new(MemoryStore::new(settings.memory_max_keys, clock.clone()));
            let sweeper = store.clone();
            let sweep = tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_INTERVAL);
                loop {
                    tick.tick().await;
                    sweeper.sweep_expired();
                }
            });
            let result = serve(listeners, settings, store, clock, shutdown).await;
            sweep.abort();
            result
        }
    }
}

/// Serves with a given store.
async fn serve<S: Store>(
    listeners: Listeners,
    settings: Settings,
    store: S,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    for name in &settings.ignored_env {
        tracing::info!(variable = %name, "reference setting has no meaning in Sluice; ignored");
    }
    let metrics = Arc::new(Metrics::new());
    let rules = Arc::new(LiveRules::new(settings.config.clone(), settings.load));
    let limiter = Limiter::new(store, clock, settings.limiter, metrics.clone());
    let service = Arc::new(Service::new(
        limiter,
        rules.clone(),
        settings.response.clone(),
        settings.bounds,
        metrics.clone(),
    ));
    let lifecycle = Arc::new(Lifecycle::new());
    let (health, health_service) = tonic_health::server::health_reporter();

    reload_once(&rules, &metrics, &health, &lifecycle).await;

    let (stop_tx, stop_rx) = watch::channel(false);
    let reloader = tokio::spawn(reload_loop(
        rules.clone(),
        metrics.clone(),
        health.clone(),
        lifecycle.clone(),
        settings.reload_interval,
        stop_rx.clone(),
    ));

    let grpc_addr = listeners.grpc.local_addr().ok();
    let http_addr = listeners.http.local_addr().ok();
    let rls = RateLimitServiceServer::new(GrpcService(service.clone()))
        .max_decoding_message_size(settings.max_message_bytes);
    let tls = match settings.grpc_tls.clone() {
        Some(tls) => Some(Arc::new(ReloadingTls::load(tls)?)),
        None => None,
    };
    let grpc = listener::hardened_server()
        .add_service(health_service)
        .add_service(rls)
        .serve_with_incoming_shutdown(
            listener::incoming(listeners.grpc, tls),
            wait_for(stop_rx.clone()),
        );
    let admin_state = Arc::new(AdminState {
        service: service.clone(),
        metrics: metrics.clone(),
        lifecycle: lifecycle.clone(),
        debug_endpoints: settings.debug_endpoints,
    });
    let http = axum::serve(listeners.http, admin::router(admin_state))
        .with_graceful_shutdown(wait_for(stop_rx.clone()));
    tracing::info!(grpc = ?grpc_addr, http = ?http_addr, config = %settings.config.display(), "sluice serving");

    let drain_delay = settings.drain_delay;
    let drain_timeout = settings.drain_timeout;
    let drain_health = health.clone();
    let drain_lifecycle = lifecycle.clone();
    let drain = async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining");
        drain_lifecycle.start_draining();
        set_health(&drain_health, false).await;
        tokio::time::sleep(drain_delay).await;
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
    reloader.abort();
    tracing::info!("sluice stopped");
    result
}

/// Loads the rules once, records the outcome, and updates health.
async fn reload_once(
    rules: &Arc<LiveRules>,
    metrics: &Metrics,
    health: &HealthReporter,
    lifecycle: &Lifecycle,
) {
    // File I/O and compilation run off the async workers.
    let task_rules = rules.clone();
    let outcome = match tokio::task::spawn_blocking(move || task_rules.reload()).await {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::error!(%error, "rule loading task failed");
            return;
        }
    };
    match outcome {
        Ok(false) => {}
        Ok(true) => {
            metrics
                .config_reloads
                .get_or_create(&ResultLabel { result: "success" })
                .inc();
            if let Some(set) = rules.current() {
                metrics.config_rules.set(set.rules.rule_count() as i64);
                tracing::info!(version = set.version, rules = set.rules.rule_count(), hash = %set.hash, "rules loaded");
            }
        }
        Err(errors) => {
            metrics
                .config_reloads
                .get_or_create(&ResultLabel { result: "error" })
                .inc();
            for error in &errors {
                tracing::error!(%error, "rules not loaded; previous rules keep serving");
            }
        }
    }
    let serving = rules.current().is_some() && !lifecycle.is_draining();
    set_health(health, serving).await;
}

/// Re-reads the rules every `interval` (content-hash compared) until stopped.
async fn reload_loop(
    rules: Arc<LiveRules>,
    metrics: Arc<Metrics>,
    health: HealthReporter,
    lifecycle: Arc<Lifecycle>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        reload_once(&rules, &metrics, &health, &lifecycle).await;
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

/// Completes when the stop flag turns true.
async fn wait_for(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}
