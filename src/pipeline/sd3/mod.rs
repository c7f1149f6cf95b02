//! Stable Diffusion 3 / 3.5 (medium, large, large-turbo): CLIP-L + CLIP-G + T5-XXL → the MMDiT
//! (rectified flow, shift 3) → the 16-channel VAE.
//!
//! sd-cli's rules (REFERENCE-NOTES 30): every encoder over 77-token chunks; the context is,
//! per chunk, [CLIP-L ‖ CLIP-G penultimate states (no final norm), zero-padded to T5's width]
//! followed by T5's states (unmasked); the pooled vector is [CLIP-L final-norm end-token state
//! (no projection), CLIP-G's projected one]; a missing encoder gives zeros; the `discrete`
//! schedule with σ = 3s/(1 + 2s), s = (t + 1)/1000; the VAE latent is `z / 1.5305 + 0.0609`.

mod conditioner;
mod pipeline;

pub use conditioner::Sd3Condition;
pub use pipeline::Sd3Pipeline;

use crate::error::Result;
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, MetaSlot, ModelFlag, Required,
};
use crate::pipeline::family::{Defaults, Family, Generator, LoadContext};
use crate::pipeline::model_args::ModelArgSpec;
use crate::pipeline::prompt::PromptTemplate;
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};

/// The flow shift of SD3 (upstream's default).
pub const FLOW_SHIFT: f32 = 3.0;
pub const VAE_SCALE: f32 = 1.5305;
pub const VAE_SHIFT: f32 = 0.0609;
/// Tokens per chunk of every encoder.
pub const CHUNK: usize = 77;

pub(crate) const DIFFUSION: ComponentSpec = ComponentSpec::diffusion("an SD3 MMDiT");
const fn encoder(
    id: ComponentId,
    what: &'static str,
    flags: &'static [ModelFlag],
) -> ComponentSpec {
    ComponentSpec {
        id,
        what,
        flags,
        required: Required::Optional,
        metadata: Some(MetaSlot::TextEncoder),
    }
}
pub(crate) const CLIP_L: ComponentSpec = encoder(
    ComponentId::ClipL,
    "a CLIP-L text encoder",
    &[ModelFlag::ClipL],
);
pub(crate) const CLIP_G: ComponentSpec = encoder(
    ComponentId::ClipG,
    "a CLIP-G text encoder",
    &[ModelFlag::ClipG],
);
pub(crate) const T5: ComponentSpec = encoder(
    ComponentId::T5,
    "a T5-XXL text encoder",
    &[ModelFlag::T5xxl],
);
/// The VAE: not needed when `--taesd` (TAESD3) replaces it.
pub(crate) const VAE: ComponentSpec = ComponentSpec {
    required: Required::Optional,
    ..ComponentSpec::vae()
};

/// The registry entry.
pub struct Sd3Family;

impl Family for Sd3Family {
    fn id(&self) -> &'static str {
        "sd3"
    }

    fn name(&self) -> &'static str {
        "Stable Diffusion 3/3.5"
    }

    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let root = diffusion.root(ComponentId::Diffusion);
        let has = |n: &str| diffusion.store.contains(&format!("{root}{n}"));
        has("joint_blocks.0.x_block.attn.qkv.weight")
            || (has("transformer_blocks.0.attn.add_q_proj.weight") && has("pos_embed.proj.weight"))
    }

    fn components(&self) -> &'static [ComponentSpec] {
        &[
            DIFFUSION,
            CLIP_L,
            CLIP_G,
            T5,
            VAE,
            crate::pipeline::sd::TAESD,
        ]
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

    fn lora_aliases(&self) -> &'static [crate::pipeline::lora::names::AliasRule] {
        &[
            crate::pipeline::lora::names::sd3,
            crate::pipeline::lora::names::clip,
        ]
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(Sd3Pipeline::load(files, ctx)?))
    }
}
