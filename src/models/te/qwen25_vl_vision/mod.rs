//! Qwen2.5-VL's vision tower (transformers `Qwen2_5_VisionTransformerPretrainedModel`) for
//! single images.
//!
//! - [`Qwen25VlVisionConfig`]: sizes detected from the weights; head count, attention window,
//!   full-attention blocks and rope base from [`qwen25_vl_vision_hparams`] (config.json / mmproj
//!   GGUF metadata), else the released 7B values.
//! - [`Qwen25VlVisionSource`]: serves transformers (`model.visual.*`, `visual.*` as in ComfyUI's
//!   single file, bare) and llama.cpp mmproj GGUF names under transformers names relative to
//!   `visual.`.
//! - [`Qwen25VlVision`]: weights and a pure `forward` → merged tokens; [`encode_image`] runs it.
//! - [`qwen25_vl_preprocess_config`]: the image processor's defaults; resizing and patchify are
//!   shared with Qwen3-VL ([`crate::models::te::qwen3_vl_vision::patchify`]).

mod config;
mod model;
mod preprocess;
mod source;
mod window;

pub use config::{
    qwen25_vl_vision_hparams, Qwen25VlVisionConfig, Qwen25VlVisionHparams, DEFAULT_FULLATT_BLOCKS,
    DEFAULT_HEADS, DEFAULT_PATCH_SIZE, DEFAULT_ROPE_THETA, DEFAULT_TEMPORAL_PATCH_SIZE,
    DEFAULT_WINDOW_SIZE,
};
pub use model::{encode_image, Qwen25VlVision};
pub use preprocess::{qwen25_vl_preprocess_config, CLIP_IMAGE_MEAN, CLIP_IMAGE_STD};
pub use source::{qwen25_vl_vision_hf_to_llamacpp, Qwen25VlVisionSource, PATCH_WEIGHT};
pub use window::{window_ids, window_mask};
