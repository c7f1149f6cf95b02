//! The Qwen Image 2.1 pipeline: loading its components, sampling and the VAE.
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

use std::time::Instant;

use super::edit::{self, EditInputs};
use super::refs::prepare_reference;
use super::{
    prefix_cache_type, template, QwenImage21Family, DIFFUSION, LLM, PREFIX_CACHE,
    PREFIX_CACHE_TYPE, SIZE_MULTIPLE, VAE, VAE_SCALE, VISION,
};
use crate::error::{Error, Result};
use crate::models::dit::qwen_image_2_1::{
    Condition, PrefixCache, PrefixCacheError, PrefixLayout, QwenImage21, QwenImage21Config,
};
use crate::models::te::qwen3::{
    qwen3_hparams, qwen3_mrope_section, Qwen3Config, Qwen3Source, Qwen3TextModel,
    DEFAULT_MROPE_SECTION,
};
use crate::models::vae::qwen_image_2_1_vae::{LatentStats, QwenImage21Vae, QwenImage21VaeConfig};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{
    BatchInputs, Family, Generator, ImageJob, LoadContext, Prepared, SizeRule,
};
use crate::pipeline::hires::second_pass;
use crate::pipeline::mask::InpaintMask;
use crate::pipeline::memo::Memo;
use crate::pipeline::preview::PreviewRequest;
use crate::pipeline::text::load_qwen_tokenizer_of;
use crate::pipeline::vae::{LatentNorm, VaeStage};
use crate::pipeline::{denoise, SampleJob};
use crate::progress::Progress;
use crate::rng::Rng;
use crate::runner::{Loaded, Runner, StoreSource};
use crate::sampling::schedules::FluxScheduleParams;
use crate::sampling::{
    Guidance, GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions, SamplingPlan,
};
use crate::tensor::HostTensor;
use crate::tokenizers::BpeTokenizer;

/// Cache-entry base of the prefix K/V cache in the transformer runner.
const CACHE_BASE: &str = "qwen_image_2_1.prefix";

/// One image request.
pub struct QwenImage21Request<'a> {
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub width: usize,
    pub height: usize,
    /// True CFG; scale 1 runs the conditional call only.
    pub guidance: Guidance,
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
    pub init: Option<(&'a HostTensor, f32)>,
    /// Editing: the prepared reference images ([`QwenImage21Pipeline::prepare_edit`]).
    pub edit: Option<&'a EditInputs>,
    /// `--preview` (no `proj` matrix is known for this VAE, as upstream).
    pub preview: Option<PreviewRequest<'a>>,
    /// `--mask`: the latent mask each step's denoised estimate is blended with.
    pub mask: Option<&'a HostTensor>,
}

pub struct QwenImage21Pipeline {
    pub(super) tokenizer: BpeTokenizer,
    pub(super) te: Loaded<Qwen3TextModel>,
    dit: Loaded<QwenImage21>,
    pub(super) vae: VaeStage,
    cache: Option<PrefixCache>,
    /// Prompt → embedding of the last request (reused across --batch-count images).
    embeds: Memo<HostTensor>,
    pub(super) vision: Option<edit::Vision>,
    /// (references, prompt) → edit embedding and image-slot mask, as `embeds`.
    pub(super) edit_embeds: Memo<edit::EditEmbedding>,
    prediction: Prediction,
    /// The batch's size, init latent and references (set by `prepare`).
    batch: Option<Prepared<Option<EditInputs>>>,
}

fn cache_err(e: PrefixCacheError) -> Error {
    match e {
        PrefixCacheError::Runner(r) => Error::Runner(r),
        other => Error::Unsupported(other.to_string()),
    }
}

impl QwenImage21Pipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let dit_files = files.require(&DIFFUSION)?;
        let llm_files = files.require(&LLM)?;
        let vae_files = files.require(&VAE)?;
        let mut bar = Progress::new("loading model", 3);

        // Diffusion transformer.
        let axes = dit_files
            .config()
            .and_then(|c| c.get("axes_dims_rope")?.as_array().cloned());
        let root = dit_files.root(ComponentId::Diffusion);
        let src = StoreSource::new(&dit_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let dit = Runner::load("qwen_image_2_1", &src, opts, |wb| -> Result<QwenImage21> {
            let mut config = QwenImage21Config::detect(wb)?;
            if let Some(axes) = &axes {
                let axes: Vec<usize> = axes
                    .iter()
                    .filter_map(|v| v.as_u64().map(|v| v as usize))
                    .collect();
                if let [f, h, w] = axes[..] {
                    config = config.with_axes_dims([f, h, w])?;
                }
            }
            log::debug!("qwen_image_2_1: {config:?}");
            Ok(QwenImage21::new(wb, config)?)
        })?;
        bar.tick();
        let args = ctx.model_args;
        let cache = if args.get(&PREFIX_CACHE) {
            let ty = prefix_cache_type(args.get(&PREFIX_CACHE_TYPE), ctx.flash_attn);
            Some(PrefixCache::new(CACHE_BASE, ty, dit.model.config()).map_err(cache_err)?)
        } else {
            None
        };

        // Text encoder (hyper-parameters from its own files).
        let (theta, eps) = qwen3_hparams(&llm_files.store);
        let mrope = qwen3_mrope_section(&llm_files.store);
        let src = Qwen3Source::new(&llm_files.store, ComponentId::Llm.prefix());
        let opts = ctx.load_options(ComponentId::Llm, true)?;
        let text_dim = dit.model.config().text_dim;
        let te = Runner::load("qwen3", &src, opts, |wb| -> Result<Qwen3TextModel> {
            let config = Qwen3Config::detect(wb, Some(theta), Some(eps))?;
            if config.hidden != text_dim {
                return Err(Error::Unsupported(format!(
                    "the text encoder's hidden size {} does not match the transformer's text \
                     input {text_dim}",
                    config.hidden
                )));
            }
            // The files' sections as they are (transformers applies them unchanged at any head
            // size, the excess simply unused), else the released [24, 20, 20] that upstream
            // always uses and transformers defaults to.
            let section = mrope.unwrap_or(DEFAULT_MROPE_SECTION);
            Ok(Qwen3TextModel::new(wb, config)?.with_mrope_section(section))
        })?;
        bar.tick();
        let tokenizer = load_qwen_tokenizer_of(llm_files)?;
        let vision = if ctx.needs.references {
            let vision_files = files.require(&VISION)?;
            let opts = ctx.load_options(ComponentId::LlmVision, false)?;
            let v = edit::Vision::load(vision_files, llm_files, opts, "Qwen Image 2.1 editing")?;
            if v.out_hidden() != te.model.config().hidden {
                return Err(Error::Unsupported(format!(
                    "the vision tower's output size {} does not match the LLM's hidden size {}",
                    v.out_hidden(),
                    te.model.config().hidden
                )));
            }
            Some(v)
        } else {
            None
        };

        // VAE (its convolutions keep the file's float type).
        let stats_json = vae_files
            .config()
            .and_then(LatentStats::from_diffusers_config);
        let src = StoreSource::new(&vae_files.store, ComponentId::Vae.prefix());
        let opts = ctx.load_options(ComponentId::Vae, false)?;
        let need_encoder = ctx.needs.encoder;
        let in_channels = dit.model.config().in_channels;
        let mut stats = None;
        let vae = Runner::load("vae", &src, opts, |wb| -> Result<QwenImage21Vae> {
            let mut config = QwenImage21VaeConfig::detect(wb)?;
            if !config.decoder {
                return Err(Error::Unsupported(
                    "the VAE file has no decoder weights".into(),
                ));
            }
            if need_encoder && !config.encoder {
                return Err(Error::Unsupported(
                    "--init-img and -r need a VAE with an encoder, but the VAE file has only a \
                     decoder"
                        .into(),
                ));
            }
            config.encoder = need_encoder;
            let s = match stats_json {
                Some(s) => s?,
                None => config.latent_stats.clone().ok_or_else(|| {
                    Error::Unsupported(format!(
                        "the VAE has a {}-channel latent but no latents_mean/latents_std \
                         (only the released 64-channel statistics are built in)",
                        config.z_dim
                    ))
                })?,
            };
            if s.channels() != config.z_dim || config.z_dim != in_channels {
                return Err(Error::Unsupported(format!(
                    "latent channels disagree: VAE {}, statistics {}, transformer {in_channels}",
                    config.z_dim,
                    s.channels(),
                )));
            }
            stats = Some(s);
            Ok(QwenImage21Vae::new(wb, config)?)
        })?;
        bar.tick();
        let stats = stats.ok_or_else(|| Error::Unsupported("VAE latent statistics".into()))?;
        Ok(Self {
            tokenizer,
            te,
            dit,
            vae: VaeStage::new(vae, LatentNorm::Stats(stats)),
            cache,
            embeds: Memo::new(2),
            vision,
            edit_embeds: Memo::new(2),
            prediction: QwenImage21Family.defaults().prediction,
            batch: None,
        })
    }

    /// Image sizes must be multiples of this.
    pub fn size_multiple(&self) -> usize {
        SIZE_MULTIPLE
    }

    pub fn transformer_config(&self) -> &QwenImage21Config {
        self.dit.model.config()
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
            template::encode_prompt(&self.te.runner, &self.te.model, &self.tokenizer, prompt)
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
    pub fn txt2img(&self, req: QwenImage21Request<'_>) -> Result<HostTensor> {
        let tiling = req.vae_tiling;
        let x = self.sample(req)?;
        self.decode_logged(&x, tiling)
    }

    /// [`Self::decode`] with its time in the log.
    fn decode_logged(&self, x: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        let t = Instant::now();
        let image = self.decode(x, tiling)?;
        log::debug!("qwen_image_2_1: decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(image)
    }

    /// Frees the cached text prefixes (they are freed after each image unless kept).
    pub fn release_prefix_cache(&self) {
        if let Some(c) = &self.cache {
            c.clear(&self.dit.runner);
        }
    }

    /// Bytes the transformer runner's cache holds now.
    pub fn prefix_cache_bytes(&self) -> usize {
        self.dit.runner.cache_bytes()
    }

    /// Runs conditioning and sampling; returns the final latent in transformer space
    /// (`(z − mean) / std`), [w, h, C].
    pub fn sample(&self, req: QwenImage21Request<'_>) -> Result<HostTensor> {
        crate::pipeline::check_size(req.width, req.height, SIZE_MULTIPLE)?;
        let t0 = Instant::now();
        let cond = self.condition(req.prompt, req.edit)?;
        let uncond = if req.guidance.needs_uncond() {
            Some(self.condition(req.negative_prompt, req.edit)?)
        } else {
            None
        };
        let condition_secs = t0.elapsed().as_secs_f64();

        let c = self.dit.model.config().in_channels;
        let (lw, lh) = (req.width / VAE_SCALE, req.height / VAE_SCALE);
        let tokens = lw * lh;
        let schedule = Self::model_schedule(tokens);
        let mut plan = req.plan.clone();
        plan.schedule_opts.image_seq_len = tokens as u32;
        if plan.schedule_opts.flux == FluxScheduleParams::FLUX {
            plan.schedule_opts.flux = FluxScheduleParams::QWEN_IMAGE_2_1;
        }
        let t1 = Instant::now();
        let model = QwenModel {
            pipe: self,
            cond: &cond,
            uncond: uncond.as_ref(),
            lat: [lw, lh, c, 1],
        };
        let job = SampleJob {
            plan: &plan,
            guidance: req.guidance,
            noise_rng: req.noise_rng,
            sampler_rng: req.sampler_rng,
            init: req.init,
            preview: req.preview.map(|p| p.with(None, &self.vae)),
            mask: req.mask,
        };
        if let Some(p) = &job.preview {
            p.check("Qwen Image 2.1");
        }
        let result = denoise(model, self.prediction, &schedule, job, (lw, lh, c));
        if !req.keep_prefix_cache || result.is_err() {
            self.release_prefix_cache();
        }
        let (latent, steps) = result?;
        log::debug!(
            "qwen_image_2_1: condition {condition_secs:.2}s, sampling {:.2}s ({steps} steps)",
            t1.elapsed().as_secs_f64()
        );
        Ok(HostTensor::image(lw, lh, c, latent)?)
    }

    /// Decodes a transformer-space latent [w, h, C] to an RGBA image in [0, 1]: `x·std + mean`
    /// through the VAE, clamped to [−1, 1], `/2 + 0.5`. Tiles when asked, and retries with
    /// smaller tiles when the decode does not fit in memory.
    pub fn decode(&self, x: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        self.vae.decode(x, tiling)
    }

    /// Encodes an image ([W, H, C] planar in [−1, 1], C = the VAE's input channels; W, H
    /// multiples of 16) to its latent in transformer space (`(mean − μ) / σ`), [W/16, H/16,
    /// z]. Tiles when asked.
    pub fn encode_image(
        &self,
        x: &HostTensor,
        tiling: Option<&TileSettings>,
    ) -> Result<HostTensor> {
        self.vae.encode(x, tiling)
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
            .model
            .velocity_for(&self.dit.runner, x, &condition, &[t], cache)
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

/// The transformer as the guided denoiser's model: cond and uncond as separate calls (each
/// with its own text length and prefix cache).
struct QwenModel<'a> {
    pipe: &'a QwenImage21Pipeline,
    cond: &'a PromptCondition,
    uncond: Option<&'a PromptCondition>,
    lat: [usize; 4],
}

impl GuidedModel for QwenModel<'_> {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        let err = |e: Error| format!("{e:#}");
        let x = HostTensor {
            ne: self.lat,
            data: call.x.to_vec(),
        };
        let cond = self
            .pipe
            .velocity(&x, self.cond, call.t, "cond")
            .map_err(err)?;
        let uncond = match (call.needs.uncond, self.uncond) {
            (true, Some(u)) => Some(self.pipe.velocity(&x, u, call.t, "uncond").map_err(err)?),
            (true, None) => return Err("no negative condition for CFG".into()),
            (false, _) => None,
        };
        Ok(Predictions {
            cond,
            uncond,
            img_uncond: None,
            skip_cond: None,
        })
    }
}

impl Generator for QwenImage21Pipeline {
    fn size_rule(&self) -> SizeRule {
        SizeRule {
            multiple: SIZE_MULTIPLE as u32,
            round_up: false,
            refs_set_size: true,
        }
    }

    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()> {
        let (w, h) = (batch.width, batch.height);
        let init = match batch.init {
            Some(img) => {
                let t = Instant::now();
                let prepared = prepare_reference(img, w, h)?;
                let x = HostTensor::image(w, h, 4, prepared.vae_input)?;
                let z = self.encode_image(&x, batch.tiling)?;
                log::debug!("init image encoded in {:.2}s", t.elapsed().as_secs_f64());
                Some(z)
            }
            None => None,
        };
        let edit = if batch.refs.is_empty() {
            None
        } else {
            let args = batch.ref_args;
            let t = Instant::now();
            let e = self.prepare_edit(
                batch.refs,
                args.target_area(w as u64 * h as u64) as usize,
                args.resize_before_vae,
                batch.tiling,
            )?;
            log::debug!(
                "{} reference image(s) encoded in {:.2}s",
                batch.refs.len(),
                t.elapsed().as_secs_f64()
            );
            Some(e)
        };
        self.batch = Some(Prepared {
            width: w,
            height: h,
            init,
            mask: batch
                .mask
                .map(|m| InpaintMask::from_image(m, w, h, VAE_SCALE)),
            extra: edit,
        });
        Ok(())
    }

    fn generate(&mut self, mut job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let hires = job.hires.take();
        // Later images of the batch share the prompts: keep their text K/V (not across a
        // hires fix's change of size).
        let keep = job.more_follow && hires.is_none();
        let x = self.sample(QwenImage21Request {
            prompt: job.prompt,
            negative_prompt: job.negative_prompt,
            width: batch.width,
            height: batch.height,
            guidance: job.guidance,
            plan: job.plan,
            noise_rng: job.noise_rng,
            sampler_rng: job.sampler_rng,
            vae_tiling: job.tiling,
            keep_prefix_cache: keep,
            init: batch.init.as_ref().map(|z| (z, job.strength)),
            edit: batch.extra.as_ref(),
            preview: ImageJob::preview_request(job.preview.as_deref_mut(), job.tiling),
            mask: batch.denoise_mask(),
        })?;
        let x = match hires {
            Some(h) => second_pass(&self.vae, &x, h, job.tiling, batch.mask.as_ref(), |p| {
                self.sample(QwenImage21Request {
                    prompt: job.prompt,
                    negative_prompt: job.negative_prompt,
                    width: p.width,
                    height: p.height,
                    guidance: job.guidance,
                    plan: p.plan,
                    noise_rng: p.noise_rng,
                    sampler_rng: p.sampler_rng,
                    vae_tiling: job.tiling,
                    keep_prefix_cache: false,
                    init: Some((p.init, p.strength)),
                    edit: batch.extra.as_ref(),
                    preview: ImageJob::preview_request(job.preview.as_deref_mut(), job.tiling),
                    mask: p.mask,
                })
            })?,
            None => x,
        };
        self.decode_logged(&x, job.tiling)
    }

    fn finish(&mut self) {
        self.release_prefix_cache();
    }
}
