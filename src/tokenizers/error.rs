//! Errors of the tokenizer module.

use std::path::PathBuf;

/// Everything that can go wrong while finding, loading or building a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read tokenizer file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tokenizer file {path} is malformed: {reason}")]
    Format { path: String, reason: String },
    #[error("tokenizer file {path} uses an unsupported feature: {feature}")]
    Unsupported { path: String, feature: String },
    #[error("invalid tokenizer vocabulary from {origin}: {reason}")]
    Vocab { origin: String, reason: String },
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Emphasis(#[from] super::emphasis::EmphasisError),
}
