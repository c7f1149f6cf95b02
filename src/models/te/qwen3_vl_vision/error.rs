//! Errors of the vision tower's inputs (images, sizes, preprocessor configs). Weight problems
//! are [`RunnerError`](crate::runner::RunnerError)s like everywhere else.

use std::path::PathBuf;

use thiserror::Error;

use crate::runner::RunnerError;

#[derive(Debug, Error)]
pub enum VisionError {
    #[error("image size {height}x{width} has a zero side")]
    EmptyImage { height: usize, width: usize },
    #[error("image aspect ratio of {height}x{width} is over 200 (the Qwen-VL processor's limit)")]
    AspectRatio { height: usize, width: usize },
    #[error("image of {height}x{width} pixels needs {expected} RGB bytes, got {got}")]
    RgbLength {
        height: usize,
        width: usize,
        expected: usize,
        got: usize,
    },
    #[error(
        "image of {height}x{width} pixels is not a multiple of patch {patch} x merge {merge}; \
         resize it to smart_resize's size first"
    )]
    NotPatchAligned {
        height: usize,
        width: usize,
        patch: usize,
        merge: usize,
    },
    #[error("{got} patch values do not fit a {grid_h}x{grid_w} grid of {patch_dim}-value patches")]
    PatchCount {
        got: usize,
        grid_h: usize,
        grid_w: usize,
        patch_dim: usize,
    },
    #[error("invalid vision setting: {0}")]
    BadSetting(String),
    #[error("{path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error(transparent)]
    Runner(#[from] RunnerError),
}
