//! What a model family is to the rest of the program: the [`Family`] registry entry (how to
//! recognise it, what it loads, its defaults and `--model-args`, its prompt template) and the
//! [`Generator`] it loads into, which the generic batch loop drives.

use std::path::Path;
use std::rc::Rc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::image_io::Image;
use crate::models::vae::tiling::TileSettings;
use crate::rng::Rng;
use crate::runner::{BackendPlan, LoadOptions, MemoryOptions, RunOptions};
use crate::sampling::{
    Guidance, Prediction, SamplerKind, SamplingPlan, ScheduleKind, ScheduleOptions,
};
use crate::tensor::HostTensor;

use super::components::{ComponentFiles, ComponentId, ComponentSpec, ComponentStore, Needs};
use super::lora::names::AliasRule;
use super::lora::LoraSet;
use super::model_args::{ModelArgSpec, ModelArgs};
use super::prompt::PromptTemplate;
use super::ref_args::RefImageArgs;

/// One model family: its registry entry.
pub trait Family: Sync {
    /// Short id for logs ("pixart").
    fn id(&self) -> &'static str;
    /// Name for messages ("PixArt-α/Σ").
    fn name(&self) -> &'static str;
    /// Whether a diffusion model's tensors (names and shapes) are this family's.
    fn detect(&self, diffusion: &ComponentStore) -> bool;
    /// The components it loads and the flags that feed each (the diffusion model first).
    fn components(&self) -> &'static [ComponentSpec];
    /// Size rule and sampling defaults.
    fn defaults(&self) -> Defaults;
    /// The `--model-args` keys it reads.
    fn model_args(&self) -> &'static [&'static dyn ModelArgSpec];
    /// What its text encoder reads around the prompt.
    fn prompt_template(&self) -> PromptTemplate;
    /// Refuses inputs it cannot use, before any weight is loaded.
    fn check_inputs(&self, _inputs: &InputSummary<'_>) -> Result<()> {
        Ok(())
    }
    /// Whether it generates video (`-M vid_gen`).
    fn makes_video(&self) -> bool {
        false
    }
    /// The alias rules that give its weights the names LoRA files use for them
    /// ([`super::lora::names`]); a weight's own name always matches.
    fn lora_aliases(&self) -> &'static [AliasRule] {
        &[]
    }
    /// Loads the pipeline from its components' files.
    fn load(&self, files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Box<dyn Generator>>;
}

/// How an image size request becomes a size the model can generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeRule {
    /// Sizes are multiples of this (VAE factor × patch).
    pub multiple: u32,
    /// Round a request up (upstream's rule for most families) or down (the reference
    /// pipeline's floor, Qwen Image 2.1).
    pub round_up: bool,
    /// Without `-W`/`-H` the first reference image sets the size (when no init image does).
    pub refs_set_size: bool,
}

impl SizeRule {
    /// The size to generate for a requested `w × h`; an error when it rounds to nothing.
    pub fn apply(&self, w: u32, h: u32) -> Result<(u32, u32)> {
        let m = self.multiple.max(1);
        let (rw, rh) = if self.round_up {
            (w.div_ceil(m) * m, h.div_ceil(m) * m)
        } else {
            (w / m * m, h / m * m)
        };
        if rw == 0 || rh == 0 {
            return Err(Error::Flag {
                flag: "-W/-H".into(),
                reason: format!("{w}x{h} is smaller than {m} pixels, the model's size multiple"),
            });
        }
        if (rw, rh) != (w, h) {
            let how = if self.round_up { "up" } else { "down" };
            log::warn!(
                "image size {w}x{h} rounded {how} to {rw}x{rh} (a multiple of {m} for this model)"
            );
        }
        Ok((rw, rh))
    }
}

/// A family's defaults (what sd-cli uses when the flags do not say).
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    /// `-W`/`-H` when neither they nor an input image set the size.
    pub width: u32,
    pub height: u32,
    pub steps: usize,
    pub cfg_scale: f32,
    pub sampler: SamplerKind,
    pub schedule: ScheduleKind,
    /// Schedule presets (e.g. the flux schedule's parameters); `--extra-sample-args` win.
    pub schedule_options: ScheduleOptions,
    pub prediction: Prediction,
    /// The flow shift of flow models (`--flow-shift` overrides where the family reads it).
    pub flow_shift: Option<f32>,
}

/// What the run's inputs are, for [`Family::check_inputs`].
pub struct InputSummary<'a> {
    pub init_image: bool,
    pub references: usize,
    pub ref_args: &'a RefImageArgs,
}

/// Everything a family's loader needs besides the files.
pub struct LoadContext<'a> {
    pub backends: &'a BackendPlan,
    pub memory: MemoryOptions,
    /// `--type`: conversion target of matmul weights.
    pub wtype: Option<DType>,
    pub flash_attn: bool,
    pub model_args: &'a ModelArgs,
    pub needs: Needs,
    /// `--t5xxl-tokenizer`.
    pub t5_tokenizer: Option<&'a Path>,
    /// `--prediction`: overrides what the family detects.
    pub prediction: Option<Prediction>,
    /// `--clip-skip` (`None`: the model's default).
    pub clip_skip: Option<u32>,
    /// `--embd-dir`: textual-inversion embeddings named in prompts.
    pub embd_dir: Option<&'a Path>,
    /// The run's LoRAs (from the prompt's `<lora:...>` tags).
    pub lora: Option<Rc<LoraSet>>,
    /// `--taesd-preview-only`: TAESD draws the previews, the VAE the final image.
    pub taesd_preview_only: bool,
    /// `--flow-shift`: overrides a flow model's shift (what the `discrete` schedule reads).
    pub flow_shift: Option<f32>,
}

impl LoadContext<'_> {
    /// The runner options every component of the run shares.
    pub fn run_options(&self) -> RunOptions {
        RunOptions {
            flash_attn: self.flash_attn,
            memory: self.memory.clone(),
            ..RunOptions::default()
        }
    }

    /// Where and how component `id` loads; `--type` applies when `converts` (not to VAEs,
    /// whose convolutions keep the file's float type).
    pub fn load_options(&self, id: ComponentId, converts: bool) -> Result<LoadOptions> {
        Ok(LoadOptions {
            backend: self.backends.backend(id.role())?,
            wtype: if converts { self.wtype } else { None },
            run: self.run_options(),
            adapters: self.lora.as_ref().and_then(|l| l.for_component(id)),
        })
    }
}

/// What every image of a batch shares.
pub struct BatchInputs<'a> {
    pub width: usize,
    pub height: usize,
    /// `--init-img` (img2img; a video's first frame), already decoded.
    pub init: Option<&'a Image>,
    /// `--end-img`: a video's last frame (video families only), already decoded.
    pub end: Option<&'a Image>,
    /// `-r` reference images, in order.
    pub refs: &'a [Image],
    /// `--ref-audio` soundtracks, in order, already decoded.
    pub ref_audio: &'a [crate::image_io::audio::Audio],
    /// `--ref-video` clips (with their `--ref-video-audio`), in order, already decoded.
    pub ref_videos: &'a [RefVideo],
    /// `--mask` (inpainting), already decoded.
    pub mask: Option<&'a Image>,
    pub ref_args: &'a RefImageArgs,
    pub tiling: Option<&'a TileSettings>,
    /// `--hires`: the batch gets a second pass (families refuse what they cannot do with it).
    pub hires: bool,
    /// `-M vid_gen`: the requested frame count (video families return [W, H, C, frames]).
    pub video_frames: Option<usize>,
    /// `--control-video`: its frames in file-name order, already decoded (Wan VACE).
    pub control_frames: &'a [Image],
    /// `--vace-strength`: the factor of the VACE hints.
    pub vace_strength: f32,
}

/// A reference video: its frames in file-name order and its paired soundtrack.
#[derive(Clone, Debug)]
pub struct RefVideo {
    pub frames: Vec<Image>,
    pub audio: Option<crate::image_io::audio::Audio>,
}

/// One image of a batch.
pub struct ImageJob<'a> {
    /// 0-based index in the batch.
    pub index: u32,
    /// Whether more images of the same batch follow (caches may be kept for them).
    pub more_follow: bool,
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub guidance: Guidance,
    pub plan: &'a SamplingPlan,
    /// `--strength` (img2img).
    pub strength: f32,
    /// This image's seed (`-s` + its index in the batch), which `noise_rng` was seeded with.
    pub seed: u64,
    pub noise_rng: &'a mut dyn Rng,
    pub sampler_rng: &'a mut dyn Rng,
    pub tiling: Option<&'a TileSettings>,
    /// `--preview`: where pictures of the latent go while sampling.
    pub preview: Option<&'a mut (dyn super::preview::PreviewSink + 'static)>,
    /// `--hires`: the second pass at the larger size.
    pub hires: Option<super::hires::HiresJob<'a>>,
    /// `--high-noise-diffusion-model` (Wan 2.2 A14B): how its expert samples.
    pub high_noise: Option<HighNoiseJob<'a>>,
}

/// The high-noise expert's part of a job: its plan (the main plan with its sampler), its
/// guidance, and where it hands over.
#[derive(Clone, Copy)]
pub struct HighNoiseJob<'a> {
    pub plan: &'a SamplingPlan,
    pub guidance: Guidance,
    /// Steps whose sigma is at least this run on the expert (when `steps` is `None`).
    pub boundary: f32,
    /// `--high-noise-steps`: that many steps added in front of the main ones.
    pub steps: Option<usize>,
}

impl<'a> ImageJob<'a> {
    /// The job's preview request (with its tiling), if previews are on.
    pub fn preview_request(
        preview: Option<&'a mut (dyn super::preview::PreviewSink + 'static)>,
        tiling: Option<&'a TileSettings>,
    ) -> Option<super::preview::PreviewRequest<'a>> {
        preview.map(|sink| super::preview::PreviewRequest { sink, tiling })
    }
}

/// What a generator's `prepare` keeps for the batch: the size, the init image's latent, the
/// inpainting mask, and the family's own extras (e.g. prepared reference images).
pub struct Prepared<E = ()> {
    pub width: usize,
    pub height: usize,
    pub init: Option<HostTensor>,
    /// `--mask` at the output and latent size.
    pub mask: Option<super::mask::InpaintMask>,
    pub extra: E,
}

impl Prepared {
    /// What a family without references prepares: the size, `--init-img` encoded by `vae`,
    /// and `--mask` at `vae`'s latent size; `-r` is refused naming `family`.
    pub fn encode(
        vae: &super::vae::VaeStage,
        batch: &BatchInputs<'_>,
        family: &str,
    ) -> Result<Self> {
        if !batch.refs.is_empty() {
            return Err(Error::Unsupported(format!(
                "{family} does not take reference images (-r); use --init-img for img2img"
            )));
        }
        let (w, h) = (batch.width, batch.height);
        let init = batch
            .init
            .map(|img| vae.encode_init(img, w, h, batch.tiling))
            .transpose()?;
        let factor = vae.scale_factor();
        Ok(Prepared {
            width: w,
            height: h,
            init,
            mask: batch
                .mask
                .map(|m| super::mask::InpaintMask::from_image(m, w, h, factor)),
            extra: (),
        })
    }
}

impl<E> Prepared<E> {
    /// The latent mask every step's denoised estimate is blended with (plain families: the
    /// mask as given).
    pub fn denoise_mask(&self) -> Option<&HostTensor> {
        self.mask.as_ref().map(|m| &m.latent)
    }

    /// The prepared batch, or an error when `generate` came before `prepare`.
    pub fn get(slot: &Option<Self>) -> Result<&Self> {
        slot.as_ref()
            .ok_or_else(|| Error::Unsupported("generate before prepare".into()))
    }
}

/// A loaded family pipeline.
pub trait Generator {
    /// How requested sizes become sizes this model generates (its VAE factor × patch).
    fn size_rule(&self) -> SizeRule;
    /// Prepares what every image of the batch shares (the init image's latent, references).
    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()>;
    /// Generates one image; returns it in [0, 1], [W, H, C] (C = 3 or 4).
    fn generate(&mut self, job: ImageJob<'_>) -> Result<HostTensor>;
    /// Frees what the batch kept (caches).
    fn finish(&mut self) {}
    /// The frame rate a video is written at for `--fps` `requested` (models made for one
    /// rate override it).
    fn fps(&self, requested: u32) -> u32 {
        requested
    }
    /// Settings of the prepared batch that only this model reads, as (key, value) for the
    /// output's metadata (Wan VACE: its strength).
    fn settings(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The soundtrack of the video [`Generator::generate`] returned last, if the model made
    /// one (taken: a second call gives `None`).
    fn take_audio(&mut self) -> Option<crate::image_io::audio::Audio> {
        None
    }
}
