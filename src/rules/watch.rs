//! The reload watcher: notices every change to the config path and reloads the rules.
//!
//! Two sources wake it, so that no edit is missed:
//! - a file watcher (`notify`, debounced by `notify-debouncer-full`) on the config
//!   *directory*, recursively, and on its parent (filtered to events about the config
//!   path itself). Watching directories rather than files is what makes the three ways
//!   files change visible: a write in place, a temp file renamed over the old one, and
//!   the Kubernetes ConfigMap swap (a new `..<timestamp>` directory, the `..data` symlink
//!   renamed over, user files symlinked through `..data`). When the path is a file, its
//!   parent directory is watched. If the watched directory itself is replaced (removed
//!   and re-created, or a directory renamed over it) the watch is re-armed.
//! - a periodic rescan (`--reload-interval`, default 10 s) as a backstop for file
//!   systems without events (NFS, some container overlays) and a full inotify queue.
//!
//! Either way the load is the same: [`LiveRules::reload`] on a blocking thread (file I/O
//! and compilation never run on the async workers), compared by content hash, all files
//! or none. The [`ReloadObserver`] hears every outcome (metrics, logs, readiness).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use notify_debouncer_full::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};
use tokio::sync::{watch, Notify};

use super::live::{LiveRules, ReloadOutcome};
use super::ConfigError;

/// How long the file watcher waits for events to settle before reloading.
pub(crate) const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(200);

/// How often an unarmed watcher (config path missing, watch failed) tries again.
const REARM_INTERVAL: Duration = Duration::from_secs(1);

/// Hears the outcome of every load attempt.
pub(crate) trait ReloadObserver: Send + Sync + 'static {
    /// Called after each attempt, on an async worker; must not block.
    fn reloaded(&self, outcome: &ReloadOutcome);
}

/// Timing of the watcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WatchOptions {
    /// Quiet time after the last file event before reloading.
    pub(crate) debounce: Duration,
    /// Period of the content-hash rescan backstop.
    pub(crate) rescan_interval: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            debounce: DEFAULT_DEBOUNCE,
            rescan_interval: Duration::from_secs(10),
        }
    }
}

/// Reloads the live rules when their files change.
pub(crate) struct Reloader {
    /// The rules it reloads.
    rules: Arc<LiveRules>,
    /// Who hears about each load.
    observer: Arc<dyn ReloadObserver>,
    /// Timing.
    options: WatchOptions,
}

/// An armed file watcher and what it watches.
struct Armed {
    /// Stops the watcher and its debounce thread when dropped.
    _debouncer: Debouncer<RecommendedWatcher, RecommendedCache>,
    /// The directory watched recursively (the config directory, or the directory of
    /// the config file).
    watched: PathBuf,
    /// Identity of `watched` when armed; a different one means it was replaced and
    /// the watch must be re-armed.
    identity: Option<Identity>,
}

/// Device and inode of a directory (followed through symlinks).
type Identity = (u64, u64);

// === impl Reloader ===

impl Reloader {
    /// A reloader for `rules`, reporting to `observer`.
    pub(crate) fn new(
        rules: Arc<LiveRules>,
        observer: Arc<dyn ReloadObserver>,
        options: WatchOptions,
    ) -> Self {
        Self {
            rules,
            observer,
            options,
        }
    }

    /// Loads the rules once (off the async workers) and reports the outcome.
    pub(crate) async fn load_now(&self) {
        let rules = self.rules.clone();
        let outcome = match tokio::task::spawn_blocking(move || rules.reload()).await {
            Ok(outcome) => outcome,
            Err(error) => ReloadOutcome::Failed {
                errors: vec![ConfigError::sluice(
                    "(loader)",
                    "",
                    format!("rule loading task failed: {error}"),
                )],
                repeated: false,
            },
        };
        self.observer.reloaded(&outcome);
    }

    /// Watches and rescans until `stop` turns true (or its sender is dropped).
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let wake = Arc::new(Notify::new());
        let broken = Arc::new(AtomicBool::new(false));
        let mut armed = self.arm(&wake, &broken);
        // Files changed between the startup load and the watch taking effect raise no
        // event: read them once more now that the watch is on (unchanged content is a
        // cheap no-op).
        self.load_now().await;
        let mut rescan = tokio::time::interval(self.options.rescan_interval.max(MIN_INTERVAL));
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rescan.tick().await;
        loop {
            let unarmed = armed.is_none();
            tokio::select! {
                () = wake.notified() => {}
                _ = rescan.tick() => {}
                () = tokio::time::sleep(REARM_INTERVAL), if unarmed => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                    continue;
                }
            }
            let replaced = armed
                .as_ref()
                .is_some_and(|a| a.identity != identity(&a.watched));
            if armed.is_none() || replaced || broken.swap(false, Ordering::SeqCst) {
                drop(armed.take());
                armed = self.arm(&wake, &broken);
            }
            self.load_now().await;
        }
    }

    /// Starts a debounced watcher on the config path; `None` (logged) when it fails,
    /// in which case the rescan alone keeps rules fresh until a re-arm succeeds.
    fn arm(&self, wake: &Arc<Notify>, broken: &Arc<AtomicBool>) -> Option<Armed> {
        // Absolute, so event paths (from either watch) compare with `starts_with`.
        let given = self.rules.path();
        let path = std::path::absolute(given).unwrap_or_else(|_| given.to_path_buf());
        let is_dir = std::fs::metadata(&path).is_ok_and(|m| m.is_dir());
        let parent = parent_of(&path);
        let handler_wake = wake.clone();
        let handler_broken = broken.clone();
        let root = path.clone();
        let handler = move |result: DebounceEventResult| match result {
            Ok(events) => {
                let relevant = events.iter().any(|event| {
                    event
                        .paths
                        .iter()
                        .any(|changed| !is_dir || changed.starts_with(&root))
                });
                if relevant {
                    handler_wake.notify_one();
                }
            }
            Err(errors) => {
                for error in &errors {
                    tracing::warn!(%error, "config watcher error; re-arming");
                }
                handler_broken.store(true, Ordering::SeqCst);
                handler_wake.notify_one();
            }
        };
        let mut debouncer = match new_debouncer(self.options.debounce, None, handler) {
            Ok(debouncer) => debouncer,
            Err(error) => {
                tracing::warn!(%error, "cannot start the config watcher; relying on the periodic rescan");
                return None;
            }
        };
        if is_dir {
            if let Err(error) = debouncer.watch(&path, RecursiveMode::Recursive) {
                tracing::warn!(%error, path = %path.display(), "cannot watch the config directory; relying on the periodic rescan");
                return None;
            }
        }
        // The parent sees the config path itself replaced or (for a file) changed.
        if let Err(error) = debouncer.watch(&parent, RecursiveMode::NonRecursive) {
            if !is_dir {
                tracing::warn!(%error, path = %parent.display(), "cannot watch the config file's directory; relying on the periodic rescan");
                return None;
            }
            tracing::debug!(%error, path = %parent.display(), "cannot watch the config directory's parent");
        }
        tracing::debug!(path = %path.display(), "config watcher armed");
        let watched = if is_dir { path } else { parent };
        Some(Armed {
            _debouncer: debouncer,
            identity: identity(&watched),
            watched,
        })
    }
}

/// Shortest rescan period accepted.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

/// The directory holding `path` (`.` for a bare relative name).
fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Device and inode of `path`, following symlinks; `None` if it does not exist.
#[cfg(unix)]
fn identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Without inodes, only existence is compared.
#[cfg(not(unix))]
fn identity(path: &Path) -> Option<Identity> {
    std::fs::metadata(path).ok().map(|_| (0, 0))
}
