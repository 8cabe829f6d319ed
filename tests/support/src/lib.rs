//! Helpers shared by Sluice's test binaries (`tests/*/main.rs`) and fuzz targets: a
//! Sluice server on loopback ports, clients, and metric lookups by the reference's stat
//! names; the `sluice` binary as a process, Redis, Envoy, certificates
//! and the fuzz harness in their own modules.

pub mod e2e;
pub mod fault;
pub mod fuzz;
pub mod pki;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod rng;
pub mod sentinel;
pub mod xds;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::server::{self, Listeners};
use sluice::settings::{Cli, Command, Settings};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// The repository root.
pub fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2);
    root.expect("tests/support is two levels under the root")
        .to_owned()
}

/// The `sluice` binary of this build. Cargo builds it for every integration test, in
/// the directory above the test binaries' `deps/` (`CARGO_BIN_EXE_sluice` is set for the
/// test binaries only, not for this crate). `SLUICE_BIN` names another one (a build of
/// another branch), as for `scripts/check-docs`.
pub fn sluice_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_BIN") {
        let bin = PathBuf::from(path);
        assert!(bin.is_file(), "SLUICE_BIN={} does not exist", bin.display());
        return bin;
    }
    let test_binary = std::env::current_exe().expect("path of the test binary");
    let bin = test_binary
        .parent()
        .and_then(Path::parent)
        .expect("test binary in <target>/<profile>/deps")
        .join("sluice");
    assert!(
        bin.is_file(),
        "{} not built: run the tests with cargo test",
        bin.display()
    );
    bin
}

/// A Sluice server running in this process on free loopback ports.
pub struct TestServer {
    /// The gRPC listener.
    pub grpc: SocketAddr,
    /// The admin (HTTP) listener.
    pub http: SocketAddr,
    /// The watched config directory.
    pub config_dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), server::ServerError>>>,
}

impl TestServer {
    /// Starts a server whose config directory holds `files` (name, content), with the
    /// given environment (reference variables) and extra `serve` flags.
    pub async fn start(
        files: &[(String, String)],
        env: &[(String, String)],
        flags: &[&str],
    ) -> Self {
        Self::start_with_clock(files, env, flags, sluice::clock::SystemClock::shared()).await
    }

    /// [`TestServer::start`] on `clock` (a [`sluice::clock::ManualClock`] lets a test
    /// choose where in a window its calls fall instead of waiting for the wall clock).
    pub async fn start_with_clock(
        files: &[(String, String)],
        env: &[(String, String)],
        flags: &[&str],
        clock: std::sync::Arc<dyn sluice::clock::Clock>,
    ) -> Self {
        let config_dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            write_file(config_dir.path(), name, text);
        }
        let dir = config_dir.path().to_string_lossy().into_owned();
        let mut argv = vec!["sluice", "serve", "--config", dir.as_str()];
        // A fast rescan backstop unless the test sets its own.
        if !flags.contains(&"--reload-interval") {
            argv.extend_from_slice(&["--reload-interval", "100ms"]);
        }
        argv.extend_from_slice(flags);
        let settings = settings_from(&argv, env);
        let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let grpc = grpc_listener.local_addr().expect("addr");
        let http = http_listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run_with_clock(
            Listeners {
                grpc: grpc_listener,
                http: http_listener,
                prometheus: None,
            },
            settings,
            clock,
            async move {
                let _ = stopped.await;
            },
        ));
        let server = Self {
            grpc,
            http,
            config_dir,
            stop: Some(stop),
            task: Some(task),
        };
        server.wait_until_listening().await;
        server
    }

    async fn wait_until_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if reqwest::get(format!("http://{}/livez", self.http))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("server did not start listening");
    }

    /// A gRPC client of the server.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect gRPC")
    }

    /// The admin port's URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// Every metric sample, by `name{labels}` as exposed.
    pub async fn metrics(&self) -> Metrics {
        fetch_metrics(&self.url("/metrics")).await
    }

    /// The admin port's `/status` document.
    pub async fn status(&self) -> serde_json::Value {
        reqwest::get(self.url("/status"))
            .await
            .expect("GET /status")
            .json()
            .await
            .expect("status JSON")
    }

    /// Writes the rule file `name` into the watched directory (see [`write_file`]).
    pub fn write_config(&self, name: &str, text: &str) {
        write_file(self.config_dir.path(), name, text);
    }

    /// Removes the rule file `name` from the watched directory.
    pub fn remove_config(&self, name: &str) {
        std::fs::remove_file(self.config_dir.path().join(name)).expect("remove config file");
    }

    /// Stops the server and waits for it to exit.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// `count` servers sharing one rule file (`name`, `text`) and the given `serve` flags
/// (for example one Redis store), and a gRPC client to each.
pub async fn instances(
    count: usize,
    rule_file: (&str, &str),
    flags: &[&str],
) -> (Vec<TestServer>, Vec<RateLimitServiceClient<Channel>>) {
    let files = [(rule_file.0.to_owned(), rule_file.1.to_owned())];
    let mut servers = Vec::with_capacity(count);
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let server = TestServer::start(&files, &[], flags).await;
        clients.push(server.client().await);
        servers.push(server);
    }
    (servers, clients)
}

/// Resolves `serve` settings from argv and an explicit environment.
pub fn settings_from(argv: &[&str], env: &[(String, String)]) -> Settings {
    let cli = Cli::try_parse_from(argv).expect("serve arguments");
    let Command::Serve(args) = cli.into_command() else {
        panic!("not a serve command");
    };
    let env: HashMap<String, String> = env.iter().cloned().collect();
    Settings::resolve(&args, &|name| env.get(name).cloned()).expect("settings resolve")
}

/// Writes `name` under `dir` at once, as a ConfigMap update does (a hidden temporary
/// file renamed over it): a reload never reads a half-written file, so each edit's
/// outcome is that edit's own.
pub fn write_file(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create config subdir");
    }
    let file_name = path
        .file_name()
        .expect("config file name")
        .to_string_lossy()
        .into_owned();
    let temporary = path.with_file_name(format!(".{file_name}.tmp"));
    std::fs::write(&temporary, text).expect("write config file");
    std::fs::rename(&temporary, &path).expect("rename config file");
}

/// A service deciding with `store` on the rules `text` (written as `rules.yaml`, which
/// must load), and the temporary directory that holds them.
pub fn service_with<S: sluice::store::Store>(
    text: &str,
    store: S,
    clock: std::sync::Arc<dyn sluice::clock::Clock>,
) -> (tempfile::TempDir, sluice::service::Service<S>) {
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("temp dir");
    write_file(dir.path(), "rules.yaml", text);
    let rules = Arc::new(sluice::rules::live::LiveRules::new(
        dir.path(),
        sluice::rules::LoadOptions::default(),
    ));
    assert!(
        matches!(
            rules.reload(),
            sluice::rules::live::ReloadOutcome::Loaded(_)
        ),
        "rules load"
    );
    let service = sluice::service::Service::builder(store, rules)
        .clock(clock)
        .build();
    (dir, service)
}

/// A `ShouldRateLimit` request of domain `bench` with one descriptor, `user=<user>`.
pub fn user_request(user: &str) -> sluice::proto::rls::RateLimitRequest {
    use sluice::proto::common::{rate_limit_descriptor::Entry, RateLimitDescriptor};
    sluice::proto::rls::RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// Every metric sample a `/metrics` URL exposes.
pub async fn fetch_metrics(url: &str) -> Metrics {
    let text = reqwest::get(url)
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body");
    Metrics::parse(&text)
}

/// Parsed Prometheus text.
#[derive(Debug, Default)]
pub struct Metrics(pub HashMap<String, f64>);

impl Metrics {
    /// Reads every sample of a Prometheus text exposition.
    pub fn parse(text: &str) -> Self {
        let mut samples = HashMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            if let Some((name, value)) = line.rsplit_once(' ') {
                if let Ok(value) = value.parse() {
                    samples.insert(name.to_owned(), value);
                }
            }
        }
        Self(samples)
    }

    /// The value of `sample` (`name{labels}`), 0 when absent.
    pub fn get(&self, sample: &str) -> f64 {
        self.0.get(sample).copied().unwrap_or(0.0)
    }

    /// The value of a statistic named as envoyproxy/ratelimit names it.
    pub fn reference_stat(&self, name: &str) -> f64 {
        self.get(&sluice_sample_for(name))
    }
}

/// Sluice's sample name for a reference statistic (the README's mapping table).
pub fn sluice_sample_for(reference: &str) -> String {
    if let Some(rest) = reference.strip_prefix("ratelimit.service.rate_limit.") {
        let (rule, stat) = rest.rsplit_once('.').expect("rule stat has a stat suffix");
        return format!("sluice_rule_hits_total{{rule=\"{rule}\",stat=\"{stat}\"}}");
    }
    match reference {
        "ratelimit.service.config_load_success" => {
            "sluice_config_reload_total{result=\"success\"}".into()
        }
        "ratelimit.service.config_load_error" => {
            "sluice_config_reload_total{result=\"error\"}".into()
        }
        "ratelimit.service.global_shadow_mode" => "sluice_global_shadow_mode_total".into(),
        "ratelimit.service.call.should_rate_limit.service_error" => {
            "sluice_call_errors_total{kind=\"service_error\"}".into()
        }
        "ratelimit.service.call.should_rate_limit.redis_error" => {
            "sluice_call_errors_total{kind=\"store_error\"}".into()
        }
        other => panic!("no Sluice metric for reference stat {other}"),
    }
}

/// The conformance data directory, or `None` (with a message) when it is absent and
/// not required. Panics when `SLUICE_CONFORMANCE_DIR` is set but missing.
pub fn conformance_dir() -> Option<PathBuf> {
    match std::env::var_os("SLUICE_CONFORMANCE_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            assert!(
                dir.join("cases.yaml").is_file(),
                "SLUICE_CONFORMANCE_DIR={} has no cases.yaml",
                dir.display()
            );
            Some(dir)
        }
        None => {
            let dir = repo_root().join("../shared/conformance");
            if dir.join("cases.yaml").is_file() {
                Some(dir)
            } else {
                eprintln!(
                    "conformance data not found at {}; set SLUICE_CONFORMANCE_DIR to run these tests",
                    dir.display()
                );
                None
            }
        }
    }
}

/// Loads `cases.yaml` as JSON values.
pub fn load_cases(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("cases.yaml")).expect("read cases.yaml");
    // The data is YAML 1.2: `Y` and `on` are strings, not booleans.
    let doc: serde_json::Value = serde_saphyr::from_str_with_options(
        &text,
        serde_saphyr::options! { strict_booleans: true },
    )
    .expect("parse cases.yaml");
    doc["cases"].as_array().cloned().expect("cases list")
}

/// Case ids excluded from conformance runs, with the reason
/// (`tests/properties/conformance_exclusions.yaml`).
pub fn exclusions() -> HashMap<String, String> {
    let path = repo_root().join("tests/properties/conformance_exclusions.yaml");
    let text = std::fs::read_to_string(path).expect("read conformance_exclusions.yaml");
    serde_saphyr::from_str(&text).expect("parse conformance_exclusions.yaml")
}

/// Runs `probe` every 10 ms until it gives `Ok`; after 5 s, fails with its last `Err`.
pub async fn eventually<F, Fut>(mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        match probe().await {
            Ok(()) => return,
            Err(last) => assert!(started.elapsed() < Duration::from_secs(5), "{last}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Seconds since the Unix epoch, from the clock a server's windows align to.
pub fn unix_seconds() -> u64 {
    use sluice::clock::{Clock, SystemClock};
    SystemClock::new().now() / sluice::algorithm::MICROS_PER_SECOND
}

/// Waits for the next minute when less than `margin` of this one is left, so that the
/// calls that follow fall in one minute's window.
pub async fn early_in_minute(margin: Duration) {
    let left = Duration::from_secs(60 - unix_seconds() % 60);
    if left < margin {
        tokio::time::sleep(left + Duration::from_secs(1)).await;
    }
}
