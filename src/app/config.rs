//! [`RunConfig`]: one invocation of `sd-cli`, validated, in the types the run uses. The CLI
//! builds it (`cli::resolve`, the only place flags are parsed and checked); nothing here
//! parses flag text again.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

use super::output_path;
use crate::dtype::DType;
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::{Defaults, ModelArgs, ModelFiles, RefImageArgs};
use crate::rng::RngKind;
use crate::runner::{BackendSpec, MemoryOptions};
use crate::sampling::{
    ExtraSampleArgs, Guidance, Prediction, SamplerKind, SamplingPlan, ScheduleKind,
};

/// Run mode (`-M/--mode`), upstream's `modes_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default, Serialize)]
pub enum Mode {
    /// Text/image to image (default).
    #[default]
    #[value(name = "img_gen")]
    #[serde(rename = "img_gen")]
    ImgGen,
    /// Post-process an image with a YOLOv8 detector and cropped inpainting.
    #[value(name = "adetailer")]
    #[serde(rename = "adetailer")]
    Adetailer,
    /// Video generation.
    #[value(name = "vid_gen")]
    #[serde(rename = "vid_gen")]
    VidGen,
    /// Convert model weights to GGUF.
    #[value(name = "convert")]
    #[serde(rename = "convert")]
    Convert,
    /// Upscale `--init-img` with `--upscale-model`.
    #[value(name = "upscale")]
    #[serde(rename = "upscale")]
    Upscale,
    /// Print the metadata of `--image` without loading a model.
    #[value(name = "metadata")]
    #[serde(rename = "metadata")]
    Metadata,
}

impl Mode {
    /// Upstream's spelling of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ImgGen => "img_gen",
            Mode::Adetailer => "adetailer",
            Mode::VidGen => "vid_gen",
            Mode::Convert => "convert",
            Mode::Upscale => "upscale",
            Mode::Metadata => "metadata",
        }
    }
}

/// `-M vid_gen`'s frame count and rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VideoSettings {
    /// `--video-frames` as given (the family rounds it to what its VAE can make).
    pub frames: u32,
    pub fps: u32,
}

/// Input images named on the command line (existence checked; decoding happens later).
#[derive(Debug, Clone, Default, Serialize)]
pub struct InputImages {
    pub init: Option<PathBuf>,
    pub end: Option<PathBuf>,
    pub mask: Option<PathBuf>,
    pub control: Option<PathBuf>,
    /// `--control-video`: a folder of frames (Wan VACE).
    pub control_video: Option<PathBuf>,
    /// `--vace-strength`.
    pub vace_strength: f32,
    /// `-r`, in command-line order.
    pub refs: Vec<PathBuf>,
    /// `--ref-audio` WAV files, in command-line order (MiniMax-H3 Ref2VA).
    pub ref_audio: Vec<PathBuf>,
    /// `--ref-video` frame folders, in command-line order.
    pub ref_videos: Vec<PathBuf>,
    /// `--ref-video-audio` WAV files, paired with `--ref-video` by index.
    pub ref_video_audio: Vec<PathBuf>,
    pub increase_ref_index: bool,
    /// `--ref-image-args` (with `--disable-auto-resize-ref-image` folded in).
    pub ref_args: RefImageArgs,
    pub control_strength: f32,
}

/// Sampler, schedule and guidance settings.
#[derive(Debug, Clone)]
pub struct SamplingConfig {
    /// `--steps` (the family's default applies when the flag was not given).
    pub steps: usize,
    /// `--cfg-scale` (the family's default applies when the flag was not given).
    pub cfg_scale: f32,
    /// `--img-cfg-scale`, or `cfg_scale` when not given (upstream rule).
    pub img_cfg_scale: f32,
    /// `--guidance`: distilled guidance.
    pub guidance: f32,
    pub slg_scale: f32,
    pub skip_layers: Vec<i32>,
    pub skip_layer_start: f32,
    pub skip_layer_end: f32,
    /// `None` = the sampler's default.
    pub eta: Option<f32>,
    /// `None` = the family's default.
    pub flow_shift: Option<f32>,
    pub timestep_shift: u32,
    /// `--sampling-method`; `None` = the family's default.
    pub sampler: Option<SamplerKind>,
    /// `--scheduler`; `None` = the family's default.
    pub scheduler: Option<ScheduleKind>,
    /// `--sigmas`, checked.
    pub sigmas: Option<Vec<f32>>,
    /// `--rng`: initial noise.
    pub rng: RngKind,
    /// `--sampler-rng`; `None` = the same as `rng`.
    pub sampler_rng: Option<RngKind>,
    /// `--extra-sample-args`, typed.
    pub extra: ExtraSampleArgs,
    /// The valid `--extra-sample-args` pairs as `k=v,...` (for metadata).
    pub extra_text: String,
}

impl SamplingConfig {
    /// The generator of ancestral/SDE noise.
    pub fn sampler_rng(&self) -> RngKind {
        self.sampler_rng.unwrap_or(self.rng)
    }
}

/// Devices, threads and memory.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `-t <= 0` became the number of physical cores.
    pub threads: u32,
    /// `--backend` with `--clip-on-cpu` / `--vae-on-cpu` folded in.
    pub backends: BackendSpec,
    /// `--max-vram`, `--offload-to-cpu`, `--disable-prefetch`, `--disable-segmented-compute`.
    pub memory: MemoryOptions,
    pub mmap: bool,
    /// `--fa` or `--diffusion-fa`.
    pub flash_attn: bool,
    pub verbose: bool,
    pub color: bool,
}

/// Where results go.
#[derive(Debug, Clone, Serialize)]
pub struct OutputConfig {
    /// `-o` as given (or `output.gguf` for convert mode when left at the default).
    pub pattern: String,
    pub begin_idx: u64,
    pub embed_metadata: bool,
    /// Some parent directory of an output does not exist yet; create it before writing.
    pub create_parent_dirs: bool,
    /// `--preview` and its flags; `None` for `--preview none`.
    pub preview: Option<PreviewSettings>,
    /// `--taesd-preview-only`.
    pub taesd_preview_only: bool,
}

/// Previews while sampling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreviewSettings {
    pub method: crate::pipeline::preview::PreviewMethod,
    /// `--preview-path` (its extension picks the format, as for `-o`).
    pub path: PathBuf,
    /// `--preview-interval`: every this many steps (and the last one).
    pub interval: u32,
    /// `--preview-noisy`.
    pub noisy: bool,
}

/// How ESRGAN upscaling runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpscaleSettings {
    /// Passes through the upscaler (each multiplies the size by its scale).
    pub repeats: u32,
    /// Tile side in input pixels (upstream's default 128); larger inputs go tile by tile.
    pub tile_size: u32,
}

/// How the hires fix enlarges the first pass's result.
#[derive(Debug, Clone, PartialEq)]
pub enum HiresMethod {
    /// The latent ("Latent", "Latent (nearest)", ...).
    Latent(crate::pipeline::resample::Resample),
    /// The decoded image with a filter ("Lanczos", "Nearest").
    Image(crate::pipeline::resample::Resample),
    /// The decoded image through an ESRGAN model (a name under `--hires-upscalers-dir`).
    Model(PathBuf),
}

/// `--hires` and its flags, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct HiresSettings {
    pub method: HiresMethod,
    /// `--hires-upscaler` as given (for the metadata).
    pub name: String,
    pub scale: f32,
    /// `--hires-width` / `--hires-height` (0: from the other one, else from the scale).
    pub width: u32,
    pub height: u32,
    /// `--hires-steps` (0: `--steps`).
    pub steps: u32,
    /// `--hires-denoising-strength`.
    pub strength: f32,
    /// `--hires-upscale-tile-size`.
    pub tile_size: u32,
    /// `--hires-sigmas`.
    pub sigmas: Option<Vec<f32>>,
}

impl HiresSettings {
    /// The target size for a first pass of `w × h` (upstream's rule: both sizes, or one of
    /// them for both sides, else the scale), before the model's size rule.
    pub fn target(&self, w: u32, h: u32) -> (u32, u32) {
        match (self.width, self.height) {
            (0, 0) => (
                (w as f32 * self.scale).round() as u32,
                (h as f32 * self.scale).round() as u32,
            ),
            (tw, 0) => (tw, tw),
            (0, th) => (th, th),
            (tw, th) => (tw, th),
        }
    }
}

/// Wan 2.2 A14B's high-noise expert (`--high-noise-diffusion-model`): where it hands over to
/// the low-noise model and how its steps sample (upstream's `--moe-boundary` and
/// `--high-noise-*` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct HighNoiseSettings {
    /// `--moe-boundary`: the expert runs the steps whose sigma is at least this.
    pub boundary: f32,
    /// Whether `--moe-boundary` was given (else a diffusers pipeline folder's own
    /// `boundary_ratio` wins over the default).
    pub boundary_given: bool,
    /// `--high-noise-steps` (`None`: from the boundary; `Some(n)`: n more steps, run first).
    pub steps: Option<usize>,
    /// `--high-noise-cfg-scale`.
    pub cfg_scale: f32,
    /// `--high-noise-sampling-method` (`None`: the main sampler).
    pub sampler: Option<crate::sampling::SamplerKind>,
}

/// The validated configuration of one run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub mode: Mode,
    pub models: ModelFiles,
    /// `--type`.
    pub weight_type: Option<DType>,
    /// `--model-args`, typed by the family registry.
    pub model_args: ModelArgs,
    /// `--prediction`: overrides the family's detection.
    pub prediction: Option<Prediction>,
    /// `--lora-apply-mode`.
    pub lora_apply_mode: crate::pipeline::lora::LoraApplyMode,
    /// From `-p` or `--prompt-file`.
    pub prompt: String,
    /// From `-n` or `--negative-prompt-file`.
    pub negative_prompt: String,
    /// `None` = not given: the family's default, or the init image's size.
    pub width: Option<u32>,
    pub height: Option<u32>,
    /// Resolved seed (random when `-s` < 0).
    pub seed: i64,
    pub seed_was_random: bool,
    pub batch_count: u32,
    /// `None` = model default (`--clip-skip <= 0`).
    pub clip_skip: Option<u32>,
    pub strength: f32,
    /// `-M vid_gen`: frames and rate (`None` for images).
    pub video: Option<VideoSettings>,
    /// The high-noise expert's settings (used only with `--high-noise-diffusion-model`).
    pub high_noise: HighNoiseSettings,
    pub inputs: InputImages,
    /// `--upscale-repeats`, `--upscale-tile-size` (with `--upscale-model`).
    pub upscale: UpscaleSettings,
    /// `--hires` (`None`: off, or `--hires-upscaler None`).
    pub hires: Option<HiresSettings>,
    pub sampling: SamplingConfig,
    /// `Some` only with `--vae-tiling`.
    pub vae_tiling: Option<TileSettings>,
    pub runtime: RuntimeConfig,
    pub output: OutputConfig,
    /// `--image` of metadata mode.
    pub metadata_image: Option<PathBuf>,
    /// Non-fatal problems (invalid `--model-args` items, clamped overlap, ...) to log.
    pub warnings: Vec<String>,
    /// Long names of the flags given on the command line.
    pub given_flags: BTreeSet<String>,
    /// Flags given that this build parses but does not implement (the run refuses them).
    pub pending_flags: Vec<&'static str>,
}

impl RunConfig {
    /// Path of result `index` (0-based) of this run, following upstream's naming.
    pub fn output_path_for(&self, index: u32) -> PathBuf {
        let total = if matches!(self.mode, Mode::ImgGen | Mode::Adetailer) {
            self.batch_count as u64
        } else {
            1
        };
        output_path::output_path_for(
            &self.output.pattern,
            self.output.begin_idx,
            index as u64,
            total,
        )
    }

    /// Whether `flag` (long name, `--steps`) was on the command line.
    pub fn given(&self, flag: &str) -> bool {
        self.given_flags.contains(flag)
    }

    /// True when both `-W` and `-H` were given (upstream `width_and_height_are_set`).
    pub fn size_is_set(&self) -> bool {
        self.width.is_some() && self.height.is_some()
    }

    /// Width to generate when no image sets it: `-W`, or `default`.
    pub fn width_or(&self, default: u32) -> u32 {
        self.width.unwrap_or(default)
    }

    /// Height to generate when no image sets it: `-H`, or `default`.
    pub fn height_or(&self, default: u32) -> u32 {
        self.height.unwrap_or(default)
    }

    /// Width to generate: `-W`, or 512 (upstream's default).
    pub fn resolved_width(&self) -> u32 {
        self.width_or(512)
    }

    /// Height to generate: `-H`, or 512 (upstream's default).
    pub fn resolved_height(&self) -> u32 {
        self.height_or(512)
    }

    /// Steps: `--steps`, or the family's default.
    pub fn steps(&self, defaults: &Defaults) -> usize {
        if self.given("--steps") {
            self.sampling.steps
        } else {
            defaults.steps
        }
    }

    /// The guidance scales (`--cfg-scale` or the family's default, `--img-cfg-scale`,
    /// `--guidance`).
    pub fn guidance(&self, defaults: &Defaults) -> Guidance {
        let s = &self.sampling;
        let scale = if self.given("--cfg-scale") {
            s.cfg_scale
        } else {
            defaults.cfg_scale
        };
        Guidance {
            scale,
            img_scale: if self.given("--img-cfg-scale") {
                s.img_cfg_scale
            } else {
                scale
            },
            distilled: s.guidance,
        }
    }

    /// The sampling plan for a family: its sampler, schedule and schedule presets unless the
    /// flags say otherwise; `--extra-sample-args` win over the presets.
    pub fn plan(&self, defaults: &Defaults) -> SamplingPlan {
        let s = &self.sampling;
        let mut plan = SamplingPlan::new(
            s.sampler.unwrap_or(defaults.sampler),
            s.scheduler.unwrap_or(defaults.schedule),
            self.steps(defaults),
        );
        plan.schedule_opts = defaults.schedule_options.clone();
        plan.eta = s.eta;
        plan.custom_sigmas = s.sigmas.clone();
        plan.apply_extra_args(&s.extra);
        let layers: Vec<usize> = s
            .skip_layers
            .iter()
            .filter_map(|&l| usize::try_from(l).ok())
            .collect();
        if (s.slg_scale != 0.0 || s.extra.slg_uncond) && !layers.is_empty() {
            plan.slg = Some(crate::sampling::SkipLayerGuidance {
                layers,
                scale: s.slg_scale,
                start: s.skip_layer_start,
                end: s.skip_layer_end,
                uncond: s.extra.slg_uncond,
            });
        }
        plan
    }
}
