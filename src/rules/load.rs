//! Reading rule files from disk.
//!
//! A directory is read recursively in sorted order. Hidden entries (names starting with
//! `.`) are skipped: dotfiles, editor swap files, and Kubernetes ConfigMap internals
//! (`..data`, `..2024_01_01_...`), whose files are reached once through the visible
//! symlinks (`rules.yaml -> ..data/rules.yaml`). Symlinks in the visible tree are
//! followed; a directory already being read (a symlink loop) is not entered again, and
//! a file reached a second time (two links to it) is read once, under its first name.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::schema::MAX_FILE_BYTES;
use super::{ConfigError, ConfigFile};

/// Reads `path`: a YAML file, or a directory of them read recursively.
///
/// Files are named by their path relative to `path` with `/` separators (by their file
/// name when `path` is a file). In a directory, only `.yaml` and `.yml` files are read.
pub(crate) fn read_config_path(path: &Path) -> Result<Vec<ConfigFile>, ConfigError> {
    let metadata = std::fs::metadata(path).map_err(|source| io_error(path, source))?;
    if metadata.is_file() {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        return Ok(vec![read_file(path, name)?]);
    }
    let mut walk = Walk::default();
    read_dir(path, "", &mut walk)?;
    Ok(walk.files)
}

/// What a directory walk has seen and read.
#[derive(Default)]
struct Walk {
    /// Canonical paths of the directories being read, outermost first.
    open_dirs: Vec<PathBuf>,
    /// Canonical paths of the files read.
    read: HashSet<PathBuf>,
    /// The files read, in walk order.
    files: Vec<ConfigFile>,
}

fn read_dir(dir: &Path, prefix: &str, walk: &mut Walk) -> Result<(), ConfigError> {
    let canonical = std::fs::canonicalize(dir).map_err(|source| io_error(dir, source))?;
    if walk.open_dirs.contains(&canonical) {
        return Ok(());
    }
    walk.open_dirs.push(canonical);
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|source| io_error(dir, source))? {
        let entry = entry.map_err(|source| io_error(dir, source))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            entries.push((name, entry.path()));
        }
    }
    entries.sort();
    for (name, path) in entries {
        // `metadata` follows symlinks; a dangling one is an error naming it.
        let metadata = std::fs::metadata(&path).map_err(|source| io_error(&path, source))?;
        let relative = format!("{prefix}{name}");
        if metadata.is_dir() {
            read_dir(&path, &format!("{relative}/"), walk)?;
        } else if metadata.is_file() && is_yaml(&name) {
            let canonical =
                std::fs::canonicalize(&path).map_err(|source| io_error(&path, source))?;
            if walk.read.insert(canonical) {
                walk.files.push(read_file(&path, relative)?);
            }
        }
    }
    walk.open_dirs.pop();
    Ok(())
}

fn is_yaml(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".yaml") || lower.ends_with(".yml")
}

fn read_file(path: &Path, name: String) -> Result<ConfigFile, ConfigError> {
    let file = std::fs::File::open(path).map_err(|source| io_error(path, source))?;
    let mut text = String::new();
    let limit = u64::try_from(MAX_FILE_BYTES).unwrap_or(u64::MAX) + 1;
    file.take(limit)
        .read_to_string(&mut text)
        .map_err(|source| io_error(path, source))?;
    if text.len() > MAX_FILE_BYTES {
        return Err(ConfigError::sluice(
            &name,
            "(file)",
            format!("file is larger than {MAX_FILE_BYTES} bytes"),
        ));
    }
    Ok(ConfigFile { name, text })
}

fn io_error(path: &Path, source: std::io::Error) -> ConfigError {
    ConfigError::Io {
        path: path.to_path_buf(),
        source,
    }
}
