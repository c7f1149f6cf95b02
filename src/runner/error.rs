use thiserror::Error;

use crate::ggml::GgmlError;
use crate::tensor::Ne;

#[derive(Debug, Error)]
pub enum RunnerError {
    #[error(transparent)]
    Ggml(#[from] GgmlError),
    #[error("missing tensor '{key}' in {origin}")]
    MissingTensor { key: String, origin: String },
    #[error("tensor '{key}' in {origin} has shape {found:?} (ggml order), expected {expected:?}")]
    ShapeMismatch {
        key: String,
        origin: String,
        expected: Ne,
        found: Ne,
    },
    #[error("tensor '{key}' in {origin}: {reason}")]
    BadData {
        key: String,
        origin: String,
        reason: String,
    },
    #[error("input '{name}' has {got} values for shape {ne:?}")]
    InputSize { name: String, ne: Ne, got: usize },
    #[error("internal error: {0}")]
    Internal(String),
}

impl RunnerError {
    /// Whether this is an allocation failure (worth retrying with less memory), as opposed to
    /// a bad input or a failed computation.
    pub fn is_alloc_failure(&self) -> bool {
        matches!(self, RunnerError::Ggml(GgmlError::OutOfMemory { .. }))
    }
}
