//! A value built from files and rebuilt when one of them changes, for TLS certificates
//! rotated on disk (cert-manager, a mounted Kubernetes secret) without a restart.
//!
//! Nothing watches the files: each use asks for the value ([`Reloading::get`]), which
//! first compares the files' stamps (modification time, length, inode, so an atomic
//! rename counts) with those the value was built from. TLS asks once per handshake, so
//! the cost is a `stat` per file per new connection. A rebuild that fails (a half-written
//! rotation, a key that does not match its certificate) is logged once per change and
//! the previous value kept; the next change is tried again.

use std::fmt::{self, Display};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;

/// Identity of a file version: modification time, length, inode (`None`: unreadable).
type Stamp = Option<(SystemTime, u64, u64)>;

/// A value built from `paths`, rebuilt when they change.
pub(crate) struct Reloading<T> {
    /// What the files are, for the logs (e.g. "gRPC TLS").
    what: &'static str,
    /// The files the value is built from.
    paths: Vec<PathBuf>,
    /// The current value.
    current: ArcSwap<T>,
    /// Stamps of the files `current` (or the last failed attempt) was built from; held
    /// while rebuilding, so that one caller rebuilds and the others wait.
    seen: Mutex<Vec<Stamp>>,
}

// === impl Reloading ===

impl<T> Reloading<T> {
    /// Builds the first value; its error (a bad file at startup) is returned as is.
    pub(crate) fn load<E>(
        what: &'static str,
        paths: Vec<PathBuf>,
        build: impl FnOnce() -> Result<T, E>,
    ) -> Result<Self, E> {
        let seen = Mutex::new(stamps(&paths));
        let first = build()?;
        Ok(Self {
            what,
            paths,
            current: ArcSwap::from_pointee(first),
            seen,
        })
    }

    /// The current value, rebuilt with `build` first if a file changed since the last
    /// attempt. A failed rebuild is logged and the previous value returned.
    pub(crate) fn get<E: Display>(&self, build: impl FnOnce() -> Result<T, E>) -> Arc<T> {
        if self.paths.is_empty() {
            return self.current();
        }
        let now = stamps(&self.paths);
        if let Ok(mut seen) = self.seen.lock() {
            if *seen != now {
                *seen = now;
                match build() {
                    Ok(value) => {
                        self.current.store(Arc::new(value));
                        tracing::info!(files = self.what, "TLS files reloaded");
                    }
                    Err(error) => {
                        tracing::error!(
                            files = self.what,
                            %error,
                            "TLS files not reloaded; the previous ones stay in use"
                        );
                    }
                }
            }
        }
        self.current()
    }

    /// The current value, without looking at the files.
    pub(crate) fn current(&self) -> Arc<T> {
        self.current.load_full()
    }
}

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

fn stamps(paths: &[PathBuf]) -> Vec<Stamp> {
    paths
        .iter()
        .map(|path| stamp(std::fs::metadata(path)))
        .collect()
}

fn stamp(metadata: std::io::Result<std::fs::Metadata>) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let metadata = metadata.ok()?;
    Some((metadata.modified().ok()?, metadata.len(), metadata.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &std::path::Path) -> Result<String, std::io::Error> {
        std::fs::read_to_string(path)
    }

    #[test]
    fn rebuilt_after_a_change_and_kept_after_a_failed_rebuild() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("value");
        std::fs::write(&path, "one").expect("write");
        let files = Reloading::load("test", vec![path.clone()], || read(&path)).expect("load");
        assert_eq!(*files.get(|| read(&path)), "one");
        // Unchanged: not rebuilt (the builder would say otherwise).
        assert_eq!(
            *files.get(|| Ok::<_, std::io::Error>("rebuilt".to_owned())),
            "one"
        );
        let tmp = dir.path().join("value.tmp");
        std::fs::write(&tmp, "two, longer").expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        assert_eq!(*files.get(|| read(&path)), "two, longer");
        std::fs::remove_file(&path).expect("remove");
        assert_eq!(*files.get(|| read(&path)), "two, longer", "kept");
        std::fs::write(&path, "three").expect("write");
        assert_eq!(*files.get(|| read(&path)), "three");
    }
}
