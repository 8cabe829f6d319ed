//! The live rule set: an immutable [`RuleSet`] swapped atomically on reload. Requests
//! in flight keep the snapshot they started with; a failed load keeps the old one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use sha2::{Digest, Sha256};

use crate::rules::{read_config_path, ConfigError, ConfigFile, LoadOptions, Rules};

/// One loaded, validated and compiled rule set.
#[derive(Debug)]
pub struct RuleSet {
    /// The compiled rules.
    pub rules: Rules,
    /// 1 for the first successful load, then +1 per successful reload.
    pub version: u64,
    /// SHA-256 (hex) over the names and contents of the files it came from.
    pub hash: String,
    /// When it was loaded.
    pub loaded_at: SystemTime,
}

/// The outcome of the last load attempt, for `/status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// When the attempt ran.
    pub at: Option<SystemTime>,
    /// The errors (file, path, reason), empty on success.
    pub errors: Vec<String>,
}

/// The rule set requests read, and how it was last loaded.
#[derive(Debug)]
pub struct LiveRules {
    /// Where rules are read from.
    path: PathBuf,
    /// How files are combined.
    options: LoadOptions,
    /// The active rule set; `None` until a load succeeds.
    current: ArcSwapOption<RuleSet>,
    /// Version of the next successful load.
    next_version: AtomicU64,
    /// The last attempt's outcome.
    last: Mutex<LoadReport>,
    /// Content hash of the last files that failed to load: unchanged bad files are not
    /// reloaded (nor re-reported) on every rescan.
    failed_hash: Mutex<Option<String>>,
}

impl LiveRules {
    /// Live rules read from `path` (a file or a directory); nothing is loaded yet.
    pub fn new(path: impl Into<PathBuf>, options: LoadOptions) -> Self {
        Self {
            path: path.into(),
            options,
            current: ArcSwapOption::empty(),
            next_version: AtomicU64::new(1),
            last: Mutex::new(LoadReport::default()),
            failed_hash: Mutex::new(None),
        }
    }

    /// The config path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The active rule set, if any load has succeeded.
    pub fn current(&self) -> Option<Arc<RuleSet>> {
        self.current.load_full()
    }

    /// Reads, validates and compiles the files at the config path. On success the new
    /// set replaces the old one (returns `Ok(true)`, or `Ok(false)` when the content
    /// hash is unchanged and nothing was swapped); on failure the old set stays.
    pub fn reload(&self) -> Result<bool, Vec<ConfigError>> {
        let mut failed_hash = lock(&self.failed_hash);
        let outcome = read_config_path(&self.path)
            .map_err(|error| vec![error])
            .and_then(|files| {
                let hash = content_hash(&files);
                if self.current().is_some_and(|set| set.hash == hash)
                    || failed_hash.as_deref() == Some(hash.as_str())
                {
                    return Ok(None);
                }
                Rules::compile(&files, &self.options)
                    .map(|rules| Some((rules, hash.clone())))
                    .inspect_err(|_| *failed_hash = Some(hash))
            });
        drop(failed_hash);
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.at = Some(now());
        match outcome {
            Ok(None) => Ok(false),
            Ok(Some((rules, hash))) => {
                last.errors.clear();
                *lock(&self.failed_hash) = None;
                let version = self.next_version.fetch_add(1, Ordering::SeqCst);
                self.current.store(Some(Arc::new(RuleSet {
                    rules,
                    version,
                    hash,
                    loaded_at: now(),
                })));
                Ok(true)
            }
            Err(errors) => {
                last.errors = errors.iter().map(ToString::to_string).collect();
                Err(errors)
            }
        }
    }

    /// The last load attempt's outcome.
    pub fn last_report(&self) -> LoadReport {
        lock(&self.last).clone()
    }
}

/// Hash over file names and contents, in load order.
pub fn content_hash(files: &[ConfigFile]) -> String {
    let mut hasher = Sha256::new();
    for file in files {
        hasher.update((file.name.len() as u64).to_be_bytes());
        hasher.update(file.name.as_bytes());
        hasher.update((file.text.len() as u64).to_be_bytes());
        hasher.update(file.text.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Wall-clock time for reports (not for decisions, which use the store's clock).
#[allow(clippy::disallowed_methods)]
fn now() -> SystemTime {
    SystemTime::now()
}

/// Locks a mutex whose data stays valid even if a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
