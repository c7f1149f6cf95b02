//! Chroma: FLUX.1's architecture with the per-block modulation replaced by one approximator
//! (`distilled_guidance_layer`), T5-XXL alone as text encoder (512-token chunks) and a DiT mask
//! over padded text keys; real CFG with a negative prompt. Runs on the FLUX pipeline.
//!
//! sd-cli's rules (REFERENCE-NOTES 31): T5 unmasked (`chroma_use_t5_mask=false`), the DiT masks
//! text keys past the prompt's tokens and `chroma_t5_mask_pad` (1) padding tokens
//! (`chroma_use_dit_mask=true`); the guidance input is 0; the `discrete` scheduler's shift is 1.

use crate::error::Result;
use crate::pipeline::components::{ComponentFiles, ComponentSpec, ComponentStore};
use crate::pipeline::family::{Defaults, Family, Generator, LoadContext};
use crate::pipeline::model_args::{ModelArg, ModelArgSpec, ModelArgs};
use crate::pipeline::prompt::PromptTemplate;

use super::{ChromaText, FluxFamily, FluxPipeline, T5, VAE};

/// Tokens per T5 chunk (upstream's Chroma conditioner).
pub const T5_CHUNK: usize = 512;

pub const CHROMA_USE_DIT_MASK: ModelArg<bool> = ModelArg::new(
    "chroma_use_dit_mask",
    true,
    "Chroma: mask padded text keys in the DiT",
);
pub const CHROMA_USE_T5_MASK: ModelArg<bool> = ModelArg::new(
    "chroma_use_t5_mask",
    false,
    "Chroma: run T5 with its attention mask",
);
pub const CHROMA_T5_MASK_PAD: ModelArg<i64> =
    ModelArg::new("chroma_t5_mask_pad", 1, "Chroma: pad tokens left unmasked");

const MODEL_ARGS: [&dyn ModelArgSpec; 3] = [
    &CHROMA_USE_DIT_MASK,
    &CHROMA_USE_T5_MASK,
    &CHROMA_T5_MASK_PAD,
];

pub(crate) const DIFFUSION: ComponentSpec = ComponentSpec::diffusion("a Chroma transformer");

/// The text settings of a run from `--model-args`.
pub fn text_settings(args: &ModelArgs) -> ChromaText {
    ChromaText {
        use_dit_mask: args.get(&CHROMA_USE_DIT_MASK),
        use_t5_mask: args.get(&CHROMA_USE_T5_MASK),
        mask_pad: args.get(&CHROMA_T5_MASK_PAD).max(0) as usize,
    }
}

/// The registry entry.
pub struct ChromaFamily;

impl Family for ChromaFamily {
    fn id(&self) -> &'static str {
        "chroma"
    }

    fn name(&self) -> &'static str {
        "Chroma"
    }

    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let (layout, has) = super::flux_layout(diffusion);
        layout && has("distilled_guidance_layer.in_proj.weight")
    }

    fn components(&self) -> &'static [ComponentSpec] {
        &[DIFFUSION, T5, VAE, crate::pipeline::sd::TAESD]
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            flow_shift: Some(super::SCHNELL_SHIFT),
            ..FluxFamily.defaults()
        }
    }

    fn model_args(&self) -> &'static [&'static dyn ModelArgSpec] {
        &MODEL_ARGS
    }

    fn prompt_template(&self) -> PromptTemplate {
        PromptTemplate::Raw
    }

    fn lora_aliases(&self) -> &'static [crate::pipeline::lora::names::AliasRule] {
        &[crate::pipeline::lora::names::flux]
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(FluxPipeline::load(files, ctx)?))
    }
}
