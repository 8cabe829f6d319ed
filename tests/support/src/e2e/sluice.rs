//! The `sluice` binary as a child process on fixed free ports, so that it can be stopped
//! and started again where Envoy expects it.

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use super::{free_ports, wait_for_200_or_exit, Process};
use crate::{sluice_bin, Metrics};

/// Starts tried on fresh ports before a bind failure fails the test.
const START_ATTEMPTS: usize = 3;
/// How the OS names a port already bound, in sluice's start-up error.
const ADDRESS_IN_USE: &str = "Address already in use";

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
        let [grpc_port, http_port] = free_ports();
        let mut sluice = Self {
            grpc_port,
            http_port,
            config_dir,
            logs: tempfile::tempdir().expect("temp dir"),
            store,
            process: None,
        };
        // A free port can be taken (by any process's outgoing connection) between
        // `free_ports` and sluice's bind: then it starts again on two other ports.
        for _ in 1..START_ATTEMPTS {
            match sluice.launch().await {
                Ok(()) => return sluice,
                Err((process, _)) if process.log().contains(ADDRESS_IN_USE) => {
                    [sluice.grpc_port, sluice.http_port] = free_ports();
                }
                Err((process, status)) => process.panic_exited(status),
            }
        }
        sluice.restart().await;
        sluice
    }

    /// Starts the process (again) on the same ports and waits until it is ready.
    pub async fn restart(&mut self) {
        if let Err((process, status)) = self.launch().await {
            process.panic_exited(status);
        }
    }

    /// Starts the process on its ports and waits until it is ready; hands the process
    /// and its exit status back if it exits first.
    async fn launch(&mut self) -> Result<(), (Process, ExitStatus)> {
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
        let log = self.logs.path().join("sluice.log");
        // Each start's log on its own: an earlier start's error is not this one's.
        let _ = std::fs::remove_file(&log);
        let mut process = Process::spawn("sluice", command, &log);
        let ready = self.url("/readyz");
        match wait_for_200_or_exit(&ready, Duration::from_secs(10), &mut process).await {
            Ok(()) => {
                self.process = Some(process);
                Ok(())
            }
            Err(status) => Err((process, status)),
        }
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
        crate::fetch_metrics(&self.url("/metrics")).await
    }

    /// Replaces a rule file's contents (written whole, then renamed into place, as a
    /// ConfigMap update does).
    pub fn write_rules(&self, name: &str, text: &str) {
        let staged = self.config_dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&staged, text).expect("write staged rule file");
        std::fs::rename(&staged, self.config_dir.path().join(name)).expect("rename rule file");
    }

    /// The log's first and last lines.
    pub fn log_excerpt(&self) -> String {
        self.process
            .as_ref()
            .map(Process::log_excerpt)
            .unwrap_or_default()
    }
}
