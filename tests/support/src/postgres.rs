//! A real PostgreSQL server for tests, from Debian's packages: `initdb` into a temporary
//! directory and `postgres` on a free loopback port, as the unprivileged user `nobody`
//! when the tests run as root (PostgreSQL refuses to run as root). Killed (`kill -9`, the
//! whole process group) on drop or by [`Postgres::kill`]; [`Postgres::restart`] starts
//! it again on the same port and data, with crash recovery.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis::free_port;

const INSTALL: &str = "install PostgreSQL (scripts/test does: apt-get install postgresql)";

/// The unprivileged user the server runs as when the tests run as root.
const USER: &str = "nobody";

/// The directory of `initdb`, `postgres`, `pg_isready` and `psql`: `SLUICE_PG_BIN_DIR`,
/// else the newest `/usr/lib/postgresql/*/bin`.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("SLUICE_PG_BIN_DIR") {
        return dir.into();
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap_or_else(|error| panic!("no /usr/lib/postgresql ({error}): {INSTALL}"))
        .filter_map(|entry| entry.ok().map(|entry| entry.path().join("bin")))
        .filter(|dir| dir.join("postgres").exists())
        .collect();
    dirs.sort();
    dirs.pop()
        .unwrap_or_else(|| panic!("no PostgreSQL server in /usr/lib/postgresql: {INSTALL}"))
}

fn is_root() -> bool {
    // Effective uid from /proc: no libc call needed.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

/// `program` from the PostgreSQL bin directory, run as [`USER`] when we are root.
fn as_server_user(program: &str) -> Command {
    let path = bin_dir().join(program);
    if is_root() {
        let mut command = Command::new("setpriv");
        command
            .args([
                "--reuid",
                USER,
                "--regid",
                "nogroup",
                "--clear-groups",
                "--",
            ])
            .arg(path);
        command
    } else {
        Command::new(path)
    }
}

/// One PostgreSQL server.
pub struct Postgres {
    /// Its loopback port.
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `-c` settings besides the defaults (TLS).
    settings: Vec<String>,
}

impl Postgres {
    /// A new cluster (user `sluice`, trust authentication on loopback), started.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// [`Postgres::start`], serving TLS with `server`'s certificate and refusing every
    /// TCP connection without it (`hostssl` only in `pg_hba.conf`).
    pub fn start_with_tls(server: &crate::pki::Leaf) -> Self {
        Self::start_with(Some(server))
    }

    fn start_with(tls: Option<&crate::pki::Leaf>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("sluice-pg-")
            .tempdir()
            .expect("temp dir");
        if is_root() {
            let status = Command::new("chown")
                .args([
                    &format!("{USER}:nogroup"),
                    &dir.path().display().to_string(),
                ])
                .status()
                .expect("run chown");
            assert!(status.success(), "chown of the PostgreSQL data directory");
        }
        let data = dir.path().join("data");
        let output = as_server_user("initdb")
            .args([
                "-U",
                "sluice",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .output()
            .unwrap_or_else(|error| panic!("cannot run initdb ({error}): {INSTALL}"));
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut settings = Vec::new();
        if let Some(leaf) = tls {
            let (cert, key) = leaf.write(dir.path(), "server");
            if is_root() {
                for file in [&cert, &key] {
                    let status = Command::new("chown")
                        .arg(format!("{USER}:nogroup"))
                        .arg(file)
                        .status()
                        .expect("run chown");
                    assert!(status.success(), "chown of {}", file.display());
                }
            }
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
                .expect("key mode 0600");
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\n\
                 hostssl all all 127.0.0.1/32 trust\n\
                 hostnossl all all 127.0.0.1/32 reject\n",
            )
            .expect("write pg_hba.conf");
            settings.push("ssl=on".to_owned());
            settings.push(format!("ssl_cert_file={}", cert.display()));
            settings.push(format!("ssl_key_file={}", key.display()));
        }
        let mut server = Self {
            port: free_port(),
            child: None,
            dir,
            settings,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let data = self.dir.path().join("data");
        let child = as_server_user("postgres")
            .arg("-D")
            .arg(&data)
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
            ])
            .args(self.settings.iter().flat_map(|setting| ["-c", setting]))
            // Its own process group, so that a kill reaches every backend too.
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot run postgres ({error}): {INSTALL}"));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ready = Command::new(bin_dir().join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("postgres on port {} did not start within 30 s", self.port);
    }

    /// `kill -9` of the server and its backends: connections break without a goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-9", "--", &group]).status();
            let _ = child.kill();
            let _ = child.wait();
            // Backends leave a moment after the postmaster.
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts it again on the same port and data (crash recovery after a kill).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// The URL Sluice takes (`--ledger-url`).
    pub fn url(&self) -> String {
        format!("postgres://sluice@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs `sql` with `psql` and returns its unaligned, tuples-only output.
    pub fn query(&self, sql: &str) -> String {
        let output = Command::new(bin_dir().join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args([
                "-U",
                "sluice",
                "-d",
                "postgres",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
            ])
            .arg(sql)
            .output()
            .unwrap_or_else(|error| panic!("cannot run psql ({error}): {INSTALL}"));
        assert!(
            output.status.success(),
            "psql failed on `{sql}`: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill();
    }
}
