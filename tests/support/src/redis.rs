//! Real Redis servers for tests: a standalone `redis-server` and a 3-master cluster (with
//! or without one replica per master) made with `redis-cli --cluster create`, on free
//! loopback ports, killed on drop. A server can be killed and restarted on its port.

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
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A directory for one server's files, in memory (`/dev/shm`) where the machine has it:
/// a cluster node fsyncs `nodes.conf` on its main thread whenever it votes in a
/// failover or learns a new epoch, and on a disk busy with a build's writes that fsync
/// can hold a healthy primary for tens of milliseconds (the likeliest cause of one CI
/// failure: a healthy slot refused twice, 55 ms, past a 50 ms store timeout, during
/// `CLUSTER FAILOVER`).
fn data_dir() -> tempfile::TempDir {
    let mut builder = tempfile::Builder::new();
    builder.prefix("sluice-redis-");
    builder
        .tempdir_in("/dev/shm")
        .or_else(|_| builder.tempdir())
        .expect("temp dir")
}

/// File name of a server's Unix socket, in its data directory.
const SOCKET: &str = "redis.sock";

/// One `redis-server` process.
pub struct RedisServer {
    /// Its loopback port.
    pub port: u16,
    child: Option<Child>,
    /// Extra arguments, kept for restarts.
    extra: Vec<String>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::spawn(&[])
    }

    /// A standalone server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::spawn(extra)
    }

    /// A standalone server that also listens on a Unix socket ([`RedisServer::socket_url`]).
    pub fn start_with_unix_socket() -> Self {
        let dir = data_dir();
        let socket = dir.path().join(SOCKET).to_string_lossy().into_owned();
        let extra = ["--unixsocket", socket.as_str(), "--unixsocketperm", "700"];
        Self::spawn_in(dir, &extra)
    }

    /// A standalone server on `port` (e.g. one a Sluice server already points at).
    pub fn start_on(port: u16) -> Self {
        let dir = data_dir();
        let child = Self::launch(port, &dir, &[]);
        let server = Self {
            port,
            child: Some(child),
            extra: Vec::new(),
            dir,
        };
        server.wait_ready();
        server
    }

    /// `kill -9`: the process dies at once, connections break without a goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port with the same arguments (empty: no
    /// persistence), and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.child = Some(Self::launch(self.port, &self.dir, &extra));
        self.wait_ready();
    }

    fn spawn(extra: &[&str]) -> Self {
        Self::spawn_in(data_dir(), extra)
    }

    fn spawn_in(dir: tempfile::TempDir, extra: &[&str]) -> Self {
        let port = free_port();
        let child = Self::launch(port, &dir, extra);
        let server = Self {
            port,
            child: Some(child),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            dir,
        };
        server.wait_ready();
        server
    }

    fn launch(port: u16, dir: &tempfile::TempDir, extra: &[&str]) -> Child {
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
        Command::new(server_bin())
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot run redis-server ({error}): {INSTALL}"))
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let answer = self.cli(&["ping"]);
            if answer.trim() == "PONG" || answer.contains("NOAUTH") {
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

    /// `redis://` URL of the server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The URL of its Unix socket (started by [`RedisServer::start_with_unix_socket`]).
    pub fn socket_url(&self) -> String {
        format!("unix://{}", self.dir.path().join(SOCKET).display())
    }

    /// Calls of `command` (lower case, e.g. `fcall`) since start or `CONFIG RESETSTAT`,
    /// from `INFO commandstats`.
    pub fn command_calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0)
    }

    /// Script calls Sluice made: `FCALL` and `EVALSHA` (whichever the store sends).
    pub fn script_calls(&self) -> u64 {
        self.command_calls("fcall") + self.command_calls("evalsha")
    }

    /// The URL of a new user allowed everything but Redis Functions (`FCALL`, `FUNCTION`),
    /// as on a Redis before 7 or under an ACL written for `EVALSHA`.
    pub fn url_without_functions(&self) -> String {
        self.cli(&[
            "ACL",
            "SETUSER",
            "nofunctions",
            "on",
            ">nofunctions-pw",
            "~*",
            "&*",
            "+@all",
            "-fcall",
            "-fcall_ro",
            "-function",
        ]);
        format!("redis://nofunctions:nofunctions-pw@127.0.0.1:{}", self.port)
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// This node's own `CLUSTER NODES` line.
    pub fn myself(&self) -> Option<String> {
        self.cli(&["cluster", "nodes"])
            .lines()
            .find(|line| line.contains("myself"))
            .map(str::to_owned)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 3-master Redis Cluster, without replicas or with one per master.
pub struct RedisCluster {
    /// Every node, in start order.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// 3 masters, no replicas, node timeout 500 ms.
    pub fn start() -> Self {
        Self::create(0, "500")
    }

    /// 3 masters with one replica each (6 nodes), node timeout 2 s: a killed primary is
    /// replaced by its replica.
    pub fn start_with_replicas() -> Self {
        Self::create(1, "2000")
    }

    fn create(replicas: usize, node_timeout: &str) -> Self {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                RedisServer::spawn(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    node_timeout,
                    // A dead primary takes down only its own slots, not every slot.
                    "--cluster-require-full-coverage",
                    "no",
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
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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
            let ok = cluster.nodes.iter().all(|node| {
                node.cli(&["cluster", "info"]).contains("cluster_state:ok")
                    && (replicas == 0
                        || node.cli(&["role"]).lines().next() != Some("slave")
                        || node
                            .cli(&["info", "replication"])
                            .contains("master_link_status:up"))
            });
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

    /// The node that serves `slot` as a primary now.
    pub fn primary_of(&self, slot: u16) -> usize {
        self.nodes
            .iter()
            .position(|node| {
                node.child.is_some()
                    && node.myself().is_some_and(|line| {
                        line.split_whitespace()
                            .nth(2)
                            .is_some_and(|flags| flags.contains("master"))
                            && owns(&line, slot)
                    })
            })
            .unwrap_or_else(|| panic!("no live primary serves slot {slot}"))
    }

    /// Index of the first node still running.
    pub fn any_live(&self) -> usize {
        self.nodes
            .iter()
            .position(|node| node.child.is_some())
            .expect("a live node")
    }

    /// Index of a replica of primary `primary`.
    pub fn replica_of(&self, primary: usize) -> usize {
        let id = self.nodes[primary]
            .cli(&["cluster", "myid"])
            .trim()
            .to_owned();
        self.nodes
            .iter()
            .position(|node| {
                node.child.is_some()
                    && node
                        .myself()
                        .is_some_and(|line| line.split_whitespace().nth(3) == Some(id.as_str()))
            })
            .expect("a replica of the primary")
    }

    /// Waits until every live node says `cluster_state:ok` and no slot is served by a
    /// dead node.
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self
                .nodes
                .iter()
                .filter(|node| node.child.is_some())
                .all(|node| node.cli(&["cluster", "info"]).contains("cluster_state:ok"));
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not recover");
            std::thread::sleep(Duration::from_millis(50));
        }
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

/// Store options for tests: generous timeout, default batching.
pub fn store_options(
    mode: sluice::store::redis::RedisMode,
    url: String,
) -> sluice::store::redis::RedisOptions {
    sluice::store::redis::RedisOptions {
        mode,
        url,
        auth: None,
        tls: false,
        tls_files: Default::default(),
        timeout: Duration::from_secs(2),
        batch_window: Duration::from_micros(100),
        batch_max: 256,
        queue: 4096,
        key_prefix: Default::default(),
    }
}

/// A Redis store at `url`, once its connection is up.
pub async fn connected_store(
    mode: sluice::store::redis::RedisMode,
    url: String,
) -> sluice::store::redis::RedisStore {
    connected_store_with(&store_options(mode, url)).await
}

/// A Redis store with `options`, once its connection is up.
pub async fn connected_store_with(
    options: &sluice::store::redis::RedisOptions,
) -> sluice::store::redis::RedisStore {
    let metrics = std::sync::Arc::new(sluice::telemetry::Metrics::new());
    let store = sluice::store::redis::RedisStore::new(options, metrics).expect("redis store");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !store.is_connected() {
        assert!(Instant::now() < deadline, "redis store did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn owns(line: &str, slot: u16) -> bool {
    line.split_whitespace().skip(8).any(|range| {
        let (start, end) = range.split_once('-').unwrap_or((range, range));
        match (start.parse::<u16>(), end.parse::<u16>()) {
            (Ok(start), Ok(end)) => (start..=end).contains(&slot),
            _ => false,
        }
    })
}
