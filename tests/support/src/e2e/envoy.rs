//! Envoy running `deploy/envoy/envoy.yaml` with every port replaced by a free one.

use std::process::Command;
use std::time::Duration;

use super::{envoy_bin, free_ports, wait_for_200, Process};
use crate::repo_root;

/// The example bootstrap's ports, as written in `deploy/envoy/envoy.yaml`.
const ADMIN: u16 = 9901;
const INGRESS: u16 = 10000;
const FAIL_OPEN: u16 = 10001;
const BACKEND: u16 = 10002;
const SLUICE: u16 = 8081;

/// A running Envoy.
pub struct Envoy {
    /// Admin port.
    pub admin_port: u16,
    /// The fail-closed ingress listener.
    pub ingress_port: u16,
    /// The fail-open ingress listener.
    pub fail_open_port: u16,
    /// Holds the bootstrap and the log while Envoy runs.
    _dir: tempfile::TempDir,
    process: Process,
}

impl Envoy {
    /// Starts Envoy with the example bootstrap, its rate limit cluster pointing at
    /// `sluice_grpc_port`, and waits until the admin port says it is ready.
    pub async fn start(sluice_grpc_port: u16) -> Self {
        let template = std::fs::read_to_string(repo_root().join("deploy/envoy/envoy.yaml"))
            .expect("read deploy/envoy/envoy.yaml");
        let [admin_port, ingress_port, fail_open_port, backend_port] = free_ports();
        let bootstrap = render_ports(
            &template,
            &[
                (ADMIN, admin_port),
                (INGRESS, ingress_port),
                (FAIL_OPEN, fail_open_port),
                (BACKEND, backend_port),
                (SLUICE, sluice_grpc_port),
            ],
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let process = spawn_ready(dir.path(), &bootstrap, admin_port).await;
        Self {
            admin_port,
            ingress_port,
            fail_open_port,
            _dir: dir,
            process,
        }
    }

    /// [`Envoy::start`] in front of the Sluice whose gRPC listener is `grpc_addr`
    /// (`host:port`, as [`crate::process::SluiceProcess`] reports it).
    pub async fn start_for(grpc_addr: &str) -> Self {
        let port = grpc_addr
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no port in the gRPC address {grpc_addr:?}"));
        Self::start(port).await
    }

    /// A URL on the fail-closed ingress listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.ingress_port)
    }

    /// A URL on the fail-open ingress listener.
    pub fn fail_open_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.fail_open_port)
    }

    /// One counter from the admin `/stats` (0 when absent).
    pub async fn stat(&self, name: &str) -> u64 {
        let text = reqwest::get(format!(
            "http://127.0.0.1:{}/stats?filter=^{name}$",
            self.admin_port
        ))
        .await
        .expect("GET /stats")
        .text()
        .await
        .expect("stats body");
        text.lines()
            .filter_map(|line| line.split_once(": "))
            .find(|(key, _)| *key == name)
            .and_then(|(_, value)| value.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The log's last lines.
    pub fn log_excerpt(&self) -> String {
        self.process.log_excerpt()
    }
}

/// Replaces every `port_value: FROM` with `port_value: TO`; panics if a port is absent,
/// so the template and this harness cannot drift apart silently.
pub fn render_ports(template: &str, ports: &[(u16, u16)]) -> String {
    let mut text = template.to_owned();
    for (from, to) in ports {
        let needle = format!("port_value: {from}}}");
        assert!(
            text.contains(&needle),
            "bootstrap template has no `{needle}`"
        );
        text = text.replace(&needle, &format!("port_value: {to}}}"));
    }
    text
}

/// Runs Envoy on `bootstrap` (written into `dir`, which also takes its log) and waits
/// until the admin port `admin_port` says it is ready.
pub async fn spawn_ready(dir: &std::path::Path, bootstrap: &str, admin_port: u16) -> Process {
    let config = dir.join("envoy.yaml");
    std::fs::write(&config, bootstrap).expect("write bootstrap");
    let mut command = Command::new(envoy_bin());
    command
        .arg("-c")
        .arg(&config)
        // No hot restart: nothing restarts these Envoys, and its shared memory
        // (`/dev/shm/envoy_shared_memory_<base id>`) outlives an Envoy that is killed.
        // Without it there is no base id to collide between tests either.
        .args(["--disable-hot-restart", "--concurrency", "1"])
        .args(["--log-level", "warn"]);
    let mut process = Process::spawn("envoy", command, &dir.join("envoy.log"));
    wait_for_200(
        &format!("http://127.0.0.1:{admin_port}/ready"),
        Duration::from_secs(20),
        &mut process,
    )
    .await;
    process
}
