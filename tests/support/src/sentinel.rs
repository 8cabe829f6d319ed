//! A real Sentinel deployment for tests: a primary, one replica and three
//! `redis-sentinel` processes on free loopback ports, watching the primary as `mymaster`
//! with a 1 s `down-after-milliseconds`. Every process is killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis::{free_port, RedisServer};

const INSTALL: &str = "install redis-sentinel (scripts/test does: apt-get install redis-sentinel)";

/// The service name the sentinels watch.
pub const SERVICE: &str = "mymaster";

/// How long a primary must be silent before the sentinels call it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

fn sentinel_bin() -> String {
    std::env::var("SLUICE_REDIS_SENTINEL_BIN").unwrap_or_else(|_| "redis-sentinel".into())
}

/// One `redis-sentinel` process.
struct Sentinel {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A primary, a replica and three sentinels.
pub struct SentinelSetup {
    /// The two data nodes; `servers[0]` is the primary at start.
    pub servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
}

impl SentinelSetup {
    /// Starts the five processes and waits until the sentinels know the replica and
    /// each other (a failover needs both) and the replica is in sync.
    pub fn start() -> Self {
        // `DEBUG SLEEP` hangs the primary in the tests: allowed from loopback only.
        let debug = ["--enable-debug-command", "local"];
        let primary = RedisServer::start_with(&debug);
        let port = primary.port.to_string();
        let replica = RedisServer::start_with(&[
            "--enable-debug-command",
            "local",
            "--replicaof",
            "127.0.0.1",
            &port,
        ]);
        let sentinels = (0..3).map(|_| Self::sentinel(primary.port)).collect();
        let setup = Self {
            servers: vec![primary, replica],
            sentinels,
        };
        setup.wait_ready();
        setup
    }

    fn sentinel(primary: u16) -> Sentinel {
        let dir = tempfile::Builder::new()
            .prefix("sluice-sentinel-")
            .tempdir()
            .expect("temp dir");
        let port = free_port();
        let config = dir.path().join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {SERVICE} {down}\n\
             sentinel failover-timeout {SERVICE} 10000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            dir = dir.path().display(),
            down = DOWN_AFTER.as_millis(),
        );
        std::fs::write(&config, text).expect("write sentinel.conf");
        let child = Command::new(sentinel_bin())
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot run redis-sentinel ({error}): {INSTALL}"));
        Sentinel {
            port,
            child,
            _dir: dir,
        }
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = self.sentinels.iter().all(|sentinel| {
                let master = self.ask(sentinel.port, &["SENTINEL", "master", SERVICE]);
                let field = |name: &str| {
                    let lines: Vec<&str> = master.lines().collect();
                    lines
                        .iter()
                        .position(|line| *line == name)
                        .and_then(|at| lines.get(at + 1))
                        .map(|value| value.to_string())
                        .unwrap_or_default()
                };
                field("num-slaves") == "1" && field("num-other-sentinels") == "2"
            });
            let synced = self.servers[1]
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up");
            if ready && synced {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not see the replica and each other within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis-cli` against the sentinel on `port`.
    fn ask(&self, port: u16, args: &[&str]) -> String {
        let cli = std::env::var("SLUICE_REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".into());
        let output = Command::new(cli)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The port of the primary the first sentinel names now.
    pub fn primary_port(&self) -> Option<u16> {
        let answer = self.ask(
            self.sentinels[0].port,
            &["SENTINEL", "get-master-addr-by-name", SERVICE],
        );
        answer.lines().nth(1)?.trim().parse().ok()
    }

    /// Index in `servers` of the server on `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|server| server.port == port)
            .expect("a known server")
    }

    /// The URL forms the README documents: fred's `redis-sentinel://` with `?node=`
    /// for the other sentinels, and the reference's `NAME,host:port,...`.
    pub fn urls(&self) -> [String; 2] {
        let [a, b, c] = [0, 1, 2].map(|i| format!("127.0.0.1:{}", self.sentinels[i].port));
        [
            format!("redis-sentinel://{a}?sentinelServiceName={SERVICE}&node={b}&node={c}"),
            format!("{SERVICE},{a},{b},{c}"),
        ]
    }
}
