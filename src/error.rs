//! The crate-level error: every module's typed error, plus the few failures that belong to
//! no single module. `main` prints the whole chain and exits non-zero.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Cli(#[from] crate::cli::CliError),
    #[error(transparent)]
    Weights(#[from] crate::weights::WeightsError),
    #[error(transparent)]
    Runner(#[from] crate::runner::RunnerError),
    #[error(transparent)]
    Ggml(#[from] crate::ggml::GgmlError),
    #[error(transparent)]
    Image(#[from] crate::image_io::ImageIoError),
    #[error(transparent)]
    Video(#[from] crate::image_io::video::VideoError),
    #[error(transparent)]
    Audio(#[from] crate::image_io::audio::AudioIoError),
    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizers::TokenizerError),
    #[error(transparent)]
    Tiling(#[from] crate::models::vae::tiling::TilingError),
    #[error(transparent)]
    Shape(#[from] crate::tensor::ShapeError),
    #[error(transparent)]
    Lora(#[from] crate::pipeline::lora::LoraError),
    #[error("{flag}: {reason}")]
    Flag { flag: String, reason: String },
    #[error("{path}: {reason}")]
    Model { path: PathBuf, reason: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("converting tensor '{key}': {reason}")]
    Convert { key: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
