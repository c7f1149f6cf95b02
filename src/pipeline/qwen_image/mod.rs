//! Qwen Image (v1) text-to-image and img2img: Qwen2.5-VL's language model as text encoder →
//! the Qwen Image dual-stream transformer (rectified flow, shift 3) → the Qwen Image VAE (the
//! Wan 2.1 VAE, 16 latent channels, 8× spatial).
//!
//! sd-cli's rules (upstream's LLM embedder and `qwen_image.hpp`): the prompt in the
//! "Describe the image…" chat template, tokenized a piece at a time with emphasis weights
//! applied to the states (as for CLIP), every token through all layers and the final norm,
//! then the template's first 34 tokens dropped (diffusers drops the same count); no padding;
//! the `discrete` flow schedule with shift 3 (`--flow-shift` overrides); CFG as
//! `uncond + cfg · (cond − uncond)` — diffusers' `true_cfg_scale` also rescales the guided
//! velocity to the conditional one's norm, sd-cli does not; latents normalised with the VAE's
//! per-channel mean and std; image rope rows centred as `r − rows/2` (diffusers differs on
//! odd grids, see `models::dit::qwen_image`).

pub mod edit;
mod pipeline;

pub use pipeline::QwenImagePipeline;

use crate::error::Result;
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, ModelFlag, Required,
};
use crate::pipeline::family::{Defaults, Family, Generator, LoadContext};
use crate::pipeline::model_args::{ModelArg, ModelArgSpec};
use crate::pipeline::prompt::{ChatTemplate, PromptTemplate};
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};

/// Upstream's flow shift for Qwen Image.
pub const FLOW_SHIFT: f32 = 3.0;

/// The system turn of the text-to-image template.
pub const SYSTEM: &str = "Describe the image by detailing the color, shape, size, texture, \
                          quantity, text, spatial relationships of the objects and background:";
/// The template before the prompt and after it, as the pieces upstream tokenizes apart.
pub const PROMPT_PREFIX: &str = "<|im_start|>system\nDescribe the image by detailing the color, \
                                 shape, size, texture, quantity, text, spatial relationships of \
                                 the objects and background:<|im_end|>\n<|im_start|>user\n";
pub const PROMPT_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n";
/// Leading template tokens whose states are dropped (upstream and diffusers alike).
pub const DROP_TOKENS: usize = 34;

pub const TEMPLATE: ChatTemplate = ChatTemplate {
    system: Some(SYSTEM),
    empty_prompt: "",
};

/// `--model-args qwen_image_zero_cond_t=true` (upstream's key): Edit 2511's reference tokens
/// modulated at timestep 0. Also on when the checkpoint carries the `__index_timestep_zero__`
/// marker, as 2511 files do.
pub const ZERO_COND_T: ModelArg<bool> = ModelArg::new(
    "qwen_image_zero_cond_t",
    false,
    "modulate reference tokens with timestep 0 (Qwen Image Edit 2511)",
);

const MODEL_ARGS: [&dyn ModelArgSpec; 1] = [&ZERO_COND_T];

pub(crate) const DIFFUSION: ComponentSpec =
    ComponentSpec::diffusion("a Qwen Image diffusion model");
pub(crate) const LLM: ComponentSpec = ComponentSpec::text_encoder(
    ComponentId::Llm,
    "a Qwen2.5-VL text encoder (Qwen2.5-VL-7B)",
    &[ModelFlag::Llm],
);
pub(crate) const VISION: ComponentSpec = ComponentSpec {
    id: ComponentId::LlmVision,
    what: "the Qwen2.5-VL vision tower",
    flags: &[ModelFlag::LlmVision, ModelFlag::Llm],
    required: Required::WithReferences,
    metadata: None,
};
pub(crate) const VAE: ComponentSpec = ComponentSpec::vae();

/// The registry entry.
pub struct QwenImageFamily;

impl Family for QwenImageFamily {
    fn id(&self) -> &'static str {
        "qwen_image"
    }

    fn name(&self) -> &'static str {
        "Qwen Image"
    }

    /// The text-state norm beside per-block image modulation.
    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let root = diffusion.root(ComponentId::Diffusion);
        let has = |n: &str| diffusion.store.contains(&format!("{root}{n}"));
        has("txt_norm.weight")
            && has("img_in.weight")
            && has("transformer_blocks.0.img_mod.1.weight")
    }

    fn components(&self) -> &'static [ComponentSpec] {
        &[DIFFUSION, LLM, VISION, VAE]
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
        PromptTemplate::Chat(TEMPLATE)
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(QwenImagePipeline::load(files, ctx)?))
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
