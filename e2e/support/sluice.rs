//! The `sluice` binary as a child process on fixed free ports, so that it can be stopped
//! and started again where Envoy expects it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::common::Metrics;
use super::{free_port, sluice_bin, wait_for_200, Process};

/// The counter store a suite runs against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// The in-process memory store.
    Memory,
    /// A Redis server at this URL (it outlives Sluice restarts).
    Redis(String),
}

impl Store {
    /// `serve` flags selecting this store.
    pub fn serve_flags(&self) -> Vec<String> {
        match self {
            Store::Memory => vec!["--store".into(), "memory".into()],
            Store::Redis(url) => vec![
                "--store".into(),
                "redis".into(),
                "--redis-url".into(),
                url.clone(),
                // Loopback Redis under a loaded test machine: generous but bounded.
                "--redis-timeout".into(),
                "200ms".into(),
            ],
        }
    }
}

/// A running (or stopped) `sluice serve`.
pub struct Sluice {
    /// gRPC port (the one Envoy's `sluice` cluster points at).
    pub grpc_port: u16,
    /// Admin HTTP port.
    pub http_port: u16,
    /// The rules directory it serves.
    pub config_dir: tempfile::TempDir,
    logs: tempfile::TempDir,
    store: Store,
    process: Option<Process>,
}

impl Sluice {
    /// Serves a copy of the rule files in `rules_dir` with `store`, reloading every 100 ms
    /// and adding every rate limit header.
    pub async fn start(rules_dir: &Path, store: Store) -> Self {
        let config_dir = tempfile::tempdir().expect("temp dir");
        for entry in std::fs::read_dir(rules_dir).expect("read rules dir") {
            let path = entry.expect("rules dir entry").path();
            if let Some(name) = path.file_name() {
                std::fs::copy(&path, config_dir.path().join(name)).expect("copy rule file");
            }
        }
        let mut sluice = Self {
            grpc_port: free_port(),
            http_port: free_port(),
            config_dir,
            logs: tempfile::tempdir().expect("temp dir"),
            store,
            process: None,
        };
        sluice.restart().await;
        sluice
    }

    /// Starts the process (again) on the same ports and waits until it is ready.
    pub async fn restart(&mut self) {
        assert!(self.process.is_none(), "sluice is already running");
        let mut command = Command::new(sluice_bin());
        command
            .arg("serve")
            .arg("--config")
            .arg(self.config_dir.path())
            .args(["--grpc-addr", &format!("127.0.0.1:{}", self.grpc_port)])
            .args(["--http-addr", &format!("127.0.0.1:{}", self.http_port)])
            .args(["--reload-interval", "100ms"])
            .args(["--response-headers", "all"])
            .args(["--drain-timeout", "200ms"])
            .args(["--workers", "1"])
            .args(self.store.serve_flags())
            .env("SLUICE_LOG_LEVEL", "info");
        let mut process = Process::spawn("sluice", command, &self.logs.path().join("sluice.log"));
        wait_for_200(&self.url("/readyz"), Duration::from_secs(10), &mut process).await;
        self.process = Some(process);
    }

    /// Kills the process (as a crash would).
    pub fn stop(&mut self) {
        self.process = None;
    }

    /// A URL on the admin port.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http_port)
    }

    /// Every metric sample.
    pub async fn metrics(&self) -> Metrics {
        super::common::fetch_metrics(&self.url("/metrics")).await
    }

    /// Replaces a rule file's contents (written whole, then renamed into place, as a
    /// ConfigMap update does).
    pub fn write_rules(&self, name: &str, text: &str) {
        let staged = self.config_dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&staged, text).expect("write staged rule file");
        std::fs::rename(&staged, self.config_dir.path().join(name)).expect("rename rule file");
    }

    /// The log's last lines.
    pub fn log_tail(&self) -> String {
        self.process
            .as_ref()
            .map(Process::log_tail)
            .unwrap_or_default()
    }
}
