//! Qwen Image 2.1 text-to-image, editing and img2img: Qwen3-VL text encoder (with the vision
//! tower for reference images, [`edit`]) → Qwen Image 2.1 transformer (velocity prediction on
//! the Flux-shifted flow schedule, optional true CFG) → Qwen Image 2.1 VAE (RGBA).
//!
//! Matches diffusers' `QwenImage21Pipeline` (REFERENCE-NOTES §13–25): the prompt goes through
//! the chat template and the system turn's rows are dropped; the latent is `noise` at σ = 1 in
//! transformer space (`(z − mean) / std`); every step calls the transformer with t = σ and
//! moves `x += (σ_next − σ)·v`; with CFG (cfg scale ≠ 1) cond and uncond are two separate calls
//! with their own text lengths, combined as `uncond + s·(cond − uncond)`; the VAE decodes
//! `x·std + mean`, clamps to [−1, 1] and maps to [0, 1] RGBA.
//!
//! The prefix tokens' keys and values (text, and reference latents when editing) never change
//! across steps (they are modulated with t = 0 and never attend to the target), so by default
//! each condition's prefix is stored on its first step and reused ([`PrefixCache`]); the result
//! is the same as without it.

use std::path::Path;
use std::time::Instant;

use crate::app::{BackendPlan, Module};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::dit::qwen_image_2_1::{
    Condition, PrefixCache, PrefixCacheError, PrefixLayout, QwenImage21, QwenImage21Config,
};
use crate::models::te::qwen3::{
    encode_qwen_image_21, qwen3_hparams, qwen3_mrope_section, Qwen3Config, Qwen3Source,
    Qwen3TextModel, DEFAULT_MROPE_SECTION,
};
use crate::models::vae::qwen_image_2_1_vae::{LatentStats, QwenImage21Vae, QwenImage21VaeConfig};
use crate::models::vae::tiling::{decode_with_retry, tiled_decode, Planar, TileSettings};
use crate::progress::Progress;
use crate::rng::Rng;
use crate::runner::{
    HostTensor, MemoryOptions, RunOptions, Runner, RunnerError, StoreSource, WeightLoader,
};
use crate::sampling::schedules::FluxScheduleParams;
use crate::sampling::{
    guidance, ModelSchedule, Prediction, SamplerKind, SamplingError, SamplingPlan, ScheduleKind,
    ScheduleOptions,
};
use crate::tokenizers::{
    bpe_from_gguf_metadata, find_qwen_tokenizer, load_qwen_tokenizer, BpeTokenizer,
};
use crate::weights::{Component, TensorStore};

use super::memo::Memo;
use super::vae_decode::encode_maybe_tiled;
use super::FloatImage;

mod edit;
mod refs;
pub use edit::EditInputs;
pub use refs::{calculate_dimensions, prepare_reference, reference_size, PreparedRef};

/// Defaults of upstream sd-cli for this family: Euler on the `flux` schedule with the Qwen
/// Image 2.1 parameters ([`schedule_options`]).
pub const DEFAULT_SAMPLER: SamplerKind = SamplerKind::Euler;
pub const DEFAULT_SCHEDULE: ScheduleKind = ScheduleKind::Flux;
/// Image pixels per latent pixel (one transformer token each).
pub const VAE_SCALE: usize = 16;
/// Image sizes must be multiples of this (the pipeline floors to it).
pub const SIZE_MULTIPLE: usize = 32;
/// Cache-entry base of the prefix K/V cache in the transformer runner.
const CACHE_BASE: &str = "qwen_image_2_1.prefix";

/// Schedule options with the Qwen Image 2.1 flux parameters (a model preset: apply
/// `--extra-sample-args` after it).
pub fn schedule_options() -> ScheduleOptions {
    ScheduleOptions {
        flux: FluxScheduleParams::QWEN_IMAGE_2_1,
        ..ScheduleOptions::default()
    }
}

/// The prefix-cache storage type: `requested` (a ggml type name), or with `None` ("auto")
/// f16 when flash attention is on, else f32.
pub fn prefix_cache_type(requested: Option<&str>, flash_attn: bool) -> Result<DType> {
    match requested {
        None => Ok(if flash_attn { DType::F16 } else { DType::F32 }),
        Some(name) => DType::from_name(name).ok_or_else(|| Error::Flag {
            flag: "--model-args qwen_image_2_1_prefix_cache_type".into(),
            reason: format!("unknown ggml type '{name}'"),
        }),
    }
}

/// Where the model files are and how to load them.
pub struct QwenImage21Load<'a> {
    /// Every file of the run under its component prefix (diffusion, `Component::Llm`, VAE).
    pub store: &'a TensorStore,
    /// The LLM file as given (for finding a tokenizer beside it).
    pub llm_path: Option<&'a Path>,
    pub tokenizer_path: Option<&'a Path>,
    pub wtype: Option<DType>,
    pub flash_attn: bool,
    pub backends: &'a BackendPlan,
    /// `--max-vram`, `--offload-to-cpu`, prefetch and segmentation switches.
    pub memory: MemoryOptions,
    /// Store/reuse each condition's text K/V across steps.
    pub prefix_cache: bool,
    /// Storage type of the cached K/V (see [`prefix_cache_type`]).
    pub prefix_cache_type: DType,
    /// Build the VAE encoder (for `--init-img` and reference images).
    pub need_encoder: bool,
    /// Load the Qwen3-VL vision tower (for reference images).
    pub need_vision: bool,
    /// The `--llm_vision` file, if any (its folder may hold `preprocessor_config.json`).
    pub vision_path: Option<&'a Path>,
}

/// One image request.
pub struct QwenImage21Request<'a> {
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub width: usize,
    pub height: usize,
    /// True CFG scale; 1 runs the conditional call only.
    pub cfg_scale: f32,
    /// The sampler, schedule and steps; the token count and (for the `flux` schedule) the
    /// Qwen parameters are filled in by the pipeline when left at their defaults.
    pub plan: &'a SamplingPlan,
    pub noise_rng: &'a mut dyn Rng,
    pub sampler_rng: &'a mut dyn Rng,
    pub vae_tiling: Option<&'a TileSettings>,
    /// Keep the cached text prefixes after this image (the next image reuses them when its
    /// prompts are the same); otherwise they are freed when sampling ends.
    pub keep_prefix_cache: bool,
    /// img2img: the init image's latent in transformer space ([`encode_image`]) and
    /// `--strength`.
    ///
    /// [`encode_image`]: QwenImage21Pipeline::encode_image
    pub init: Option<(&'a Planar, f32)>,
    /// Editing: the prepared reference images ([`QwenImage21Pipeline::prepare_edit`]).
    pub edit: Option<&'a EditInputs>,
}

pub struct QwenImage21Pipeline {
    tokenizer: BpeTokenizer,
    te: Qwen3TextModel,
    te_runner: Runner,
    dit: QwenImage21,
    dit_runner: Runner,
    vae: QwenImage21Vae,
    vae_runner: Runner,
    stats: LatentStats,
    cache: Option<PrefixCache>,
    /// Prompt → embedding of the last request (reused across --batch-count images).
    embeds: Memo<HostTensor>,
    vision: Option<edit::Vision>,
    /// (references, prompt) → edit embedding and image-slot mask, as `embeds`.
    edit_embeds: Memo<edit::EditEmbedding>,
}

fn missing(what: &str, flag: &str) -> Error {
    Error::Unsupported(format!(
        "Qwen Image 2.1 needs {what}: none was found in the model files (pass {flag})"
    ))
}

fn cache_err(e: PrefixCacheError) -> Error {
    match e {
        PrefixCacheError::Runner(r) => Error::Runner(r),
        other => Error::Unsupported(other.to_string()),
    }
}

fn component_config(store: &TensorStore, c: Component) -> Option<&serde_json::Value> {
    store
        .files()
        .iter()
        .filter(|f| f.prefix == c.prefix())
        .find_map(|f| f.config.as_ref())
}

fn load_tokenizer(
    store: &TensorStore,
    llm_path: Option<&Path>,
    explicit: Option<&Path>,
) -> Result<BpeTokenizer> {
    if explicit.is_none() {
        for f in store
            .files()
            .iter()
            .filter(|f| f.prefix == Component::Llm.prefix())
        {
            let origin = f.path.display().to_string();
            if let Some(tok) = bpe_from_gguf_metadata(&f.gguf, &origin) {
                log::debug!("Qwen tokenizer: from GGUF metadata of {origin}");
                return Ok(tok?);
            }
        }
    }
    let llm_path = llm_path.ok_or_else(|| missing("a Qwen3-VL text encoder", "--llm"))?;
    let path = find_qwen_tokenizer(explicit, llm_path)?;
    log::debug!("Qwen tokenizer: {}", path.display());
    Ok(load_qwen_tokenizer(&path)?)
}

impl QwenImage21Pipeline {
    pub fn load(opts: &QwenImage21Load<'_>) -> Result<Self> {
        let store = opts.store;
        let run_opts = || RunOptions {
            flash_attn: opts.flash_attn,
            memory: opts.memory.clone(),
            ..RunOptions::default()
        };
        let mut bar = Progress::new("loading model", 3);

        // Diffusion transformer (also when a store holds single-file names one
        // `model.diffusion_model.` deeper than the component prefix).
        let dit_prefix = {
            let p = Component::Diffusion.prefix();
            let nested = format!("{p}model.diffusion_model.");
            if store.with_prefix(&nested).next().is_some() {
                nested
            } else {
                p.to_string()
            }
        };
        let dit_src = StoreSource::new(store, &dit_prefix);
        let loader = WeightLoader::new(&dit_src, opts.wtype);
        let mut config = QwenImage21Config::detect(&loader.root(""))?;
        if let Some(axes) = component_config(store, Component::Diffusion)
            .and_then(|c| c.get("axes_dims_rope")?.as_array().cloned())
        {
            let axes: Vec<usize> = axes
                .iter()
                .filter_map(|v| v.as_u64().map(|v| v as usize))
                .collect();
            if let [f, h, w] = axes[..] {
                config = config.with_axes_dims([f, h, w])?;
            }
        }
        log::debug!("qwen_image_2_1: {config:?}");
        let dit = QwenImage21::new(&loader.root(""), config)?;
        let backend = opts.backends.backend(Module::Diffusion)?;
        let dit_weights = loader.finish_for(&backend, "qwen_image_2_1", &opts.memory)?;
        bar.tick();
        let dit_runner = Runner::new("qwen_image_2_1", backend, Some(dit_weights), run_opts());
        let cache = if opts.prefix_cache {
            Some(
                PrefixCache::new(CACHE_BASE, opts.prefix_cache_type, dit.config())
                    .map_err(cache_err)?,
            )
        } else {
            None
        };

        // Text encoder.
        if store.with_prefix(Component::Llm.prefix()).next().is_none() {
            return Err(missing("a Qwen3-VL text encoder", "--llm"));
        }
        let te_src = Qwen3Source::new(store, Component::Llm.prefix());
        let loader = WeightLoader::new(&te_src, opts.wtype);
        let (theta, eps) = qwen3_hparams(store);
        let te_config = Qwen3Config::detect(&loader.root(""), Some(theta), Some(eps))?;
        if te_config.hidden != dit.config().text_dim {
            return Err(Error::Unsupported(format!(
                "the text encoder's hidden size {} does not match the transformer's text input {}",
                te_config.hidden,
                dit.config().text_dim
            )));
        }
        let head_dim = te_config.head_dim;
        let te = Qwen3TextModel::new(&loader.root(""), te_config)?
            .with_mrope_section(mrope_section(store, head_dim));
        let backend = opts.backends.backend(Module::TextEncoder)?;
        let te_weights = loader.finish_for(&backend, "qwen3", &opts.memory)?;
        bar.tick();
        let te_runner = Runner::new("qwen3", backend, Some(te_weights), run_opts());
        let tokenizer = load_tokenizer(store, opts.llm_path, opts.tokenizer_path)?;
        let vision = if opts.need_vision {
            let files: Vec<&Path> = opts.vision_path.into_iter().chain(opts.llm_path).collect();
            let backend = opts.backends.backend(Module::TextEncoder)?;
            let v = edit::Vision::load(store, &files, backend, run_opts(), &opts.memory)?;
            if v.out_hidden() != te.config().hidden {
                return Err(Error::Unsupported(format!(
                    "the vision tower's output size {} does not match the LLM's hidden size {}",
                    v.out_hidden(),
                    te.config().hidden
                )));
            }
            Some(v)
        } else {
            None
        };

        // VAE (decoder only; its convolutions keep the file's float type).
        if store.with_prefix(Component::Vae.prefix()).next().is_none() {
            return Err(missing("a VAE", "--vae"));
        }
        let vae_src = StoreSource::new(store, Component::Vae.prefix());
        let loader = WeightLoader::new(&vae_src, None);
        let mut vae_config = QwenImage21VaeConfig::detect(&loader.root(""))?;
        if !vae_config.decoder {
            return Err(Error::Unsupported(
                "the VAE file has no decoder weights".into(),
            ));
        }
        if opts.need_encoder && !vae_config.encoder {
            return Err(Error::Unsupported(
                "--init-img and -r need a VAE with an encoder, but the VAE file has only a decoder"
                    .into(),
            ));
        }
        vae_config.encoder = opts.need_encoder;
        let stats = match component_config(store, Component::Vae)
            .and_then(LatentStats::from_diffusers_config)
        {
            Some(s) => s?,
            None => vae_config.latent_stats.clone().ok_or_else(|| {
                Error::Unsupported(format!(
                    "the VAE has a {}-channel latent but no latents_mean/latents_std \
                     (only the released 64-channel statistics are built in)",
                    vae_config.z_dim
                ))
            })?,
        };
        if stats.channels() != vae_config.z_dim || vae_config.z_dim != dit.config().in_channels {
            return Err(Error::Unsupported(format!(
                "latent channels disagree: VAE {}, statistics {}, transformer {}",
                vae_config.z_dim,
                stats.channels(),
                dit.config().in_channels
            )));
        }
        let vae = QwenImage21Vae::new(&loader.root(""), vae_config)?;
        let backend = opts.backends.backend(Module::Vae)?;
        let vae_weights = loader.finish_for(&backend, "vae", &opts.memory)?;
        bar.tick();
        let vae_runner = Runner::new("vae", backend, Some(vae_weights), run_opts());
        Ok(Self {
            tokenizer,
            te,
            te_runner,
            dit,
            dit_runner,
            vae,
            vae_runner,
            stats,
            cache,
            embeds: Memo::new(2),
            vision,
            edit_embeds: Memo::new(2),
        })
    }

    /// Image sizes must be multiples of this.
    pub fn size_multiple(&self) -> usize {
        SIZE_MULTIPLE
    }

    pub fn transformer_config(&self) -> &QwenImage21Config {
        self.dit.config()
    }

    /// The model schedule for an image of `tokens` latent pixels (Flux flow, mu from the
    /// Qwen Image 2.1 anchors; the transformer takes t = σ).
    pub fn model_schedule(tokens: usize) -> ModelSchedule {
        ModelSchedule::FluxFlow {
            shift: FluxScheduleParams::QWEN_IMAGE_2_1.mu(tokens as u32),
        }
    }

    /// The prompt embedding [hidden, L]: the templated prompt through the text encoder, minus
    /// the system turn (an empty prompt becomes " ").
    pub fn encode_prompt(&self, prompt: &str) -> Result<HostTensor> {
        self.embeds.get_or_try(prompt, || {
            encode_qwen_image_21(&self.te_runner, &self.te, &self.tokenizer, prompt)
                .map_err(Error::from)
        })
    }

    /// The transformer condition of `prompt` (with the references when editing).
    fn condition(&self, prompt: &str, edit: Option<&EditInputs>) -> Result<PromptCondition> {
        if let Some(e) = edit.filter(|e| !e.is_empty()) {
            return self.edit_condition(prompt, e);
        }
        Ok(PromptCondition {
            text: self.encode_prompt(prompt)?,
            refs: Vec::new(),
            layout: None,
        })
    }

    /// Generates one image; returns it in [0, 1] as RGBA [W, H, 4].
    pub fn txt2img(&self, req: QwenImage21Request<'_>) -> Result<FloatImage> {
        let tiling = req.vae_tiling;
        let x = self.sample(req)?;
        let t = Instant::now();
        let image = self.decode(&x, tiling)?;
        log::debug!("qwen_image_2_1: decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(image)
    }

    /// Frees the cached text prefixes (they are freed after each image unless kept).
    pub fn release_prefix_cache(&self) {
        if let Some(c) = &self.cache {
            c.clear(&self.dit_runner);
        }
    }

    /// Bytes the transformer runner's cache holds now.
    pub fn prefix_cache_bytes(&self) -> usize {
        self.dit_runner.cache_bytes()
    }

    /// Runs conditioning and sampling; returns the final latent in transformer space
    /// (`(z − mean) / std`), [w, h, C].
    pub fn sample(&self, req: QwenImage21Request<'_>) -> Result<Planar> {
        super::check_size(req.width, req.height, SIZE_MULTIPLE)?;
        let t0 = Instant::now();
        let cond = self.condition(req.prompt, req.edit)?;
        let use_cfg = req.cfg_scale != 1.0;
        let uncond = if use_cfg {
            Some(self.condition(req.negative_prompt, req.edit)?)
        } else {
            None
        };
        let condition_secs = t0.elapsed().as_secs_f64();

        let c = self.dit.config().in_channels;
        let (lw, lh) = (req.width / VAE_SCALE, req.height / VAE_SCALE);
        let tokens = lw * lh;
        let schedule = Self::model_schedule(tokens);
        let mut plan = req.plan.clone();
        plan.schedule_opts.image_seq_len = tokens as u32;
        if plan.schedule_opts.flux == FluxScheduleParams::FLUX {
            plan.schedule_opts.flux = FluxScheduleParams::QWEN_IMAGE_2_1;
        }
        let mut sigmas = plan.sigmas(&schedule)?;
        let noise = req.noise_rng.randn(tokens * c);
        let start = match req.init {
            None => vec![0.0; noise.len()],
            Some((latent, strength)) => {
                if (latent.w, latent.h, latent.c) != (lw, lh, c) {
                    return Err(Error::Unsupported(format!(
                        "init image latent is {}x{}x{}, expected {lw}x{lh}x{c}",
                        latent.w, latent.h, latent.c
                    )));
                }
                sigmas = super::img2img_sigmas(&sigmas, strength);
                latent.data.clone()
            }
        };
        let x0 = schedule.noise_scaling(sigmas[0], &noise, &start)?;

        let t1 = Instant::now();
        let steps = sigmas.len().saturating_sub(1);
        let mut progress = Progress::new("sampling", steps);
        let mut denoiser = Denoiser {
            pipe: self,
            schedule: &schedule,
            cond: &cond,
            uncond: uncond.as_ref(),
            lat: [lw, lh, c, 1],
            cfg_scale: req.cfg_scale,
            progress: &mut progress,
        };
        let result = plan.run(&schedule, &mut denoiser, x0, &sigmas, req.sampler_rng);
        if !req.keep_prefix_cache || result.is_err() {
            self.release_prefix_cache();
        }
        let latent = result?;
        log::debug!(
            "qwen_image_2_1: condition {condition_secs:.2}s, sampling {:.2}s ({steps} steps)",
            t1.elapsed().as_secs_f64()
        );
        Ok(Planar::new(lw, lh, c, latent)?)
    }

    /// Decodes a transformer-space latent [w, h, C] to an RGBA image in [0, 1]: `x·std + mean`
    /// through the VAE, clamped to [−1, 1], `/2 + 0.5`. Tiles when asked, and retries with
    /// smaller tiles when the decode does not fit in memory.
    pub fn decode(&self, x: &Planar, tiling: Option<&TileSettings>) -> Result<FloatImage> {
        let mut z = HostTensor::new([x.w, x.h, x.c, 1], x.data.clone())
            .ok_or_else(|| Error::Unsupported("latent shape".into()))?;
        self.stats.denormalize(&mut z)?;
        let z = Planar::new(x.w, x.h, x.c, z.data)?;
        let scale = self.vae.scale_factor();
        let decoded = decode_with_retry(
            z.w * scale,
            z.h * scale,
            scale,
            tiling,
            |grid| match grid {
                Some(grid) if !grid.is_single() => {
                    let mut bar = Progress::new("decoding", grid.len());
                    tiled_decode(
                        &z,
                        scale,
                        grid,
                        |tile| self.decode_one(tile),
                        |i, _| bar.set(i),
                    )
                }
                _ => self.decode_one(&z),
            },
            |e: &Error| matches!(e, Error::Runner(r) if r.is_alloc_failure()),
        )?;
        let data = decoded
            .data
            .iter()
            .map(|v| v.clamp(-1.0, 1.0) * 0.5 + 0.5)
            .collect();
        Ok(FloatImage {
            width: decoded.w,
            height: decoded.h,
            channels: decoded.c,
            data,
        })
    }

    fn decode_one(&self, z: &Planar) -> Result<Planar> {
        let ne = [z.w, z.h, z.c, 1];
        let mut out = self
            .vae_runner
            .compute(|g| vec![self.vae.decode(g, g.input_f32("vae.z", ne, z.data.clone()))])?;
        let t = out
            .pop()
            .ok_or_else(|| Error::Runner(RunnerError::Internal("VAE decode: no output".into())))?;
        Ok(Planar::new(t.ne[0], t.ne[1], t.ne[2], t.data)?)
    }

    /// Encodes an image ([W, H, C] planar in [−1, 1], C = the VAE's input channels; W, H
    /// multiples of 16) to its latent in transformer space (`(mean − μ) / σ`), [W/16, H/16,
    /// z]. Tiles when asked.
    pub fn encode_image(&self, x: &Planar, tiling: Option<&TileSettings>) -> Result<Planar> {
        if !self.vae.has_encoder() {
            return Err(Error::Unsupported(
                "the VAE was loaded without its encoder".into(),
            ));
        }
        self.vae.check_encode_size(x.w, x.h)?;
        let want = self.vae.config().in_channels;
        if x.c != want {
            return Err(Error::Unsupported(format!(
                "the VAE encodes {want}-channel images, got {}",
                x.c
            )));
        }
        let mean = encode_maybe_tiled(x, self.vae.scale_factor(), tiling, |t| self.encode_one(t))?;
        let mut z = HostTensor::new([mean.w, mean.h, mean.c, 1], mean.data)
            .ok_or_else(|| Error::Unsupported("latent shape".into()))?;
        self.stats.normalize(&mut z)?;
        Ok(Planar::new(mean.w, mean.h, mean.c, z.data)?)
    }

    fn encode_one(&self, x: &Planar) -> Result<Planar> {
        let ne = [x.w, x.h, x.c, 1];
        let mut out = self
            .vae_runner
            .compute(|g| vec![self.vae.encode(g, g.input_f32("vae.x", ne, x.data.clone()))])?;
        let t = out
            .pop()
            .ok_or_else(|| Error::Runner(RunnerError::Internal("VAE encode: no output".into())))?;
        Ok(Planar::new(t.ne[0], t.ne[1], t.ne[2], t.data)?)
    }

    fn velocity(
        &self,
        x: &HostTensor,
        cond: &PromptCondition,
        t: f32,
        name: &str,
    ) -> Result<Vec<f32>> {
        let cache = self.cache.as_ref().map(|c| (c, name));
        let condition = Condition {
            text: &cond.text,
            refs: &cond.refs,
            layout: cond.layout.as_ref(),
        };
        let out = self
            .dit
            .velocity_for(&self.dit_runner, x, &condition, &[t], cache)
            .map_err(cache_err)?;
        Ok(out.data)
    }
}

/// One condition of the transformer: the prompt's encoder rows, and for editing the
/// reference latents (transformer space, [w, h, C, 1]) with the layout that places them.
#[derive(Clone)]
pub struct PromptCondition {
    pub text: HostTensor,
    pub refs: Vec<HostTensor>,
    pub layout: Option<PrefixLayout>,
}

struct Denoiser<'a> {
    pipe: &'a QwenImage21Pipeline,
    schedule: &'a ModelSchedule,
    cond: &'a PromptCondition,
    uncond: Option<&'a PromptCondition>,
    lat: [usize; 4],
    cfg_scale: f32,
    progress: &'a mut Progress,
}

impl crate::sampling::Denoiser for Denoiser<'_> {
    fn denoise(&mut self, x: &[f32], sigma: f32, step: usize) -> Result<Vec<f32>, SamplingError> {
        let pred = Prediction::FluxFlow;
        let t = self.schedule.sigma_to_t(sigma);
        let err = |e: Error| SamplingError::Denoiser {
            sigma,
            message: format!("{e:#}"),
        };
        let xin = HostTensor {
            ne: self.lat,
            data: pred.model_input(x, sigma),
        };
        let v_cond = self
            .pipe
            .velocity(&xin, self.cond, t, "cond")
            .map_err(err)?;
        let v = match self.uncond {
            Some(uncond) => {
                let v_uncond = self.pipe.velocity(&xin, uncond, t, "uncond").map_err(err)?;
                guidance::cfg(&v_cond, &v_uncond, self.cfg_scale)?
            }
            None => v_cond,
        };
        self.progress.set(step);
        pred.to_denoised(&v, x, sigma)
    }
}

/// The text encoder's mRoPE split of `head_dim / 2` frequencies over (t, h, w): from the
/// files (GGUF `rope.dimension_sections`, config.json `mrope_section`) when it fits the head
/// size, else Qwen3-VL's released split [24, 20, 20] scaled to the head size.
fn mrope_section(store: &TensorStore, head_dim: usize) -> [usize; 3] {
    let half = head_dim / 2;
    if let Some(s) = qwen3_mrope_section(store).filter(|s| s[1] + s[2] <= half) {
        return s;
    }
    let [_, h, w] = DEFAULT_MROPE_SECTION;
    let total: usize = DEFAULT_MROPE_SECTION.iter().sum();
    let (h, w) = (half * h / total, half * w / total);
    let s = [half - h - w, h, w];
    log::debug!("qwen3: no mRoPE sections in the files; using {s:?} for head size {head_dim}");
    s
}
