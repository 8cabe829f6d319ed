//! PEM files for TLS, shared by the gRPC listener and the Redis client: certificate
//! chains and private keys, read with errors that name the file and never show its
//! contents.

use std::path::{Path, PathBuf};

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file held no usable PEM item, or rustls refused what it held.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Every certificate in a PEM file (a chain or a CA bundle); at least one.
pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, e))?;
    if certs.is_empty() {
        return Err(invalid(path, "no PEM certificate"));
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub(crate) fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(&read(path)?)
        .map_err(|e| invalid(path, format!("no usable PEM private key ({e})")))
}

/// An error about `path` (for what rustls refuses once the files are read).
pub(crate) fn invalid(path: &Path, reason: impl ToString) -> PemError {
    PemError::Invalid {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, PemError> {
    std::fs::read(path).map_err(|source| PemError::Read {
        path: path.to_owned(),
        source,
    })
}
