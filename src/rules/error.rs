//! The one error type of rule loading.

use std::path::PathBuf;

/// Why a rule set could not be loaded.
///
/// `Display` is `"<name>: <reason>"`, where `<name>` is how the file was named when it
/// was loaded ([`super::ConfigFile::name`]). For the checks envoyproxy/ratelimit also
/// makes, `<reason>` is the reference's exact text, so logs and alerts keyed on it keep
/// working; Sluice's own checks name the YAML path (`descriptors[0].rate_limit.burst`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is not YAML, or not of the expected shape (a string where a list is
    /// expected, a number out of range, ...). The message is the YAML parser's.
    #[error("{file}: error loading config file: {message}")]
    Yaml {
        /// Name of the file.
        file: String,
        /// The parser's message (with its position).
        message: String,
        /// 1-based line of the error, when the parser knows it.
        line: Option<u64>,
        /// 1-based column of the error, when the parser knows it.
        column: Option<u64>,
    },
    /// A check that the reference also makes failed; `message` is the reference's text.
    #[error("{file}: {message}")]
    Reference {
        /// Name of the file.
        file: String,
        /// The reference's message, e.g. `descriptor has empty key`.
        message: String,
    },
    /// A Sluice-specific check failed (extensions, caps against hostile config).
    #[error("{file}: {path}: {message}")]
    Sluice {
        /// Name of the file.
        file: String,
        /// YAML path of the offending node, e.g. `descriptors[0].rate_limit.burst`.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

// === impl ConfigError ===

impl ConfigError {
    /// A reference-style error: `"<file>: <message>"`.
    pub(crate) fn reference(file: &str, message: impl Into<String>) -> Self {
        Self::Reference {
            file: file.to_owned(),
            message: message.into(),
        }
    }

    /// A Sluice-style error naming a YAML path.
    pub(crate) fn sluice(file: &str, path: &str, message: impl Into<String>) -> Self {
        Self::Sluice {
            file: file.to_owned(),
            path: path.to_owned(),
            message: message.into(),
        }
    }

    /// The name of the file the error is about (the path for I/O errors).
    pub(crate) fn file(&self) -> String {
        match self {
            Self::Yaml { file, .. } | Self::Reference { file, .. } | Self::Sluice { file, .. } => {
                file.clone()
            }
            Self::Io { path, .. } => path.display().to_string(),
        }
    }

    /// Line and column (1-based) of the error, when the YAML parser gave them.
    pub(crate) fn position(&self) -> (Option<u64>, Option<u64>) {
        match self {
            Self::Yaml { line, column, .. } => (*line, *column),
            _ => (None, None),
        }
    }

    /// Why the load failed, without the file name (the YAML path is kept).
    pub(crate) fn reason(&self) -> String {
        match self {
            Self::Yaml { message, .. } => format!("error loading config file: {message}"),
            Self::Reference { message, .. } => message.clone(),
            Self::Sluice { path, message, .. } => format!("{path}: {message}"),
            Self::Io { source, .. } => source.to_string(),
        }
    }
}
