//! A command line that cannot run. Every message names the flag and the offending value.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{flag}: invalid value '{value}': {reason}")]
    InvalidValue {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("{0}")]
    Missing(String),
    #[error("{flag} '{}' does not exist", path.display())]
    InputMissing { flag: &'static str, path: PathBuf },
    #[error("{flag} '{}' is not a {expected}", path.display())]
    InputWrongKind {
        flag: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("{flag}: cannot read '{}': {source}", path.display())]
    InputRead {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{flag} requires {requires}")]
    Requires {
        flag: &'static str,
        requires: &'static str,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("-o/--output '{}': {reason}", path.display())]
    Output { path: PathBuf, reason: String },
}

pub(crate) fn invalid(
    flag: &'static str,
    value: impl ToString,
    reason: impl Into<String>,
) -> CliError {
    CliError::InvalidValue {
        flag,
        value: value.to_string(),
        reason: reason.into(),
    }
}

pub(crate) fn check_finite(flag: &'static str, v: f32) -> Result<f32, CliError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(invalid(flag, v, "must be a finite number"))
    }
}
