//! Wan 2.1 text-to-video and image-to-video (`-M vid_gen`; `-M img_gen` makes one frame): umT5
//! text encoder → the Wan video DiT (rectified flow, shift 5) → the Wan 2.1 VAE over time.
//! I2V / FLF2V / Wan 2.2 I2V models take `--init-img` (and `--end-img`) as a condition video
//! concatenated to the latent, plus CLIP vision tokens (`--clip_vision`) where the transformer
//! has an image branch (see `condition`). VACE models read a control video
//! (`--control-video`, `--init-img` as the reference, `--vace-strength`; see `vace`).
//!
//! sd-cli's rules (upstream's T5 embedder with `is_umt5`, `zero_out_masked` for video): the
//! prompt's emphasis parsed, tokens plus `</s>` padded to 512 per chunk, the padding masked in
//! the encoder's attention and its rows zeroed afterwards, emphasis weights applied; the
//! `discrete` flow schedule with shift 5 (`--flow-shift` overrides); CFG as
//! `uncond + cfg · (cond − uncond)`; `--video-frames` F gives (F − 1)/4 + 1 latent frames and
//! 4·(that − 1) + 1 output frames.

mod condition;
mod moe;
mod pipeline;
mod vace;
mod vae;

pub use pipeline::{latent_frames, video_frames, WanPipeline};

use crate::error::Result;
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, ModelFlag, Required,
};
use crate::pipeline::family::{Defaults, Family, Generator, LoadContext};
use crate::pipeline::model_args::ModelArgSpec;
use crate::pipeline::prompt::PromptTemplate;
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};

/// Upstream's flow shift for Wan.
pub const FLOW_SHIFT: f32 = 5.0;
/// Tokens per umT5 chunk.
pub const TEXT_LEN: usize = 512;

pub(crate) const DIFFUSION: ComponentSpec = ComponentSpec::diffusion("a Wan diffusion model");
pub(crate) const T5: ComponentSpec = ComponentSpec::text_encoder(
    ComponentId::T5,
    "a umT5-XXL text encoder",
    &[ModelFlag::T5xxl],
);
pub(crate) const VAE: ComponentSpec = ComponentSpec::vae();
/// Wan 2.2 A14B's high-noise expert (`--high-noise-diffusion-model`).
pub(crate) const HIGH_NOISE: ComponentSpec = ComponentSpec {
    id: ComponentId::HighNoiseDiffusion,
    what: "the high-noise expert",
    flags: &[ModelFlag::HighNoiseDiffusionModel],
    required: Required::Optional,
    metadata: None,
};
/// The CLIP vision tower of I2V / FLF2V models (checked at load: needed when the transformer
/// has an image branch).
pub(crate) const CLIP_VISION: ComponentSpec = ComponentSpec {
    id: ComponentId::ClipVision,
    what: "a CLIP vision encoder (clip_vision_h)",
    flags: &[ModelFlag::ClipVision],
    required: Required::Optional,
    metadata: None,
};

/// The registry entry.
pub struct WanFamily;

impl Family for WanFamily {
    fn id(&self) -> &'static str {
        "wan"
    }

    fn name(&self) -> &'static str {
        "Wan"
    }

    /// A 3-D patch embedding beside the first block's self-attention (either layout).
    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let root = diffusion.root(ComponentId::Diffusion);
        let has = |n: &str| diffusion.store.contains(&format!("{root}{n}"));
        has("patch_embedding.weight")
            && (has("blocks.0.self_attn.q.weight") || has("blocks.0.attn1.to_q.weight"))
    }

    fn components(&self) -> &'static [ComponentSpec] {
        &[DIFFUSION, HIGH_NOISE, T5, CLIP_VISION, VAE]
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
        &[]
    }

    fn prompt_template(&self) -> PromptTemplate {
        PromptTemplate::Raw
    }

    fn makes_video(&self) -> bool {
        true
    }

    fn lora_aliases(&self) -> &'static [crate::pipeline::lora::names::AliasRule] {
        &[crate::pipeline::lora::names::wan]
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(WanPipeline::load(files, ctx)?))
    }
}
