//! Z-Image (Turbo and Base): Qwen3 text encoder → the Z-Image single-stream DiT (rectified
//! flow, shift 3) → FLUX's 16-channel VAE.
//!
//! sd-cli's rules (upstream `z_image.hpp`, its LLM embedder): the prompt in Qwen's chat template
//! without a system turn, every token kept, no padding or truncation, emphasis (`(word:1.5)`)
//! parsed and its weights applied to the states as for CLIP; the encoder's states
//! before its last layer (`hidden_states[-2]`, no final norm); the `discrete` flow schedule
//! with shift 3 for Turbo and Base alike (`--flow-shift` overrides); CFG as
//! `uncond + cfg · (cond − uncond)` (diffusers' `guidance_scale` is `cfg − 1`); the VAE latent
//! is `z / 0.3611 + 0.1159`.

pub mod lora;
mod pipeline;

pub use pipeline::{weighted_ids, ZImagePipeline};

use crate::error::Result;
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, ModelFlag, Required,
};
use crate::pipeline::family::{Defaults, Family, Generator, LoadContext};
use crate::pipeline::model_args::ModelArgSpec;
use crate::pipeline::prompt::{ChatTemplate, PromptTemplate};
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};

/// Upstream's flow shift for Z-Image (Turbo and Base).
pub const FLOW_SHIFT: f32 = 3.0;
/// FLUX `ae` latent normalisation.
pub const VAE_SCALE: f32 = 0.3611;
pub const VAE_SHIFT: f32 = 0.1159;

/// The user turn alone; an empty prompt stays empty (the template's own tokens remain).
pub const TEMPLATE: ChatTemplate = ChatTemplate {
    system: None,
    empty_prompt: "",
};
/// [`TEMPLATE`] around the prompt, as the pieces upstream tokenizes apart.
pub const PROMPT_PREFIX: &str = "<|im_start|>user\n";
pub const PROMPT_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n";

pub(crate) const DIFFUSION: ComponentSpec = ComponentSpec::diffusion("a Z-Image diffusion model");
pub(crate) const LLM: ComponentSpec = ComponentSpec::text_encoder(
    ComponentId::Llm,
    "a Qwen3 text encoder (Qwen3-4B)",
    &[ModelFlag::Llm],
);
/// The VAE: not needed when `--taesd` (TAEF1) replaces it.
pub(crate) const VAE: ComponentSpec = ComponentSpec {
    required: Required::Optional,
    ..ComponentSpec::vae()
};

/// The registry entry.
pub struct ZImageFamily;

impl Family for ZImageFamily {
    fn id(&self) -> &'static str {
        "z_image"
    }

    fn name(&self) -> &'static str {
        "Z-Image"
    }

    /// The caption embedder beside the learned pad tokens.
    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let root = diffusion.root(ComponentId::Diffusion);
        let has = |n: &str| diffusion.store.contains(&format!("{root}{n}"));
        has("cap_embedder.1.weight") && has("cap_pad_token") && has("x_pad_token")
    }

    fn components(&self) -> &'static [ComponentSpec] {
        &[DIFFUSION, LLM, VAE, crate::pipeline::sd::TAESD]
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
        PromptTemplate::Chat(TEMPLATE)
    }

    fn lora_aliases(&self) -> &'static [crate::pipeline::lora::names::AliasRule] {
        &[lora::z_image]
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(ZImagePipeline::load(files, ctx)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pieces_make_the_template() {
        let p = "a cat";
        assert_eq!(
            TEMPLATE.render(p, ""),
            format!("{PROMPT_PREFIX}{p}{PROMPT_SUFFIX}")
        );
    }
}
