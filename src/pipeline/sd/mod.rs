//! Stable Diffusion 1.x / 2.x and SDXL: CLIP text encoders (+ OpenCLIP bigG for SDXL) → UNet
//! (eps or v prediction on the DDPM scaled-linear schedule, CFG) → AutoencoderKL (or TAESD).
//! Two registry entries ([`SD`], [`SDXL`]) over one pipeline ([`SdPipeline`]).
//!
//! Upstream sd-cli is the spec where it differs from diffusers (REFERENCE-NOTES 26–28, and
//! docs/sd.md): sizes round up to the UNet's multiple; `--clip-skip`; SDXL's empty negative
//! prompt zeroes the cross-attention context only; prompt emphasis and BREAK.

mod conditioner;
mod embeddings;
mod pipeline;
mod prediction;
mod variant;

pub use conditioner::{Condition, SdConditioner};
pub use embeddings::CustomEmbeddings;
pub use pipeline::{SdPipeline, SdRequest};
pub use variant::SdVersion;

use crate::error::{Error, Result};
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentSpec, ComponentStore, MetaSlot, ModelFlag, Required,
};
use crate::pipeline::family::{Defaults, Family, Generator, InputSummary, LoadContext};
use crate::pipeline::model_args::ModelArgSpec;
use crate::pipeline::prompt::PromptTemplate;
use crate::sampling::{Prediction, SamplerKind, ScheduleKind, ScheduleOptions};

pub(crate) const DIFFUSION: ComponentSpec = ComponentSpec::diffusion("a Stable Diffusion UNet");
/// SD1/SDXL's CLIP ViT-L, SD2's OpenCLIP ViT-H (upstream's first text-encoder slot).
pub(crate) const CLIP: ComponentSpec = ComponentSpec::text_encoder(
    ComponentId::ClipL,
    "a CLIP text encoder",
    &[ModelFlag::ClipL],
);
/// SDXL's CLIP ViT-L: absent from the refiner.
pub(crate) const CLIP_L_XL: ComponentSpec = ComponentSpec {
    id: ComponentId::ClipL,
    what: "a CLIP ViT-L text encoder",
    flags: &[ModelFlag::ClipL],
    required: Required::Optional,
    metadata: Some(MetaSlot::TextEncoder),
};
pub(crate) const CLIP_G: ComponentSpec = ComponentSpec::text_encoder(
    ComponentId::ClipG,
    "an OpenCLIP ViT-bigG text encoder",
    &[ModelFlag::ClipG],
);
/// The VAE: not needed when `--taesd` replaces it (checked at load).
pub(crate) const VAE: ComponentSpec = ComponentSpec {
    required: Required::Optional,
    ..ComponentSpec::vae()
};
/// `--taesd`: TAESD / TAESDXL (TAEF1 for FLUX) decodes (and encodes) instead of the VAE.
pub const TAESD: ComponentSpec = ComponentSpec {
    id: ComponentId::Taesd,
    what: "a TAESD tiny autoencoder",
    flags: &[ModelFlag::Taesd],
    required: Required::Optional,
    metadata: None,
};

/// Upstream's defaults for every UNet family.
fn unet_defaults() -> Defaults {
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

fn no_references(inputs: &InputSummary<'_>) -> Result<()> {
    if inputs.references > 0 {
        return Err(Error::Unsupported(
            "Stable Diffusion does not take reference images (-r); use --init-img for img2img"
                .into(),
        ));
    }
    Ok(())
}

/// A registry entry: SD 1.x / 2.x, or SDXL (base, refiner, SSD-1B, Vega). One type, two
/// entries: they differ in what they detect and the text encoders they load.
pub struct SdFamily {
    xl: bool,
}

/// SD 1.x and 2.x.
pub const SD: SdFamily = SdFamily { xl: false };
/// SDXL.
pub const SDXL: SdFamily = SdFamily { xl: true };

impl Family for SdFamily {
    fn id(&self) -> &'static str {
        if self.xl {
            "sdxl"
        } else {
            "sd"
        }
    }

    fn name(&self) -> &'static str {
        if self.xl {
            "Stable Diffusion XL"
        } else {
            "Stable Diffusion 1.x/2.x"
        }
    }

    fn detect(&self, diffusion: &ComponentStore) -> bool {
        match variant::detect(diffusion) {
            Some(SdVersion::Sdxl) => self.xl,
            Some(SdVersion::Sd1 | SdVersion::Sd2) => !self.xl,
            None => false,
        }
    }

    fn components(&self) -> &'static [ComponentSpec] {
        if self.xl {
            &[DIFFUSION, CLIP_L_XL, CLIP_G, VAE, TAESD]
        } else {
            &[DIFFUSION, CLIP, VAE, TAESD]
        }
    }

    fn defaults(&self) -> Defaults {
        unet_defaults()
    }

    fn model_args(&self) -> &'static [&'static dyn ModelArgSpec] {
        &[]
    }

    fn prompt_template(&self) -> PromptTemplate {
        PromptTemplate::Raw
    }

    fn lora_aliases(&self) -> &'static [crate::pipeline::lora::names::AliasRule] {
        &[
            crate::pipeline::lora::names::unet,
            crate::pipeline::lora::names::clip,
        ]
    }

    fn check_inputs(&self, inputs: &InputSummary<'_>) -> Result<()> {
        no_references(inputs)
    }

    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>> {
        Ok(Box::new(SdPipeline::load(files, ctx)?))
    }
}
