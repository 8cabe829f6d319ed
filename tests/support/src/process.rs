//! The real `sluice` binary as a child process, for what only a process shows: signals,
//! the exit, exporters that flush on the way out.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `sluice serve` process, killed on drop.
pub struct SluiceProcess {
    child: Child,
    /// The WARN and ERROR lines read from its log so far.
    warnings: Arc<Mutex<Vec<String>>>,
    /// Every line read from its log so far.
    lines: Arc<Mutex<Vec<String>>>,
    /// Reads its log until the process closes its stdout.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl SluiceProcess {
    /// Starts `sluice serve --config CONFIG` on ports 0 with JSON logs and `extra` flags.
    /// Returns it with its gRPC and HTTP addresses, read from its `sluice serving` line;
    /// every log line is echoed to stderr after `sluice: `, and a line that is not JSON
    /// fails the test.
    pub fn serve(config: &Path, extra: &[&str]) -> (Self, String, String) {
        Self::serve_with_env(config, extra, &[])
    }

    /// [`Self::serve`] with `env` added to its environment.
    pub fn serve_with_env(
        config: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (Self, String, String) {
        let config = config.to_str().expect("a UTF-8 path");
        let mut args = vec!["serve", "--config", config];
        args.extend(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]);
        args.extend(["--log-format", "json"]);
        args.extend(extra);
        Self::start(&args, env)
    }

    /// Starts `sluice ARGS` with `env` added to the test's environment; it must log JSON
    /// (`--log-format json` or `LOG_FORMAT=json`). Returns as [`Self::serve`] does.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> (Self, String, String) {
        let mut child = Command::new(crate::sluice_bin())
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sluice");
        let stdout = child.stdout.take().expect("stdout");
        let warnings = Arc::new(Mutex::new(Vec::new()));
        let logged = warnings.clone();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let all = lines.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
                    panic!("--log-format json wrote a non-JSON line: {line}");
                };
                if json["level"] == "WARN" || json["level"] == "ERROR" {
                    logged.lock().expect("warnings").push(line.clone());
                }
                let fields = &json["fields"];
                if fields["message"] == "sluice serving" {
                    let addr = |name: &str| fields[name].as_str().unwrap_or_default().to_owned();
                    let _ = tx.send((addr("grpc"), addr("http")));
                }
                eprintln!("sluice: {line}");
                all.lock().expect("lines").push(line);
            }
        });
        let process = Self {
            child,
            warnings,
            lines,
            reader: Some(reader),
        };
        let (grpc, http) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("sluice logged its addresses");
        (process, grpc, http)
    }

    /// Every WARN and ERROR line it logged, once it has exited (see [`Self::wait_exit`]):
    /// waits for its whole log to be read.
    pub fn warnings_after_exit(&mut self) -> Vec<String> {
        assert!(
            self.child.try_wait().expect("wait").is_some(),
            "sluice is still running"
        );
        if let Some(reader) = self.reader.take() {
            reader.join().expect("log reader");
        }
        self.warnings.lock().expect("warnings").clone()
    }

    /// The log lines read so far that contain `needle`.
    pub fn log_lines_with(&self, needle: &str) -> Vec<String> {
        let lines = self.lines.lock().expect("lines");
        lines
            .iter()
            .filter(|line| line.contains(needle))
            .cloned()
            .collect()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(killed.success(), "kill -TERM failed");
    }

    /// Waits up to `within` for the exit; fails the test past it.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
