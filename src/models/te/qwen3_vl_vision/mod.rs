//! Qwen3-VL's vision tower (transformers `Qwen3VLVisionModel`) and the image processor's
//! patchify step, for single images.
//!
//! - [`Qwen3VlVisionConfig`]: sizes detected from the weights; head count, deepstack layers and
//!   rope base from [`qwen3_vl_vision_hparams`] (config.json / mmproj GGUF metadata).
//! - [`Qwen3VlVisionSource`]: serves transformers (`model.visual.*`, `visual.*`, bare) and
//!   llama.cpp mmproj GGUF names under transformers names relative to `visual.`.
//! - [`Qwen3VlVision`]: weights and a pure `forward` → [`VisionOutput`]; [`encode_image`] runs it.
//! - [`VisionPreprocessConfig`], [`smart_resize`], [`patchify`]: `Qwen2VLImageProcessorPil`'s
//!   target size and patch flattening (resampling is the caller's).

mod config;
mod error;
mod model;
mod preprocess;
mod source;

pub use config::{
    qwen3_vl_vision_hparams, Qwen3VlVisionConfig, VisionHparams, DEFAULT_HEADS,
    DEFAULT_VISION_ROPE_THETA,
};
pub use error::VisionError;
pub use model::{
    check_patch_grid, encode_image, merge_order_coords, position_taps, Qwen3VlVision,
    VisionHostOutput, VisionOutput,
};
pub use preprocess::{patchify, patchify_frames, smart_resize, VisionPreprocessConfig};
pub use source::{
    llamacpp_deepstack_layers, qwen3_vl_vision_llamacpp_to_hf, Qwen3VlVisionSource, IN_CHANNELS,
};
