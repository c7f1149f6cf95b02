//! FLUX.1 (dev, schnell): CLIP-L pooled + T5-XXL → the FLUX transformer (flow matching,
//! distilled guidance on dev) → the 16-channel `ae`.
//!
//! sd-cli's rules where they differ from diffusers' `FluxPipeline` (REFERENCE-NOTES 29): T5
//! over 256-token chunks without a mask, the `flux` schedule's sequence length is the latent
//! pixel count (H/8)(W/8), the `discrete` scheduler's shift is 1.15 (dev) / 1.0 (schnell),
//! `--guidance` 3.5, the VAE latent is `z / 0.3611 + 0.1159`; a missing CLIP-L gives a zero
//! pooled vector and a missing T5 zero hidden states, as upstream.

pub mod chroma;
mod pipeline;

pub use chroma::ChromaFamily;
pub use pipeline::{ChromaText, FluxCondition, FluxPipeline, FluxRequest};

use crate::error::Result;
use crate::models::dit::flux::FluxConfig;
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, MetaSlot, ModelFlag, Required,
};
use crate::pipeline::family::{Defaults, Family, Generator, LoadContext};
use crate::pipeline::model_args::ModelArgSpec;
use crate::pipeline::prompt::PromptTemplate;
use crate::sampling::schedules::FluxScheduleParams;
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};

/// Tokens per T5 chunk (upstream's FLUX conditioner).
pub const T5_CHUNK: usize = 256;
/// The `ae` latent normalisation: VAE latent = latent / scale + shift.
pub const VAE_SCALE: f32 = 0.3611;
pub const VAE_SHIFT: f32 = 0.1159;
/// The `discrete` scheduler's flow shift of dev (guidance-distilled) and schnell models.
pub const DEV_SHIFT: f32 = 1.15;
pub const SCHNELL_SHIFT: f32 = 1.0;

/// Whether the diffusion store holds a FLUX-shaped transformer (either layout).
pub(crate) fn flux_layout(diffusion: &ComponentStore) -> (bool, impl Fn(&str) -> bool + '_) {
    let root = diffusion.root(ComponentId::Diffusion);
    let store = &diffusion.store;
    let has = move |n: &str| store.contains(&format!("{root}{n}"));
    let layout = has("double_blocks.0.img_attn.qkv.weight")
        || (has("transformer_blocks.0.attn.add_q_proj.weight")
            && has("single_transformer_blocks.0.proj_mlp.weight"));
    (layout, has)
}

pub(crate) const DIFFUSION: ComponentSpec = ComponentSpec::diffusion("a FLUX.1 transformer");
pub(crate) const CLIP_L: ComponentSpec = ComponentSpec {
    id: ComponentId::ClipL,
    what: "a CLIP-L text encoder",
    flags: &[ModelFlag::ClipL],
    required: Required::Optional,
    metadata: Some(MetaSlot::TextEncoder),
};
pub(crate) const T5: ComponentSpec = ComponentSpec {
    id: ComponentId::T5,
    what: "a T5-XXL text encoder",
    flags: &[ModelFlag::T5xxl],
    required: Required::Optional,
    metadata: Some(MetaSlot::TextEncoder),
};
/// The VAE: not needed when `--taesd` (TAEF1) replaces it (checked at load).
pub(crate) const VAE: ComponentSpec = ComponentSpec {
    required: Required::Optional,
    ..ComponentSpec::vae()
};

/// The registry entry.
pub struct FluxFamily;

impl Family for FluxFamily {
    fn id(&self) -> &'static str {
        "flux"
    }

    fn name(&self) -> &'static str {
        "FLUX.1"
    }

    /// Either checkpoint layout, with the pooled-text input Chroma lacks.
    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let (layout, has) = flux_layout(diffusion);
        layout
            && (has("vector_in.in_layer.weight")
                || has("time_text_embed.text_embedder.linear_1.weight"))
            && !has("distilled_guidance_layer.in_proj.weight")
    }

    fn components(&self) -> &'static [ComponentSpec] {
        &[DIFFUSION, CLIP_L, T5, VAE, crate::pipeline::sd::TAESD]
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            width: 512,
            height: 512,
            steps: 20,
            cfg_scale: 7.0,
            sampler: SamplerKind::Euler,
            schedule: ScheduleKind::Flux,
            schedule_options: ScheduleOptions {
                flux: FluxScheduleParams::FLUX,
                ..ScheduleOptions::default()
            },
            prediction: Prediction::FluxFlow,
            flow_shift: Some(DEV_SHIFT),
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
            crate::pipeline::lora::names::flux,
            crate::pipeline::lora::names::clip,
        ]
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(FluxPipeline::load(files, ctx)?))
    }
}

/// Whether a config decides schnell's shift (no guidance embedding).
pub fn flow_shift(config: &FluxConfig) -> f32 {
    if config.guidance_embed {
        DEV_SHIFT
    } else {
        SCHNELL_SHIFT
    }
}
