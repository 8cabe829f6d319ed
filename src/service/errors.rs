//! The one place where service errors become gRPC statuses.

use tonic::{Code, Status};

use crate::store::StoreError;

/// Why a call could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The request is malformed or beyond the request bounds.
    #[error("{0}")]
    InvalidArgument(String),
    /// No rule set has loaded successfully yet.
    #[error("no rate limit configuration loaded")]
    NoRules,
    /// The store failed and a matched rule's failure mode is `error`.
    #[error("{0}")]
    Store(StoreError),
}

impl ServiceError {
    /// The reference's call statistic this error counts under.
    pub(crate) fn stat(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) | Self::NoRules => "service_error",
            Self::Store(_) => "store_error",
        }
    }
}

impl From<ServiceError> for Status {
    fn from(error: ServiceError) -> Self {
        let code = match &error {
            ServiceError::InvalidArgument(_) => Code::InvalidArgument,
            ServiceError::NoRules | ServiceError::Store(_) => Code::Unavailable,
        };
        Status::new(code, error.to_string())
    }
}
