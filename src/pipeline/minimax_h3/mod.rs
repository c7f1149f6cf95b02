//! MiniMax-H3 joint video and stereo audio generation (`-M vid_gen`): the MiniMax-H3 Qwen3-VL
//! text encoder (`--llm`) → the packed audio+video transformer → the MiniMax-H3 video VAE
//! (`--vae`) and, with `--audio-vae`, the audio VAE; the soundtrack goes into the video file
//! where the container takes one (AVI, WebM) and into a `.wav` beside it otherwise.
//!
//! sd-cli's rules (upstream `docs/minimax_h3.md`, its request resolution and AV flow
//! denoiser): sizes rounded up to 32, frames up to 17k + 5 (at least 5), 24 fps; the prompt
//! verbatim (no template, no special tokens) through the encoder's first 50 layers without a
//! final norm; the `discrete` flow schedule with the video shift (12, `--flow-shift`) and the
//! audio carried on it with its shift 3 (`carrier`); CFG as `uncond + cfg · (cond − uncond)`
//! on the packed output. Keyframes (`--init-img`, `--end-img`: I2VA / FL2VA) condition as
//! `keyframes` describes, references (`-r`, `--ref-video`, `--ref-video-audio`,
//! `--ref-audio`: Ref2VA) as `references` does; `conditions` encodes either once per batch.

mod carrier;
mod conditions;
mod frames;
pub mod keyframes;
mod pipeline;
pub mod references;

pub use carrier::{remap_sigma, CarrierPoint, Packing, AUDIO_SHIFT};
pub use frames::{align_frames, audio_latents, FPS};
pub use pipeline::{MiniMaxH3Pipeline, TextCondition};

use crate::error::Result;
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, MetaSlot, ModelFlag, Required,
};
use crate::pipeline::family::{Defaults, Family, Generator, LoadContext};
use crate::pipeline::model_args::{ModelArg, ModelArgSpec};
use crate::pipeline::prompt::PromptTemplate;
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};

/// Upstream's default video flow shift.
pub const FLOW_SHIFT: f32 = 12.0;
/// The text encoder layer whose output conditions the transformer (hidden_states[50]).
pub const TEXT_LAYER: usize = 50;

pub(crate) const DIFFUSION: ComponentSpec =
    ComponentSpec::diffusion("a MiniMax-H3 diffusion model");
pub(crate) const LLM: ComponentSpec = ComponentSpec {
    id: ComponentId::Llm,
    what: "the MiniMax-H3 Qwen3-VL text encoder (qwen3vl_32b_minimax_h3)",
    flags: &[ModelFlag::Llm],
    required: Required::Always,
    metadata: Some(MetaSlot::TextEncoder),
};
pub(crate) const VAE: ComponentSpec = ComponentSpec::vae();
pub(crate) const AUDIO_VAE: ComponentSpec = ComponentSpec {
    id: ComponentId::AudioVae,
    what: "the MiniMax-H3 audio VAE",
    flags: &[ModelFlag::AudioVae],
    required: Required::Optional,
    metadata: None,
};

/// The vision tower for the keyframes' pictures: a `--llm_vision` file, else the LLM file
/// when it holds the tower; loaded only with `--init-img` / `--end-img`.
pub(crate) const VISION: ComponentSpec = ComponentSpec {
    id: ComponentId::LlmVision,
    what: "the Qwen3-VL vision tower",
    flags: &[ModelFlag::LlmVision, ModelFlag::Llm],
    required: Required::WithImages,
    metadata: None,
};

/// `--model-args minimax_h3_context_cache=false` turns off reusing the refined text across
/// steps (upstream's key; the results are the same either way).
pub const CONTEXT_CACHE: ModelArg<bool> = ModelArg::new(
    "minimax_h3_context_cache",
    true,
    "keep each condition's refined text (condition_proj + token refiner) across steps",
);

const MODEL_ARGS: [&dyn ModelArgSpec; 1] = [&CONTEXT_CACHE];

/// The registry entry.
pub struct MiniMaxH3Family;

impl Family for MiniMaxH3Family {
    fn id(&self) -> &'static str {
        "minimax_h3"
    }

    fn name(&self) -> &'static str {
        "MiniMax-H3"
    }

    /// The video and audio patch projections beside the token refiner (either layout).
    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let root = diffusion.root(ComponentId::Diffusion);
        let has = |n: &str| diffusion.store.contains(&format!("{root}{n}"));
        (has("video_patch_proj.weight") && has("audio_patch_proj.weight"))
            || (has("audio_proj_in.weight") && has("token_refiner.refiner_blocks.0.norm1.weight"))
    }

    fn components(&self) -> &'static [ComponentSpec] {
        &[DIFFUSION, LLM, VAE, AUDIO_VAE, VISION]
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            width: 512,
            height: 512,
            steps: 20,
            cfg_scale: 7.0,
            sampler: SamplerKind::Euler,
            schedule: ScheduleKind::Discrete,
            schedule_options: ScheduleOptions::default(),
            prediction: Prediction::Sd3Flow,
            flow_shift: Some(FLOW_SHIFT),
        }
    }

    fn model_args(&self) -> &'static [&'static dyn ModelArgSpec] {
        &MODEL_ARGS
    }

    fn prompt_template(&self) -> PromptTemplate {
        PromptTemplate::Raw
    }

    fn makes_video(&self) -> bool {
        true
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(MiniMaxH3Pipeline::load(files, ctx)?))
    }
}
