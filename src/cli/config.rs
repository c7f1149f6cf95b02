//! [`RunConfig`]: the validated run configuration, built once from [`Cli`] by
//! [`RunConfig::resolve`], the single place where flag values are checked against each other
//! and against the file system (inputs exist, output is writable) before any model loads.
//!
//! Rules follow upstream `SDContextParams/SDGenerationParams/SDCliParams::validate` where
//! upstream has one; extra checks (inputs exist, output writable, tiling flag syntax) are ours.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::args::{Cli, Mode};
use super::checks::{
    check_file, check_hires, check_inputs, check_max_vram, image_side, physical_cores, random_seed,
    read_text,
};
use super::model_args::{ggml_type_name, parse_extra_sample_args, ModelArgs};
use super::output_path::{self, check_output_path};
use super::ref_image_args::RefImageArgs;
use super::tiling::{self, VaeTiling};
pub use super::unimplemented::{
    unimplemented_flags, unimplemented_mode, UNIMPLEMENTED_FLAGS, UNIMPLEMENTED_MODES,
};

/// Largest accepted `-W`/`-H`; above this the latent alone would not fit in any device.
pub const MAX_IMAGE_SIDE: i32 = 16384;

/// A command line that cannot run. Every message names the flag and the offending value.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{flag}: invalid value '{value}': {reason}")]
    InvalidValue {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("{0}")]
    Missing(String),
    #[error("{flag} '{}' does not exist", path.display())]
    InputMissing { flag: &'static str, path: PathBuf },
    #[error("{flag} '{}' is not a {expected}", path.display())]
    InputWrongKind {
        flag: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("{flag}: cannot read '{}': {source}", path.display())]
    InputRead {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{flag} requires {requires}")]
    Requires {
        flag: &'static str,
        requires: &'static str,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("-o/--output '{}': {reason}", path.display())]
    Output { path: PathBuf, reason: String },
}

pub(crate) fn invalid(
    flag: &'static str,
    value: impl ToString,
    reason: impl Into<String>,
) -> CliError {
    CliError::InvalidValue {
        flag,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Paths of the model files (all optional; which ones a model needs is decided at load).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelPaths {
    pub model: Option<PathBuf>,
    pub diffusion_model: Option<PathBuf>,
    pub high_noise_diffusion_model: Option<PathBuf>,
    pub uncond_diffusion_model: Option<PathBuf>,
    pub clip_l: Option<PathBuf>,
    pub clip_g: Option<PathBuf>,
    pub clip_vision: Option<PathBuf>,
    pub t5xxl: Option<PathBuf>,
    pub t5xxl_tokenizer: Option<PathBuf>,
    pub llm: Option<PathBuf>,
    pub llm_vision: Option<PathBuf>,
    pub vae: Option<PathBuf>,
    pub taesd: Option<PathBuf>,
    pub control_net: Option<PathBuf>,
    pub upscale_model: Option<PathBuf>,
    pub embd_dir: Option<PathBuf>,
    pub lora_model_dir: PathBuf,
}

/// Input images named on the command line (existence checked; decoding happens later).
#[derive(Debug, Clone, Default, Serialize)]
pub struct InputImages {
    pub init: Option<PathBuf>,
    pub end: Option<PathBuf>,
    pub mask: Option<PathBuf>,
    pub control: Option<PathBuf>,
    /// `-r`, in command-line order.
    pub refs: Vec<PathBuf>,
    pub increase_ref_index: bool,
    pub auto_resize_ref_image: bool,
    /// `--ref-image-args` (with `--disable-auto-resize-ref-image` folded in).
    pub ref_args: RefImageArgs,
    pub control_strength: f32,
}

/// Sampler, schedule and guidance settings.
#[derive(Debug, Clone, Serialize)]
pub struct SamplingConfig {
    pub steps: u32,
    pub cfg_scale: f32,
    /// `--img-cfg-scale`, or `cfg_scale` when not given (upstream rule).
    pub img_cfg_scale: f32,
    pub guidance: f32,
    pub slg_scale: f32,
    pub skip_layers: Vec<i32>,
    pub skip_layer_start: f32,
    pub skip_layer_end: f32,
    /// `None` = the sampler's default.
    pub eta: Option<f32>,
    /// `None` = auto.
    pub flow_shift: Option<f32>,
    pub timestep_shift: u32,
    /// Trimmed, lower-cased; validated by the sampling module. `None` = model default.
    pub sampling_method: Option<String>,
    /// Trimmed, lower-cased; validated by the sampling module. `None` = model default.
    pub scheduler: Option<String>,
    pub sigmas: Option<Vec<f32>>,
    /// Trimmed, lower-cased (`cuda` by default); validated by the sampling module.
    pub rng: String,
    /// `None` = same as `rng`.
    pub sampler_rng: Option<String>,
    pub extra_sample_args: Vec<(String, String)>,
    /// The joined raw text, for metadata.
    pub extra_sample_args_raw: String,
}

/// Devices, threads and memory.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeConfig {
    /// Resolved: `-t <= 0` became the number of physical cores.
    pub threads: u32,
    pub backend: String,
    pub params_backend: String,
    pub max_vram: String,
    pub offload_to_cpu: bool,
    pub disable_prefetch: bool,
    pub disable_segmented_compute: bool,
    pub mmap: bool,
    pub flash_attn: bool,
    pub diffusion_flash_attn: bool,
    pub diffusion_conv_direct: bool,
    pub vae_conv_direct: bool,
    pub clip_on_cpu: bool,
    pub vae_on_cpu: bool,
    pub control_net_cpu: bool,
    pub list_devices: bool,
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
}

/// The validated configuration of one run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub mode: Mode,
    pub models: ModelPaths,
    /// `--type`, canonical ggml name.
    pub weight_type: Option<&'static str>,
    pub tensor_type_rules: String,
    pub model_args: ModelArgs,
    pub model_args_raw: String,
    /// From `-p` or `--prompt-file`.
    pub prompt: String,
    /// From `-n` or `--negative-prompt-file`.
    pub negative_prompt: String,
    /// `None` = not given: 512, or the init image's size (see [`RunConfig::set_size_if_unset`]).
    pub width: Option<u32>,
    pub height: Option<u32>,
    /// Resolved seed (random when `-s` < 0).
    pub seed: i64,
    pub seed_was_random: bool,
    pub batch_count: u32,
    /// `None` = model default (`--clip-skip <= 0`).
    pub clip_skip: Option<u32>,
    pub strength: f32,
    pub inputs: InputImages,
    pub sampling: SamplingConfig,
    /// `Some` only with `--vae-tiling`.
    pub vae_tiling: Option<VaeTiling>,
    pub runtime: RuntimeConfig,
    pub output: OutputConfig,
    /// Non-fatal problems (invalid `--model-args` items, clamped overlap, ...) to log.
    pub warnings: Vec<String>,
    /// Long names of the flags given on the command line.
    pub given_flags: BTreeSet<String>,
    /// Every flag as parsed, for the rarely used ones not mapped above.
    pub cli: Cli,
}

fn norm_name(s: &Option<String>) -> Option<String> {
    s.as_ref()
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
}

fn check_finite(flag: &'static str, v: f32) -> Result<f32, CliError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(invalid(flag, v, "must be a finite number"))
    }
}

impl RunConfig {
    /// Validates `cli` and resolves defaults. No model is touched; the file system is only
    /// read (inputs exist, prompt files) and probed (output directory writable).
    pub fn resolve(cli: Cli) -> Result<RunConfig, CliError> {
        let mut warnings = Vec::new();
        let mode = cli.mode;
        let m = &cli.model;
        let g = &cli.generation;
        let s = &cli.sampling;

        // Mode requirements (upstream validate()).
        match mode {
            Mode::Metadata => {
                if cli.other.image.is_none() {
                    return Err(CliError::Missing(
                        "metadata mode needs an image path (--image)".into(),
                    ));
                }
            }
            Mode::Convert => {
                let any = [
                    &m.model,
                    &m.clip_l,
                    &m.clip_g,
                    &m.t5xxl,
                    &m.diffusion_model,
                    &m.vae,
                ]
                .iter()
                .any(|p| p.is_some());
                if !any {
                    return Err(CliError::Missing(
                        "convert mode needs at least one model input path".into(),
                    ));
                }
            }
            Mode::Upscale => {
                if m.upscale_model.is_none() {
                    return Err(CliError::Missing(
                        "upscale mode needs an upscaler model (--upscale-model)".into(),
                    ));
                }
            }
            _ => {
                if m.model.is_none() && m.diffusion_model.is_none() {
                    return Err(CliError::Missing(format!(
                        "{} mode needs a model: give -m/--model or --diffusion-model",
                        mode.as_str()
                    )));
                }
            }
        }
        if matches!(mode, Mode::Upscale | Mode::Adetailer) && g.init_img.is_none() {
            return Err(CliError::Missing(format!(
                "{} mode needs an init image (--init-img)",
                mode.as_str()
            )));
        }
        if mode == Mode::Adetailer && g.ad_model.is_none() {
            return Err(CliError::Missing(
                "adetailer mode needs a detector model (--ad-model)".into(),
            ));
        }
        if g.ad_model.is_some() && !matches!(mode, Mode::ImgGen | Mode::Adetailer) {
            return Err(CliError::Conflict(
                "--ad-model is only supported in img_gen and adetailer modes".into(),
            ));
        }

        // Input files must exist (metadata mode only reads --image).
        if mode == Mode::Metadata {
            check_file("--image", &cli.other.image)?;
        } else {
            check_inputs(&cli)?;
        }

        // Prompts.
        let prompt = match &g.prompt_file {
            Some(p) => read_text("--prompt-file", p)?,
            None => g.prompt.clone(),
        };
        let negative_prompt = match &g.negative_prompt_file {
            Some(p) => read_text("--negative-prompt-file", p)?,
            None => g.negative_prompt.clone(),
        };

        // Generation numbers.
        let width = image_side("-W/--width", g.width)?;
        let height = image_side("-H/--height", g.height)?;
        if g.batch_count < 1 {
            return Err(invalid(
                "-b/--batch-count",
                g.batch_count,
                "must be at least 1",
            ));
        }
        if s.steps < 1 {
            return Err(invalid("--steps", s.steps, "must be greater than 0"));
        }
        let strength = check_finite("--strength", g.strength)?;
        if !(0.0..=1.0).contains(&strength) {
            return Err(invalid("--strength", strength, "must be in [0.0, 1.0]"));
        }
        let cfg_scale = check_finite("--cfg-scale", s.cfg_scale)?;
        if cfg_scale < 0.0 {
            return Err(invalid("--cfg-scale", cfg_scale, "must not be negative"));
        }
        let img_cfg_scale = match s.img_cfg_scale {
            Some(v) => check_finite("--img-cfg-scale", v)?,
            None => cfg_scale,
        };
        let guidance = check_finite("--guidance", s.guidance)?;
        let slg_scale = check_finite("--slg-scale", s.slg_scale)?;
        let skip_layer_start = check_finite("--skip-layer-start", s.skip_layer_start)?;
        let skip_layer_end = check_finite("--skip-layer-end", s.skip_layer_end)?;
        let eta = s.eta.map(|v| check_finite("--eta", v)).transpose()?;
        let flow_shift = s
            .flow_shift
            .map(|v| check_finite("--flow-shift", v))
            .transpose()?;
        if !(0..=1000).contains(&s.timestep_shift) {
            return Err(invalid(
                "--timestep-shift",
                s.timestep_shift,
                "must be in [0, 1000]",
            ));
        }
        let control_strength = check_finite("--control-strength", g.control_strength)?;
        if g.qwen_image_layers < 0 {
            return Err(invalid(
                "--qwen-image-layers",
                g.qwen_image_layers,
                "must not be negative",
            ));
        }
        if mode == Mode::VidGen && g.video_frames <= 0 {
            return Err(invalid(
                "--video-frames",
                g.video_frames,
                "must be greater than 0",
            ));
        }
        if mode == Mode::VidGen && g.fps <= 0 {
            return Err(invalid("--fps", g.fps, "must be greater than 0"));
        }
        if g.ref_video_audio.len() > g.ref_video.len() {
            return Err(CliError::Conflict(
                "each --ref-video-audio needs a corresponding --ref-video".into(),
            ));
        }
        if mode != Mode::VidGen
            && (!g.ref_video.is_empty() || !g.ref_video_audio.is_empty() || !g.ref_audio.is_empty())
        {
            return Err(CliError::Conflict(
                "--ref-video, --ref-video-audio and --ref-audio require -M vid_gen".into(),
            ));
        }
        if g.upscale_repeats < 1 {
            return Err(invalid(
                "--upscale-repeats",
                g.upscale_repeats,
                "must be at least 1",
            ));
        }
        if g.upscale_tile_size < 1 {
            return Err(invalid(
                "--upscale-tile-size",
                g.upscale_tile_size,
                "must be at least 1",
            ));
        }
        if g.hires {
            check_hires(&cli)?;
        }
        if let Some(sig) = &s.sigmas {
            if sig.0.is_empty() {
                return Err(invalid("--sigmas", "", "needs at least one value"));
            }
        }

        // Seed.
        let (seed, seed_was_random) = if g.seed < 0 {
            (random_seed(), true)
        } else {
            (g.seed, false)
        };

        // Model args and weight types.
        let model_args_raw = cli.model.model_args.join(",");
        let (model_args, w) = ModelArgs::parse(&model_args_raw);
        warnings.extend(w);
        let extra_sample_args_raw = s.extra_sample_args.join(",");
        let (extra_sample_args, w) = parse_extra_sample_args(&extra_sample_args_raw);
        warnings.extend(w);
        let weight_type = match &m.weight_type {
            None => None,
            Some(t) => Some(ggml_type_name(t.trim()).ok_or_else(|| {
                invalid(
                    "--type",
                    t,
                    "unknown weight type (e.g. f32, f16, bf16, q8_0, q4_0, q4_K)",
                )
            })?),
        };

        // VAE tiling.
        let vae_tiling = Self::resolve_tiling(&cli, &mut warnings)?;

        // Runtime.
        let r = &cli.runtime;
        check_max_vram(&r.max_vram)?;
        let threads = if r.threads <= 0 {
            physical_cores()
        } else {
            r.threads as u32
        };

        // Output.
        let output = Self::resolve_output(&cli, &mut warnings)?;

        let runtime = RuntimeConfig {
            threads,
            backend: r.backend.join(","),
            params_backend: r.params_backend.join(","),
            max_vram: r.max_vram.trim().to_string(),
            offload_to_cpu: r.offload_to_cpu,
            disable_prefetch: r.disable_prefetch,
            disable_segmented_compute: r.disable_segmented_compute,
            mmap: r.mmap,
            flash_attn: r.fa,
            diffusion_flash_attn: r.diffusion_fa,
            diffusion_conv_direct: r.diffusion_conv_direct,
            vae_conv_direct: cli.vae.vae_conv_direct,
            clip_on_cpu: r.clip_on_cpu,
            vae_on_cpu: cli.vae.vae_on_cpu,
            control_net_cpu: r.control_net_cpu,
            list_devices: cli.other.list_devices,
            verbose: cli.other.verbose,
            color: cli.other.color,
        };
        let sampling = SamplingConfig {
            steps: s.steps as u32,
            cfg_scale,
            img_cfg_scale,
            guidance,
            slg_scale,
            skip_layers: s.skip_layers.0.clone(),
            skip_layer_start,
            skip_layer_end,
            eta,
            flow_shift,
            timestep_shift: s.timestep_shift as u32,
            sampling_method: norm_name(&s.sampling_method),
            scheduler: norm_name(&s.scheduler),
            sigmas: s.sigmas.as_ref().map(|v| v.0.clone()),
            rng: norm_name(&Some(s.rng.clone())).unwrap_or_else(|| "cuda".into()),
            sampler_rng: norm_name(&s.sampler_rng),
            extra_sample_args,
            extra_sample_args_raw,
        };
        let models = ModelPaths {
            model: m.model.clone(),
            diffusion_model: m.diffusion_model.clone(),
            high_noise_diffusion_model: m.high_noise_diffusion_model.clone(),
            uncond_diffusion_model: m.uncond_diffusion_model.clone(),
            clip_l: m.clip_l.clone(),
            clip_g: m.clip_g.clone(),
            clip_vision: m.clip_vision.clone(),
            t5xxl: m.t5xxl.clone(),
            t5xxl_tokenizer: m.t5xxl_tokenizer.clone(),
            llm: m.llm.clone(),
            llm_vision: m.llm_vision.clone(),
            vae: m.vae.clone(),
            taesd: m.taesd.clone(),
            control_net: m.control_net.clone(),
            upscale_model: m.upscale_model.clone(),
            embd_dir: m.embd_dir.clone(),
            lora_model_dir: m.lora_model_dir.clone(),
        };
        let mut ref_args = RefImageArgs::default();
        if g.disable_auto_resize_ref_image {
            ref_args.resize_before_vae = false;
        }
        warnings.extend(ref_args.apply(&g.ref_image_args));
        let inputs = InputImages {
            init: g.init_img.clone(),
            end: g.end_img.clone(),
            mask: g.mask.clone(),
            control: g.control_image.clone(),
            refs: g.ref_image.clone(),
            increase_ref_index: g.increase_ref_index,
            auto_resize_ref_image: ref_args.resize_before_vae,
            ref_args,
            control_strength,
        };
        Ok(RunConfig {
            mode,
            models,
            weight_type,
            tensor_type_rules: m.tensor_type_rules.join(","),
            model_args,
            model_args_raw,
            prompt,
            negative_prompt,
            width,
            height,
            seed,
            seed_was_random,
            batch_count: g.batch_count as u32,
            clip_skip: (g.clip_skip > 0).then_some(g.clip_skip as u32),
            strength,
            inputs,
            sampling,
            vae_tiling,
            runtime,
            output,
            warnings,
            given_flags: cli.given_flags.clone(),
            cli,
        })
    }

    fn resolve_tiling(
        cli: &Cli,
        warnings: &mut Vec<String>,
    ) -> Result<Option<VaeTiling>, CliError> {
        let v = &cli.vae;
        if !v.vae_tiling {
            for (flag, given) in [
                ("--vae-tile-size", v.vae_tile_size.is_some()),
                (
                    "--vae-relative-tile-size",
                    v.vae_relative_tile_size.is_some(),
                ),
                ("--vae-tile-overlap", v.vae_tile_overlap.is_some()),
            ] {
                if given {
                    return Err(CliError::Requires {
                        flag,
                        requires: "--vae-tiling",
                    });
                }
            }
            return Ok(None);
        }
        let mut t = VaeTiling::default();
        if let Some(s) = &v.vae_tile_size {
            let (w, h) =
                tiling::parse_tile_size(s).map_err(|e| invalid("--vae-tile-size", s, e))?;
            t.tile_w = w;
            t.tile_h = h;
        }
        if let Some(s) = &v.vae_relative_tile_size {
            t.relative = Some(
                tiling::parse_relative_tile_size(s)
                    .map_err(|e| invalid("--vae-relative-tile-size", s, e))?,
            );
        }
        if let Some(o) = v.vae_tile_overlap {
            let (c, clamped) =
                tiling::clamp_overlap(o).map_err(|e| invalid("--vae-tile-overlap", o, e))?;
            if clamped {
                warnings.push(format!(
                    "--vae-tile-overlap {o} clamped to {c} (allowed range [0, 0.5])"
                ));
            }
            t.overlap = c;
        }
        Ok(Some(t))
    }

    fn resolve_output(cli: &Cli, warnings: &mut Vec<String>) -> Result<OutputConfig, CliError> {
        let o = &cli.output;
        let mut pattern = o.output.clone();
        if cli.mode == Mode::Convert && pattern == "output.png" {
            pattern = "output.gguf".into();
        }
        let begin_idx = match o.output_begin_idx {
            None => 0,
            Some(v) if v >= 0 => v as u64,
            Some(v) => {
                warnings.push(format!("--output-begin-idx {v} is negative; using 0"));
                0
            }
        };
        let mut out = OutputConfig {
            pattern,
            begin_idx,
            embed_metadata: !o.disable_image_metadata,
            create_parent_dirs: false,
        };
        if cli.mode == Mode::Metadata {
            return Ok(out);
        }
        if out.pattern.trim().is_empty() {
            return Err(CliError::Missing("-o/--output must not be empty".into()));
        }
        // Upstream would quietly write `<dir>.png` next to an existing directory; refuse.
        if Path::new(&out.pattern).is_dir() {
            return Err(CliError::Output {
                path: PathBuf::from(&out.pattern),
                reason: "it is a directory; give a file name such as out.png".into(),
            });
        }
        let total = if matches!(cli.mode, Mode::ImgGen | Mode::Adetailer) {
            cli.generation.batch_count.max(1) as u64
        } else {
            1
        };
        // Distinct parents only: a big batch into one directory probes it once.
        let mut seen = BTreeSet::new();
        for i in 0..total {
            let path = if cli.mode == Mode::Convert {
                PathBuf::from(&out.pattern)
            } else {
                output_path::output_path_for(&out.pattern, begin_idx, i, total)
            };
            let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
            if !seen.insert(parent) && !path.exists() {
                continue;
            }
            let must_create = check_output_path(&path, cli.mode != Mode::Convert).map_err(|e| {
                CliError::Output {
                    path: path.clone(),
                    reason: e.to_string(),
                }
            })?;
            out.create_parent_dirs |= must_create;
        }
        Ok(out)
    }

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

    /// True when both `-W` and `-H` were given (upstream `width_and_height_are_set`).
    pub fn size_is_set(&self) -> bool {
        self.width.is_some() && self.height.is_some()
    }

    /// Upstream: when `-W`/`-H` were not both given, an init image sets the size.
    pub fn set_size_if_unset(&mut self, w: u32, h: u32) {
        if !self.size_is_set() {
            self.width = Some(w);
            self.height = Some(h);
        }
    }

    /// Width to generate: `-W`, or 512.
    pub fn resolved_width(&self) -> u32 {
        self.width.unwrap_or(512)
    }

    /// Height to generate: `-H`, or 512.
    pub fn resolved_height(&self) -> u32 {
        self.height.unwrap_or(512)
    }
}

/// Upstream rounds a requested size up to the model's spatial multiple (VAE factor x patch)
/// with a warning instead of failing. Returns the aligned size.
pub fn align_size_up(w: u32, h: u32, multiple: u32) -> (u32, u32) {
    if multiple <= 1 {
        return (w, h);
    }
    (
        w.div_ceil(multiple) * multiple,
        h.div_ceil(multiple) * multiple,
    )
}
