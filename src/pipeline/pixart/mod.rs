//! PixArt-α / PixArt-Σ: T5 → PixArt DiT (eps prediction on the DDPM linear schedule, CFG) →
//! AutoencoderKL. The registry entry ([`PixArtFamily`]) and the pipeline ([`PixArtPipeline`]).

mod pipeline;

pub use pipeline::{linear_beta_schedule, PixArtPipeline, PixArtRequest};

use crate::error::{Error, Result};
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, ModelFlag,
};
use crate::pipeline::family::{Defaults, Family, Generator, InputSummary, LoadContext};
use crate::pipeline::model_args::{ModelArg, ModelArgSpec};
use crate::pipeline::prompt::PromptTemplate;
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};
use crate::tokenizers::pixart_clean;

/// PixArt-Σ's VAE (SDXL) scaling factor; α uses SD's.
pub const SIGMA_VAE_SCALE: f32 = 0.13025;
pub const ALPHA_VAE_SCALE: f32 = 0.18215;
/// T5 sequence lengths of the reference pipelines.
pub const SIGMA_MAX_TOKENS: usize = 300;
pub const ALPHA_MAX_TOKENS: usize = 120;

/// `--model-args` of PixArt (upstream's keys).
pub const POS_EMBED_BASE_SIZE: ModelArg<i64> = ModelArg::checked(
    "pixart_pos_embed_base_size",
    64,
    "sin-cos position-embedding base grid, in patches (default: the model's config.json, else 64)",
    |v| {
        if *v > 0 {
            Ok(())
        } else {
            Err("must be a positive integer")
        }
    },
);
pub const INTERPOLATION_SCALE: ModelArg<f32> = ModelArg::checked(
    "pixart_interpolation_scale",
    2.0,
    "position-embedding interpolation scale (default: the model's config.json, else 2)",
    |v| if *v > 0.0 { Ok(()) } else { Err("must be > 0") },
);
pub const VAE_SCALE_FACTOR: ModelArg<f32> = ModelArg::checked(
    "pixart_vae_scale_factor",
    SIGMA_VAE_SCALE,
    "VAE latent scale (default: 0.18215 for α-1024-MS, else 0.13025)",
    |v| if *v > 0.0 { Ok(()) } else { Err("must be > 0") },
);

const MODEL_ARGS: [&dyn ModelArgSpec; 3] = [
    &POS_EMBED_BASE_SIZE,
    &INTERPOLATION_SCALE,
    &VAE_SCALE_FACTOR,
];

pub(crate) const DIFFUSION: ComponentSpec = ComponentSpec::diffusion("a PixArt diffusion model");
pub(crate) const T5: ComponentSpec =
    ComponentSpec::text_encoder(ComponentId::T5, "a T5 text encoder", &[ModelFlag::T5xxl]);
pub(crate) const VAE: ComponentSpec = ComponentSpec::vae();

/// The registry entry.
pub struct PixArtFamily;

impl Family for PixArtFamily {
    fn id(&self) -> &'static str {
        "pixart"
    }

    fn name(&self) -> &'static str {
        "PixArt-α/Σ"
    }

    /// Original names (`t_block`, `x_embedder`) or diffusers names (`adaln_single`,
    /// `pos_embed`, `transformer_blocks`); LTX-AV shares adaLN-single and is ruled out by its
    /// audio projection (as upstream).
    fn detect(&self, diffusion: &ComponentStore) -> bool {
        let root = diffusion.root(ComponentId::Diffusion);
        let has = |n: &str| diffusion.store.contains(&format!("{root}{n}"));
        if has("audio_patchify_proj.weight") {
            return false;
        }
        (has("t_block.1.weight") && has("x_embedder.proj.weight"))
            || (has("adaln_single.linear.weight")
                && has("pos_embed.proj.weight")
                && diffusion.has_prefix(&format!("{root}transformer_blocks.")))
    }

    fn components(&self) -> &'static [ComponentSpec] {
        &[DIFFUSION, T5, VAE]
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            width: 512,
            height: 512,
            steps: 20,
            cfg_scale: 7.0,
            sampler: SamplerKind::EulerA,
            schedule: ScheduleKind::Discrete,
            schedule_options: ScheduleOptions::default(),
            prediction: Prediction::Eps,
            flow_shift: None,
        }
    }

    fn model_args(&self) -> &'static [&'static dyn ModelArgSpec] {
        &MODEL_ARGS
    }

    fn prompt_template(&self) -> PromptTemplate {
        PromptTemplate::Cleaned(pixart_clean)
    }

    fn lora_aliases(&self) -> &'static [crate::pipeline::lora::names::AliasRule] {
        &[crate::pipeline::lora::names::pixart]
    }

    fn check_inputs(&self, inputs: &InputSummary<'_>) -> Result<()> {
        if inputs.references > 0 {
            return Err(Error::Unsupported(
                "PixArt does not take reference images (-r); use --init-img for img2img".into(),
            ));
        }
        Ok(())
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(PixArtPipeline::load(files, ctx)?))
    }
}
