//! Real Redis servers for tests: a standalone `redis-server` and a 3-master cluster made
//! with `redis-cli --cluster create`, on free loopback ports, killed on drop.
#![allow(dead_code, missing_docs)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str =
    "install redis-server and redis-tools (scripts/test does: apt-get install redis-server redis-tools)";

fn server_bin() -> String {
    std::env::var("SLUICE_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into())
}

fn cli_bin() -> String {
    std::env::var("SLUICE_REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".into())
}

/// A free loopback port whose cluster bus port (+10000) is free too.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One `redis-server` process.
pub struct RedisServer {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::spawn(&[])
    }

    fn spawn(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let port_text = port.to_string();
        let dir_text = dir.path().to_string_lossy().into_owned();
        let mut args = vec![
            "--port",
            port_text.as_str(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            dir_text.as_str(),
        ];
        args.extend_from_slice(extra);
        let child = Command::new(server_bin())
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot run redis-server ({error}): {INSTALL}"));
        let server = Self {
            port,
            child,
            _dir: dir,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["ping"]).trim() == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// Runs `redis-cli -p PORT args...` and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new(cli_bin())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("cannot run redis-cli ({error}): {INSTALL}"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A 3-master Redis Cluster without replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::spawn(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "500",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let output = Command::new(cli_bin())
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|error| panic!("cannot run redis-cli ({error}): {INSTALL}"));
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Self { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = cluster
                .nodes
                .iter()
                .all(|node| node.cli(&["cluster", "info"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// Comma-separated seed list.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("redis://127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",")
    }
}
