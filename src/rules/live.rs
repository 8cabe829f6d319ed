//! The live rule set: an immutable [`RuleSet`] swapped atomically on reload. Requests
//! in flight keep the snapshot they started with; a failed load keeps the old one.
//!
//! A load compiles every file or none: an error in one file keeps the whole previous
//! set. Content is compared by hash, so re-reading unchanged files (the periodic rescan)
//! costs a read and a hash, never a compile, and a bad edit is reported once, not on
//! every rescan.

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
    pub(crate) version: u64,
    /// SHA-256 (hex) over the names and contents of the files it came from.
    pub(crate) hash: String,
    /// When it was loaded.
    pub(crate) loaded_at: SystemTime,
}

/// What one load attempt did.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The files are as last seen (loaded or rejected): nothing changed.
    Unchanged,
    /// A new rule set was compiled and swapped in.
    Loaded(Arc<RuleSet>),
    /// The files could not be loaded; the previous rule set (if any) keeps serving.
    Failed {
        /// Every error found, in file order.
        errors: Vec<ConfigError>,
        /// The same errors as the previous attempt (a rescan of still-broken files):
        /// already reported.
        repeated: bool,
    },
}

/// One load error, in the shape `/status` shows.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct LoadErrorInfo {
    /// The file (relative to the config path) or path the error is about.
    pub(crate) file: String,
    /// 1-based line, when the parser knows it.
    pub(crate) line: Option<u64>,
    /// 1-based column, when the parser knows it.
    pub(crate) column: Option<u64>,
    /// Why, without the file name.
    pub(crate) reason: String,
    /// The full message as logged.
    pub(crate) message: String,
}

/// The outcome of load attempts, for `/status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LoadReport {
    /// When the config path was last read, whatever the outcome.
    pub(crate) checked_at: Option<SystemTime>,
    /// When new content was last loaded or rejected.
    pub(crate) changed_at: Option<SystemTime>,
    /// The errors of the last attempt on new content; empty after a success.
    pub(crate) errors: Vec<LoadErrorInfo>,
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
    /// The last attempts' outcome, and the hash of the content last compiled (loaded
    /// or rejected), so unchanged content is not compiled or reported again.
    last: Mutex<(LoadReport, Option<String>)>,
}

impl LiveRules {
    /// Live rules read from `path` (a file or a directory); nothing is loaded yet.
    pub fn new(path: impl Into<PathBuf>, options: LoadOptions) -> Self {
        Self {
            path: path.into(),
            options,
            current: ArcSwapOption::empty(),
            next_version: AtomicU64::new(1),
            last: Mutex::new((LoadReport::default(), None)),
        }
    }

    /// The config path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The active rule set, if any load has succeeded.
    pub fn current(&self) -> Option<Arc<RuleSet>> {
        self.current.load_full()
    }

    /// Reads, validates and compiles the files at the config path (blocking: call it
    /// off the async workers). New content that compiles replaces the active set; any
    /// error keeps it. Unchanged content is neither compiled nor reported again.
    pub fn reload(&self) -> ReloadOutcome {
        self.take(read_config_path(&self.path))
    }

    /// Validates and compiles rule files received rather than read (xDS resources),
    /// as [`LiveRules::reload`] does files: they are the whole rule set.
    pub(crate) fn apply(&self, files: Vec<ConfigFile>) -> ReloadOutcome {
        self.take(Ok(files))
    }

    /// Loads what was read (or the error of reading it).
    fn take(&self, read: Result<Vec<ConfigFile>, ConfigError>) -> ReloadOutcome {
        let read = read.map(|files| {
            let hash = content_hash(&files);
            (files, hash)
        });
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (report, last_hash) = &mut *last;
        let now = now();
        report.checked_at = Some(now);
        let (files, hash) = match read {
            Ok(read) => read,
            Err(error) => {
                let errors = vec![error];
                let infos = infos(&errors);
                let repeated = last_hash.is_none() && report.errors == infos;
                if !repeated {
                    report.changed_at = Some(now);
                }
                report.errors = infos;
                *last_hash = None;
                return ReloadOutcome::Failed { errors, repeated };
            }
        };
        if last_hash.as_deref() == Some(hash.as_str()) {
            return ReloadOutcome::Unchanged;
        }
        report.changed_at = Some(now);
        *last_hash = Some(hash.clone());
        match Rules::compile(&files, &self.options) {
            Ok(rules) => {
                report.errors.clear();
                let version = self.next_version.fetch_add(1, Ordering::SeqCst);
                let set = Arc::new(RuleSet {
                    rules,
                    version,
                    hash,
                    loaded_at: now,
                });
                self.current.store(Some(set.clone()));
                ReloadOutcome::Loaded(set)
            }
            Err(errors) => {
                report.errors = infos(&errors);
                ReloadOutcome::Failed {
                    errors,
                    repeated: false,
                }
            }
        }
    }

    /// The last load attempts' outcome.
    pub(crate) fn last_report(&self) -> LoadReport {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone()
    }
}

fn infos(errors: &[ConfigError]) -> Vec<LoadErrorInfo> {
    errors
        .iter()
        .map(|error| {
            let (line, column) = error.position();
            LoadErrorInfo {
                file: error.file(),
                line,
                column,
                reason: error.reason(),
                message: error.to_string(),
            }
        })
        .collect()
}

/// Hash over file names and contents, in load order.
pub(crate) fn content_hash(files: &[ConfigFile]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

    #[test]
    fn reports_each_new_content_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("rules.yaml");
        let rules = LiveRules::new(dir.path(), LoadOptions::default());
        std::fs::write(&file, GOOD).expect("write");
        assert!(matches!(rules.reload(), ReloadOutcome::Loaded(set) if set.version == 1));
        assert!(matches!(rules.reload(), ReloadOutcome::Unchanged));

        std::fs::write(
            &file,
            "domain: a\ndescriptors: [{key: k, rate_limit: {unit: fortnight}}]\n",
        )
        .expect("write");
        assert!(matches!(
            rules.reload(),
            ReloadOutcome::Failed {
                repeated: false,
                ..
            }
        ));
        // Still broken, same content: not compiled or reported again.
        assert!(matches!(rules.reload(), ReloadOutcome::Unchanged));
        assert_eq!(rules.last_report().errors.len(), 1);
        assert_eq!(rules.current().map(|set| set.version), Some(1));

        std::fs::remove_dir_all(dir.path()).expect("remove");
        assert!(matches!(
            rules.reload(),
            ReloadOutcome::Failed {
                repeated: false,
                ..
            }
        ));
        assert!(matches!(
            rules.reload(),
            ReloadOutcome::Failed { repeated: true, .. }
        ));

        std::fs::create_dir(dir.path()).expect("re-create");
        std::fs::write(&file, GOOD).expect("write");
        // The same content as the active set, but after failures: loaded again.
        assert!(matches!(rules.reload(), ReloadOutcome::Loaded(set) if set.version == 2));
        assert!(rules.last_report().errors.is_empty());
    }
}
