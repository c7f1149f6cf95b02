//! Text encoders.

pub mod clip;
pub mod clip_vision;
pub mod qwen25_vl_vision;
pub mod qwen3;
pub mod qwen3_vl_vision;
pub mod t5;

use crate::runner::RunnerError;

/// Rejects an empty sequence or a token id outside `vocab` before it reaches ggml's
/// `get_rows` (which would read out of bounds). `what` names the sequence in the error.
pub(crate) fn check_token_ids(ids: &[i32], vocab: usize, what: &str) -> Result<(), RunnerError> {
    let bad = |reason: String| RunnerError::BadData {
        key: "input_ids".into(),
        origin: what.into(),
        reason,
    };
    if ids.is_empty() {
        return Err(bad("no tokens".into()));
    }
    match ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
        Some(&id) => Err(bad(format!(
            "token id {id} is outside the vocabulary of {vocab}"
        ))),
        None => Ok(()),
    }
}
