//! The PixArt pipeline: loading its three components and text-to-image / img2img.
//!
//! Matches diffusers' `PixArtSigmaPipeline` / `PixArtAlphaPipeline` with an Euler-family
//! scheduler: prompts are `lower().strip()`-ed, T5 runs on the real tokens only (equivalent
//! to the pipeline's padded + masked run, REFERENCE-NOTES §PixArt 2), the latent is
//! `noise · σ_max`, model input `x / sqrt(σ² + 1)` at timestep t(σ), the learned-sigma half of
//! the output is dropped, and the VAE decodes `latent / scaling_factor`.

use std::time::Instant;

use super::{
    PixArtFamily, ALPHA_MAX_TOKENS, ALPHA_VAE_SCALE, DIFFUSION, INTERPOLATION_SCALE,
    POS_EMBED_BASE_SIZE, SIGMA_MAX_TOKENS, SIGMA_VAE_SCALE, T5, VAE, VAE_SCALE_FACTOR,
};
use crate::error::{Error, Result};
use crate::models::dit::pixart::{
    MicroConditions, PixArt, PixArtConfig, PixArtInputs, PosEmbedParams,
};
use crate::models::te::t5::{self, T5Encoder};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{
    BatchInputs, Family, Generator, ImageJob, LoadContext, Prepared, SizeRule,
};
use crate::pipeline::hires::second_pass;
use crate::pipeline::preview::PreviewRequest;
use crate::pipeline::prompt::PromptTemplate;
use crate::pipeline::text::{load_t5, load_t5_tokenizer};
use crate::pipeline::vae::load_autoencoder_kl;
use crate::pipeline::vae::{LatentNorm, VaeStage};
use crate::pipeline::{denoise, SampleJob};
use crate::progress::Progress;
use crate::rng::Rng;
use crate::runner::{Loaded, Runner, StoreSource};
use crate::sampling::{
    DiscreteSigmas, Guidance, GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions,
    SamplingPlan,
};
use crate::tensor::HostTensor;
use crate::tokenizers::T5Tokenizer;

pub struct PixArtPipeline {
    tokenizer: T5Tokenizer,
    template: PromptTemplate,
    t5: Loaded<T5Encoder>,
    dit: Loaded<PixArt>,
    pos: PosEmbedParams,
    vae: VaeStage,
    max_tokens: usize,
    schedule: ModelSchedule,
    prediction: Prediction,
    /// The batch's size and init-image latent (set by `prepare`).
    batch: Option<Prepared>,
}

/// One image request.
pub struct PixArtRequest<'a> {
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub width: usize,
    pub height: usize,
    pub guidance: Guidance,
    pub plan: &'a SamplingPlan,
    pub noise_rng: &'a mut dyn Rng,
    pub sampler_rng: &'a mut dyn Rng,
    pub vae_tiling: Option<&'a TileSettings>,
    /// img2img: the encoded init image (scaled latent, [w, h, C]) and `--strength`.
    pub init: Option<(&'a HostTensor, f32)>,
    /// `--preview` (no `proj` matrix is known for PixArt, as upstream).
    pub preview: Option<PreviewRequest<'a>>,
    /// `--mask`: the latent mask each step's denoised estimate is blended with.
    pub mask: Option<&'a HostTensor>,
}

/// DDPM linear betas 1e-4 → 0.02 over 1000 steps (PixArt's training schedule).
pub fn linear_beta_schedule() -> Result<ModelSchedule> {
    let mut acc = 1.0f32;
    let alphas: Vec<f32> = (0..1000)
        .map(|i| {
            let beta = 0.0001 + (0.02 - 0.0001) * i as f32 / 999.0;
            acc *= 1.0 - beta;
            acc
        })
        .collect();
    Ok(ModelSchedule::Discrete(
        DiscreteSigmas::from_alphas_cumprod(&alphas)?,
    ))
}

impl PixArtPipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let dit_files = files.require(&DIFFUSION)?;
        let t5_files = files.require(&T5)?;
        let vae_files = files.require(&VAE)?;
        let args = ctx.model_args;

        // The tokenizer first: a missing file fails before gigabytes of weights load.
        let tokenizer = load_t5_tokenizer(t5_files, ctx.t5_tokenizer)?;
        let mut bar = Progress::new("loading model", 3);

        // Diffusion transformer; diffusers folders say the head size (released checkpoints
        // all use 72).
        let config_json = dit_files.config();
        let head_dim = config_json.and_then(|c| c.get("attention_head_dim")?.as_u64());
        let root = dit_files.root(ComponentId::Diffusion);
        let src = StoreSource::new(&dit_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let dit = Runner::load("pixart", &src, opts, |wb| -> Result<PixArt> {
            let config = match head_dim {
                Some(hd) => PixArtConfig::detect_with_head_dim(wb, hd as usize)?,
                None => PixArtConfig::detect(wb)?,
            };
            log::debug!("pixart: {config:?}");
            Ok(PixArt::new(wb, config)?)
        })?;
        bar.tick();

        // Position-embedding grid: model-args > diffusers config.json > upstream defaults.
        let sample_size = config_json.and_then(|c| c.get("sample_size")?.as_u64());
        let mut pos = match sample_size {
            Some(s) => PosEmbedParams::for_sample_size(s as usize, dit.model.config().patch_size),
            None => PosEmbedParams::default(),
        };
        if let Some(b) = args.given(&POS_EMBED_BASE_SIZE) {
            pos.base_size = b as f32;
        }
        if let Some(s) = args.given(&INTERPOLATION_SCALE) {
            pos.interpolation_scale = s;
        }

        // Text encoder.
        let t5 = load_t5(t5_files, ctx)?;
        bar.tick();

        // VAE (its convolutions keep the file's float type; `--type` does not apply).
        let vae = load_autoencoder_kl(vae_files, ctx)?;
        bar.tick();

        // α-1024-MS carries micro-condition embedders and SD's VAE (upstream rule); α-512 needs
        // the explicit override.
        let micro = dit.model.config().micro_conditions;
        let vae_scale = args.given(&VAE_SCALE_FACTOR).unwrap_or(if micro {
            ALPHA_VAE_SCALE
        } else {
            SIGMA_VAE_SCALE
        });
        let max_tokens = if micro {
            ALPHA_MAX_TOKENS
        } else {
            SIGMA_MAX_TOKENS
        };
        log::debug!(
            "pixart: pos-embed base {} scale {}, VAE scale {vae_scale}, {max_tokens} T5 tokens",
            pos.base_size,
            pos.interpolation_scale
        );
        let vae = VaeStage::new(
            vae,
            LatentNorm::Scale {
                scale: vae_scale,
                shift: 0.0,
            },
        );
        Ok(Self {
            tokenizer,
            template: PixArtFamily.prompt_template(),
            t5,
            dit,
            pos,
            vae,
            max_tokens,
            schedule: linear_beta_schedule()?,
            prediction: ctx.prediction.unwrap_or(PixArtFamily.defaults().prediction),
            batch: None,
        })
    }

    /// VAE downscale × patch size: image sizes must be multiples of this.
    pub fn size_multiple(&self) -> usize {
        self.vae.scale_factor() * self.dit.model.config().patch_size
    }

    pub fn schedule(&self) -> &ModelSchedule {
        &self.schedule
    }

    /// Token ids of a prompt as the pipeline tokenizes it (cleaned, truncated, `</s>`).
    pub fn tokens(&self, prompt: &str) -> Vec<i32> {
        self.tokenizer
            .encode(&self.template.apply(prompt), self.max_tokens, false)
            .ids
    }

    /// T5 hidden states [d_model, n] of a prompt.
    pub fn encode_prompt(&self, prompt: &str) -> Result<HostTensor> {
        let ids = self.tokens(prompt);
        Ok(t5::encode(
            &self.t5.runner,
            &self.t5.model,
            &ids,
            ids.len(),
        )?)
    }

    /// One transformer call on a batch (the same latent for each); returns the noise
    /// prediction [W, H, C, B].
    fn predict_eps(
        &self,
        x: &[f32],
        lat: (usize, usize, usize),
        t: f32,
        ctx: &HostTensor,
        mask: Option<&[f32]>,
        image: (usize, usize),
    ) -> Result<Vec<f32>> {
        let batch = ctx.ne[2];
        let (w, h, c) = lat;
        let x_ne = [w, h, c, batch];
        let mut xin = Vec::with_capacity(x.len() * batch);
        for _ in 0..batch {
            xin.extend_from_slice(x);
        }
        let dit = &self.dit.model;
        let out = self.dit.runner.compute(|g| {
            let inputs = PixArtInputs {
                x: g.input_f32("pixart.x", x_ne, xin.clone()),
                timesteps: g.input_f32("pixart.t", [batch, 1, 1, 1], vec![t; batch]),
                context: g.input_f32("pixart.context", ctx.ne, ctx.data.clone()),
                context_mask: mask
                    .map(|m| g.input_f32("pixart.mask", [ctx.ne[1], batch, 1, 1], m.to_vec())),
                micro: dit.config().micro_conditions.then(|| {
                    MicroConditions::inputs(g, &vec![(image.1 as f32, image.0 as f32); batch])
                }),
            };
            let out = dit.forward_cached(g, &inputs, self.pos, Some(CROSS_CACHE));
            vec![dit.noise_prediction(g, out)]
        })?;
        Ok(out.into_iter().next().map(|t| t.data).unwrap_or_default())
    }

    /// Generates one image; returns it in [0, 1] as [W, H, 3].
    pub fn txt2img(&self, req: PixArtRequest<'_>) -> Result<HostTensor> {
        let tiling = req.vae_tiling;
        let z = self.sample(req)?;
        self.decode_logged(&z, tiling)
    }

    /// [`Self::decode`] with its time and memory in the log.
    fn decode_logged(&self, z: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        let t = Instant::now();
        let image = self.decode(z, tiling)?;
        let vae = self.vae.runner();
        log::debug!(
            "pixart: decode {:.2}s; memory: VAE weights {:.1} MiB + {:.1} MiB compute",
            t.elapsed().as_secs_f64(),
            vae.weights().map_or(0, |w| w.bytes()) as f64 / 1048576.0,
            vae.last_compute_bytes() as f64 / 1048576.0
        );
        Ok(image)
    }

    /// The prompts' T5 rows as the transformer's context: with CFG, cond and uncond as one
    /// batch of 2 padded to the same caption length, with the padding masked out.
    fn context(&self, req: &PixArtRequest<'_>) -> Result<(HostTensor, Option<Vec<f32>>)> {
        let cond = self.encode_prompt(req.prompt)?;
        if !req.guidance.needs_uncond() {
            let ne = [cond.ne[0], cond.ne[1], 1, 1];
            return Ok((
                HostTensor {
                    ne,
                    data: cond.data,
                },
                None,
            ));
        }
        let uncond = self.encode_prompt(req.negative_prompt)?;
        let (d, n_c, n_u) = (cond.ne[0], cond.ne[1], uncond.ne[1]);
        let n = n_c.max(n_u);
        let mut data = vec![0.0f32; d * n * 2];
        data[..d * n_c].copy_from_slice(&cond.data);
        data[d * n..d * n + d * n_u].copy_from_slice(&uncond.data);
        let mut mask = vec![0.0f32; n * 2];
        mask[..n_c].iter_mut().for_each(|v| *v = 1.0);
        mask[n..n + n_u].iter_mut().for_each(|v| *v = 1.0);
        let ctx = HostTensor::new([d, n, 2, 1], data)
            .ok_or_else(|| Error::Unsupported("context shape".into()))?;
        Ok((ctx, (n_c != n_u).then_some(mask)))
    }

    /// Runs conditioning and sampling; returns the final latent divided by the VAE scaling
    /// factor (what the VAE decodes), [w, h, C].
    pub fn sample(&self, req: PixArtRequest<'_>) -> Result<HostTensor> {
        crate::pipeline::check_size(req.width, req.height, self.size_multiple())?;
        let t0 = Instant::now();
        let (context, mask) = self.context(&req)?;
        let condition_secs = t0.elapsed().as_secs_f64();

        let lat_c = self.dit.model.config().in_channels;
        let scale = self.vae.scale_factor();
        let (lw, lh) = (req.width / scale, req.height / scale);
        let t1 = Instant::now();
        let model = PixArtModel {
            pipe: self,
            context: &context,
            mask: mask.as_deref(),
            lat: (lw, lh, lat_c),
            image: (req.width, req.height),
        };
        let job = SampleJob {
            plan: req.plan,
            guidance: req.guidance,
            noise_rng: req.noise_rng,
            sampler_rng: req.sampler_rng,
            init: req.init,
            preview: req.preview.map(|p| p.with(None, &self.vae)),
            mask: req.mask,
        };
        if let Some(p) = &job.preview {
            p.check("PixArt");
        }
        // The caption's cross-attention keys and values, computed by the first step and
        // read by the others; this sample's own (freed before the VAE runs).
        self.dit.runner.clear_cache(CROSS_CACHE);
        let denoised = denoise(model, self.prediction, &self.schedule, job, (lw, lh, lat_c));
        self.dit.runner.clear_cache(CROSS_CACHE);
        let (latent, steps) = denoised?;
        let mib = |b: usize| b as f64 / 1048576.0;
        let (t5, dit) = (&self.t5.runner, &self.dit.runner);
        log::debug!(
            "pixart: condition {:.2}s, sampling {:.2}s ({steps} steps); memory: T5 weights {:.1} MiB + {:.1} MiB compute, DiT weights {:.1} MiB + {:.1} MiB compute",
            condition_secs,
            t1.elapsed().as_secs_f64(),
            mib(t5.weights().map_or(0, |w| w.bytes())),
            mib(t5.last_compute_bytes()),
            mib(dit.weights().map_or(0, |w| w.bytes())),
            mib(dit.last_compute_bytes()),
        );
        self.vae
            .norm
            .to_vae(&HostTensor::image(lw, lh, lat_c, latent)?)
    }

    /// Decodes a latent (already divided by the scaling factor) to an image in [0, 1].
    pub fn decode(&self, z: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        self.vae.decode_vae_latent(z, tiling)
    }
}

/// The DiT runner's cache entries of the caption's cross-attention keys and values.
const CROSS_CACHE: &str = "pixart.cross";

/// The transformer as the guided denoiser's model: cond and uncond in one batch.
struct PixArtModel<'a> {
    pipe: &'a PixArtPipeline,
    context: &'a HostTensor,
    mask: Option<&'a [f32]>,
    lat: (usize, usize, usize),
    image: (usize, usize),
}

impl GuidedModel for PixArtModel<'_> {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        let batch = self.context.ne[2];
        if call.needs.uncond != (batch == 2) {
            return Err("the caption batch does not match the guidance".into());
        }
        let out = self
            .pipe
            .predict_eps(
                call.x,
                self.lat,
                call.t,
                self.context,
                self.mask,
                self.image,
            )
            .map_err(|e| format!("{e:#}"))?;
        let n = call.x.len();
        if out.len() != n * batch {
            return Err(format!(
                "the transformer returned {} values for {batch} x {n}",
                out.len()
            ));
        }
        Ok(Predictions {
            cond: out[..n].to_vec(),
            uncond: (batch == 2).then(|| out[n..].to_vec()),
            img_uncond: None,
            skip_cond: None,
        })
    }
}

impl Generator for PixArtPipeline {
    fn size_rule(&self) -> SizeRule {
        SizeRule {
            multiple: self.size_multiple() as u32,
            round_up: true,
            refs_set_size: false,
        }
    }

    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()> {
        self.batch = Some(Prepared::encode(&self.vae, batch, "PixArt")?);
        Ok(())
    }

    fn generate(&mut self, mut job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let hires = job.hires.take();
        let z = self.sample(PixArtRequest {
            prompt: job.prompt,
            negative_prompt: job.negative_prompt,
            width: batch.width,
            height: batch.height,
            guidance: job.guidance,
            plan: job.plan,
            noise_rng: job.noise_rng,
            sampler_rng: job.sampler_rng,
            vae_tiling: job.tiling,
            init: batch.init.as_ref().map(|z| (z, job.strength)),
            preview: ImageJob::preview_request(job.preview.as_deref_mut(), job.tiling),
            mask: batch.denoise_mask(),
        })?;
        let z = match hires {
            Some(h) => {
                let x = self.vae.norm.from_vae(&z)?;
                second_pass(&self.vae, &x, h, job.tiling, batch.mask.as_ref(), |p| {
                    self.sample(PixArtRequest {
                        prompt: job.prompt,
                        negative_prompt: job.negative_prompt,
                        width: p.width,
                        height: p.height,
                        guidance: job.guidance,
                        plan: p.plan,
                        noise_rng: p.noise_rng,
                        sampler_rng: p.sampler_rng,
                        vae_tiling: job.tiling,
                        init: Some((p.init, p.strength)),
                        preview: ImageJob::preview_request(job.preview.as_deref_mut(), job.tiling),
                        mask: p.mask,
                    })
                })?
            }
            None => z,
        };
        self.decode_logged(&z, job.tiling)
    }
}
