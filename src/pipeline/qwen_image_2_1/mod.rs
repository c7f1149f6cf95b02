//! Qwen Image 2.1 text-to-image, editing and img2img: Qwen3-VL text encoder (with the vision
//! tower for reference images, [`edit`]) → Qwen Image 2.1 transformer (velocity prediction on
//! the Flux-shifted flow schedule, optional true CFG) → Qwen Image 2.1 VAE (RGBA). The registry
//! entry ([`QwenImage21Family`]) and the pipeline ([`QwenImage21Pipeline`]).

mod edit;
mod pipeline;
mod refs;
pub mod template;

pub use edit::EditInputs;
pub use pipeline::{PromptCondition, QwenImage21Pipeline, QwenImage21Request};
pub use refs::{calculate_dimensions, prepare_reference, reference_size, PreparedRef};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, ModelFlag, Required,
};
use crate::pipeline::family::{Defaults, Family, Generator, InputSummary, LoadContext};
use crate::pipeline::model_args::{CacheType, ModelArg, ModelArgSpec};
use crate::pipeline::prompt::PromptTemplate;
use crate::sampling::schedules::FluxScheduleParams;
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};

/// Defaults of upstream sd-cli for this family: Euler on the `flux` schedule with the Qwen
/// Image 2.1 parameters ([`schedule_options`]).
pub const DEFAULT_SAMPLER: SamplerKind = SamplerKind::Euler;
pub const DEFAULT_SCHEDULE: ScheduleKind = ScheduleKind::Flux;
/// Image pixels per latent pixel (one transformer token each).
pub const VAE_SCALE: usize = 16;
/// Image sizes must be multiples of this (the pipeline floors to it).
pub const SIZE_MULTIPLE: usize = 32;

/// `--model-args` of Qwen Image 2.1 (upstream's keys).
pub const PREFIX_CACHE: ModelArg<bool> = ModelArg::new(
    "qwen_image_2_1_prefix_cache",
    true,
    "store each condition's text/reference K/V on its first step and reuse it",
);
pub const PREFIX_CACHE_TYPE: ModelArg<CacheType> = ModelArg::new(
    "qwen_image_2_1_prefix_cache_type",
    CacheType::Auto,
    "prefix K/V storage type: auto (f16 with --fa, else f32), f32, f16, bf16, q8_0, ...",
);

const MODEL_ARGS: [&dyn ModelArgSpec; 2] = [&PREFIX_CACHE, &PREFIX_CACHE_TYPE];

pub(crate) const DIFFUSION: ComponentSpec =
    ComponentSpec::diffusion("a Qwen Image 2.1 diffusion model");
pub(crate) const LLM: ComponentSpec = ComponentSpec::text_encoder(
    ComponentId::Llm,
    "a Qwen3-VL text encoder",
    &[ModelFlag::Llm],
);
pub(crate) const VISION: ComponentSpec = ComponentSpec {
    id: ComponentId::LlmVision,
    what: "the Qwen3-VL vision tower",
    flags: &[ModelFlag::LlmVision, ModelFlag::Llm],
    required: Required::WithReferences,
    metadata: None,
};
pub(crate) const VAE: ComponentSpec = ComponentSpec::vae();

/// Schedule options with the Qwen Image 2.1 flux parameters (a model preset: apply
/// `--extra-sample-args` after it).
pub fn schedule_options() -> ScheduleOptions {
    ScheduleOptions {
        flux: FluxScheduleParams::QWEN_IMAGE_2_1,
        ..ScheduleOptions::default()
    }
}

/// The prefix-cache storage type: the requested one, or with `auto` f16 when flash
/// attention is on, else f32.
pub fn prefix_cache_type(requested: CacheType, flash_attn: bool) -> DType {
    match requested {
        CacheType::Type(t) => t,
        CacheType::Auto if flash_attn => DType::F16,
        CacheType::Auto => DType::F32,
    }
}

/// The registry entry.
pub struct QwenImage21Family;

impl Family for QwenImage21Family {
    fn id(&self) -> &'static str {
        "qwen_image_2_1"
    }

    fn name(&self) -> &'static str {
        "Qwen Image 2.1"
    }

    /// The text-input norm, the shared modulation and the image input projection.
    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let root = diffusion.root(ComponentId::Diffusion);
        let has = |n: &str| diffusion.store.contains(&format!("{root}{n}"));
        has("txt_in.text_norm.weight") && has("modulation.1.weight") && has("img_in.weight")
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
            sampler: DEFAULT_SAMPLER,
            schedule: DEFAULT_SCHEDULE,
            schedule_options: schedule_options(),
            prediction: Prediction::FluxFlow,
            flow_shift: None,
        }
    }

    fn model_args(&self) -> &'static [&'static dyn ModelArgSpec] {
        &MODEL_ARGS
    }

    fn prompt_template(&self) -> PromptTemplate {
        PromptTemplate::Chat(template::TEMPLATE)
    }

    fn lora_aliases(&self) -> &'static [crate::pipeline::lora::names::AliasRule] {
        &[crate::pipeline::lora::names::qwen_image_2_1]
    }

    fn check_inputs(&self, inputs: &InputSummary<'_>) -> Result<()> {
        let args = inputs.ref_args;
        if inputs.references > 0 && (!args.pass_to_vlm || !args.pass_to_dit) {
            return Err(Error::Flag {
                flag: "--ref-image-args".into(),
                reason: "Qwen Image 2.1 reads every reference twice (vision slots in the \
                         prompt and latent tokens in the transformer): pass_to_vlm and \
                         pass_to_dit must stay true"
                    .into(),
            });
        }
        Ok(())
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(QwenImage21Pipeline::load(files, ctx)?))
    }
}
