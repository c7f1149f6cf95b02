//! PixArt-α / PixArt-Σ text-to-image: T5 → PixArt DiT (eps prediction on the DDPM linear
//! schedule, CFG) → AutoencoderKL decode.
//!
//! Matches diffusers' `PixArtSigmaPipeline` / `PixArtAlphaPipeline` with an Euler-family
//! scheduler: prompts are `lower().strip()`-ed, T5 runs on the real tokens only (equivalent
//! to the pipeline's padded + masked run, REFERENCE-NOTES §PixArt 2), the latent is
//! `noise · σ_max`, model input `x / sqrt(σ² + 1)` at timestep t(σ), the learned-sigma half of
//! the output is dropped, and the VAE decodes `latent / scaling_factor`.

use std::path::Path;
use std::time::Instant;

use crate::app::{BackendPlan, Module};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::dit::pixart::{
    MicroConditions, PixArt, PixArtConfig, PixArtInputs, PosEmbedParams,
};
use crate::models::te::t5::{self, T5Config, T5Encoder, T5Source};
use crate::models::vae::autoencoder_kl::{AutoencoderKl, AutoencoderKlConfig};
use crate::models::vae::tiling::{Planar, TileSettings};
use crate::progress::Progress;
use crate::rng::Rng;
use crate::runner::{HostTensor, MemoryOptions, RunOptions, Runner, StoreSource, WeightLoader};
use crate::sampling::{
    guidance, DiscreteSigmas, ModelSchedule, Prediction, SamplerKind, SamplingError, SamplingPlan,
    ScheduleKind,
};
use crate::tokenizers::{
    find_t5_tokenizer, from_gguf_vocab, load_t5_tokenizer, pixart_clean, T5Tokenizer,
};
use crate::weights::{Component, TensorStore};

use super::{decode_latents_kl, encode_image_kl, FloatImage};

/// PixArt-Σ's VAE (SDXL) scaling factor; α uses SD's.
pub const SIGMA_VAE_SCALE: f32 = 0.13025;
pub const ALPHA_VAE_SCALE: f32 = 0.18215;
/// T5 sequence lengths of the reference pipelines.
pub const SIGMA_MAX_TOKENS: usize = 300;
pub const ALPHA_MAX_TOKENS: usize = 120;
/// Defaults of upstream sd-cli for this family.
pub const DEFAULT_SAMPLER: SamplerKind = SamplerKind::EulerA;
pub const DEFAULT_SCHEDULE: ScheduleKind = ScheduleKind::Discrete;

/// Where the model files are and how to load them.
pub struct PixArtLoad<'a> {
    pub store: &'a TensorStore,
    /// The T5 file as given (for finding a tokenizer beside it).
    pub t5_path: Option<&'a Path>,
    pub tokenizer_path: Option<&'a Path>,
    pub wtype: Option<DType>,
    pub flash_attn: bool,
    pub backends: &'a BackendPlan,
    /// `--model-args` overrides (None = take from the model's config.json / defaults).
    pub pos_embed_base_size: Option<f32>,
    pub interpolation_scale: Option<f32>,
    pub vae_scale_factor: Option<f32>,
    /// `--max-vram`, `--offload-to-cpu` and friends, for every component.
    pub memory: MemoryOptions,
    /// Load the VAE encoder too (img2img).
    pub need_encoder: bool,
}

pub struct PixArtPipeline {
    tokenizer: T5Tokenizer,
    t5: T5Encoder,
    t5_runner: Runner,
    dit: PixArt,
    dit_runner: Runner,
    pos: PosEmbedParams,
    vae: AutoencoderKl,
    vae_runner: Runner,
    vae_scale: f32,
    max_tokens: usize,
    schedule: ModelSchedule,
}

/// One image request.
pub struct PixArtRequest<'a> {
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub width: usize,
    pub height: usize,
    pub cfg_scale: f32,
    pub plan: &'a SamplingPlan,
    pub noise_rng: &'a mut dyn Rng,
    pub sampler_rng: &'a mut dyn Rng,
    pub vae_tiling: Option<&'a TileSettings>,
    /// img2img: the encoded init image (scaled latent, [w, h, C]) and `--strength`.
    pub init: Option<(&'a Planar, f32)>,
}

fn missing(what: &str, flag: &str) -> Error {
    Error::Unsupported(format!(
        "PixArt needs {what}: none was found in the model files (pass {flag})"
    ))
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

fn load_tokenizer(
    store: &TensorStore,
    t5_path: Option<&Path>,
    explicit: Option<&Path>,
) -> Result<T5Tokenizer> {
    if explicit.is_none() {
        // A tokenizer inside the T5 GGUF file comes next in the search order.
        for f in store
            .files()
            .iter()
            .filter(|f| f.prefix == Component::T5.prefix())
        {
            let md = &f.gguf;
            if let (Some(tokens), Some(scores)) = (
                md.get_arr_str("tokenizer.ggml.tokens"),
                md.get_arr_f32("tokenizer.ggml.scores"),
            ) {
                let types = md
                    .get_arr_i32("tokenizer.ggml.token_type")
                    .unwrap_or_else(|| vec![1; tokens.len()]);
                let tokens = tokens.into_iter().map(str::to_string).collect();
                log::debug!("T5 tokenizer: from GGUF metadata of {}", f.path.display());
                return Ok(from_gguf_vocab(tokens, scores, types, None)?);
            }
        }
    }
    let t5_path = t5_path.ok_or_else(|| missing("a T5 text encoder", "--t5xxl"))?;
    let path = find_t5_tokenizer(explicit, t5_path)?;
    log::debug!("T5 tokenizer: {}", path.display());
    Ok(load_t5_tokenizer(&path)?)
}

impl PixArtPipeline {
    pub fn load(opts: &PixArtLoad<'_>) -> Result<Self> {
        let store = opts.store;
        let run_opts = || RunOptions {
            flash_attn: opts.flash_attn,
            memory: opts.memory.clone(),
            ..RunOptions::default()
        };

        // The tokenizer first: a missing file fails before gigabytes of weights load.
        if store.with_prefix(Component::T5.prefix()).next().is_none() {
            return Err(missing("a T5 text encoder", "--t5xxl"));
        }
        let tokenizer = load_tokenizer(store, opts.t5_path, opts.tokenizer_path)?;

        // Diffusion transformer.
        let dit_src = StoreSource::new(store, Component::Diffusion.prefix());
        let loader = WeightLoader::new(&dit_src, opts.wtype);
        // diffusers folders say the head size; released checkpoints all use 72.
        let head_dim = store
            .files()
            .iter()
            .filter(|f| f.prefix == Component::Diffusion.prefix())
            .find_map(|f| f.config.as_ref()?.get("attention_head_dim")?.as_u64());
        let config = match head_dim {
            Some(hd) => PixArtConfig::detect_with_head_dim(&loader.root(""), hd as usize)?,
            None => PixArtConfig::detect(&loader.root(""))?,
        };
        log::debug!("pixart: {config:?}");
        let micro = config.micro_conditions;
        let dit = PixArt::new(&loader.root(""), config)?;
        let mut bar = Progress::new("loading model", 3);
        let backend = opts.backends.backend(Module::Diffusion)?;
        let dit_weights = loader.finish_for(&backend, "pixart", &opts.memory)?;
        bar.tick();
        let dit_runner = Runner::new("pixart", backend, Some(dit_weights), run_opts());

        // Position-embedding grid: model-args > diffusers config.json > upstream defaults.
        let sample_size = store
            .files()
            .iter()
            .filter(|f| f.prefix == Component::Diffusion.prefix())
            .find_map(|f| f.config.as_ref()?.get("sample_size")?.as_u64());
        let mut pos = match sample_size {
            Some(s) => PosEmbedParams::for_sample_size(s as usize, dit.config().patch_size),
            None => PosEmbedParams::default(),
        };
        if let Some(b) = opts.pos_embed_base_size {
            pos.base_size = b;
        }
        if let Some(s) = opts.interpolation_scale {
            pos.interpolation_scale = s;
        }

        // Text encoder.
        if store.with_prefix(Component::T5.prefix()).next().is_none() {
            return Err(missing("a T5 text encoder", "--t5xxl"));
        }
        let t5_src = T5Source::new(store, Component::T5.prefix());
        let loader = WeightLoader::new(&t5_src, opts.wtype);
        let t5_config = T5Config::detect(&loader.root(""))?;
        let t5 = T5Encoder::new(&loader.root(""), t5_config)?;
        let backend = opts.backends.backend(Module::TextEncoder)?;
        let t5_weights = loader.finish_for(&backend, "t5", &opts.memory)?;
        bar.tick();
        let t5_runner = Runner::new("t5", backend, Some(t5_weights), run_opts());

        // VAE (its convolutions keep the file's float type; `--type` does not apply).
        if store.with_prefix(Component::Vae.prefix()).next().is_none() {
            return Err(missing("a VAE", "--vae"));
        }
        let vae_src = StoreSource::new(store, Component::Vae.prefix());
        let loader = WeightLoader::new(&vae_src, None);
        let mut vae_config = AutoencoderKlConfig::detect(&loader.root(""))?;
        vae_config.encoder = opts.need_encoder && vae_config.encoder;
        if opts.need_encoder && !vae_config.encoder {
            return Err(Error::Unsupported(
                "--init-img needs a VAE with an encoder, but the VAE file has only a decoder"
                    .into(),
            ));
        }
        let vae = AutoencoderKl::new(&loader.root(""), vae_config)?;
        let backend = opts.backends.backend(Module::Vae)?;
        let vae_weights = loader.finish_for(&backend, "vae", &opts.memory)?;
        bar.tick();
        let vae_runner = Runner::new("vae", backend, Some(vae_weights), run_opts());

        // α-1024-MS carries micro-condition embedders and SD's VAE (upstream rule); α-512 needs
        // the explicit override.
        let vae_scale = opts.vae_scale_factor.unwrap_or(if micro {
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
        Ok(Self {
            tokenizer,
            t5,
            t5_runner,
            dit,
            dit_runner,
            pos,
            vae,
            vae_runner,
            vae_scale,
            max_tokens,
            schedule: linear_beta_schedule()?,
        })
    }

    /// VAE downscale × patch size: image sizes must be multiples of this.
    pub fn size_multiple(&self) -> usize {
        self.vae.scale_factor() * self.dit.config().patch_size
    }

    pub fn schedule(&self) -> &ModelSchedule {
        &self.schedule
    }

    /// Token ids of a prompt as the pipeline tokenizes it (cleaned, truncated, `</s>`).
    pub fn tokens(&self, prompt: &str) -> Vec<i32> {
        self.tokenizer
            .encode(&pixart_clean(prompt), self.max_tokens, false)
            .ids
    }

    /// T5 hidden states [d_model, n] of a prompt.
    pub fn encode_prompt(&self, prompt: &str) -> Result<HostTensor> {
        let ids = self.tokens(prompt);
        Ok(t5::encode(&self.t5_runner, &self.t5, &ids, ids.len())?)
    }

    /// One transformer call on a batch; returns the noise prediction [W, H, C, B].
    #[allow(clippy::too_many_arguments)]
    fn predict_eps(
        &self,
        x: &[f32],
        lat: (usize, usize, usize),
        batch: usize,
        t: f32,
        ctx: &HostTensor,
        mask: Option<&[f32]>,
        image: (usize, usize),
    ) -> Result<Vec<f32>> {
        let (w, h, c) = lat;
        let x_ne = [w, h, c, batch];
        let mut xin = Vec::with_capacity(x.len() * batch);
        for _ in 0..batch {
            xin.extend_from_slice(x);
        }
        let out = self.dit_runner.compute(|g| {
            let inputs = PixArtInputs {
                x: g.input_f32("pixart.x", x_ne, xin.clone()),
                timesteps: g.input_f32("pixart.t", [batch, 1, 1, 1], vec![t; batch]),
                context: g.input_f32("pixart.context", ctx.ne, ctx.data.clone()),
                context_mask: mask
                    .map(|m| g.input_f32("pixart.mask", [ctx.ne[1], batch, 1, 1], m.to_vec())),
                micro: self.dit.config().micro_conditions.then(|| {
                    MicroConditions::inputs(g, &vec![(image.1 as f32, image.0 as f32); batch])
                }),
            };
            let out = self.dit.forward(g, &inputs, self.pos);
            vec![self.dit.noise_prediction(g, out)]
        })?;
        Ok(out.into_iter().next().map(|t| t.data).unwrap_or_default())
    }

    /// Generates one image; returns it in [0, 1] as [W, H, 3].
    pub fn txt2img(&self, req: PixArtRequest<'_>) -> Result<FloatImage> {
        let tiling = req.vae_tiling;
        let z = self.sample(req)?;
        let t = Instant::now();
        let image = self.decode(&z, tiling)?;
        log::debug!(
            "pixart: decode {:.2}s; memory: VAE weights {:.1} MiB + {:.1} MiB compute",
            t.elapsed().as_secs_f64(),
            self.vae_runner.weights().map_or(0, |w| w.bytes()) as f64 / 1048576.0,
            self.vae_runner.last_compute_bytes() as f64 / 1048576.0
        );
        Ok(image)
    }

    /// Runs conditioning and sampling; returns the final latent divided by the VAE scaling
    /// factor (what the VAE decodes), [w, h, C].
    pub fn sample(&self, req: PixArtRequest<'_>) -> Result<Planar> {
        super::check_size(req.width, req.height, self.size_multiple())?;
        let t0 = Instant::now();
        let cond = self.encode_prompt(req.prompt)?;
        let use_cfg = req.cfg_scale != 1.0;
        // Cond and uncond go through the transformer as one batch of 2, padded to the same
        // caption length with the padding masked out.
        let (context, mask) = if use_cfg {
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
            (ctx, (n_c != n_u).then_some(mask))
        } else {
            let ne = [cond.ne[0], cond.ne[1], 1, 1];
            (
                HostTensor {
                    ne,
                    data: cond.data,
                },
                None,
            )
        };
        let condition_secs = t0.elapsed().as_secs_f64();

        let lat_c = self.dit.config().in_channels;
        let scale = self.vae.scale_factor();
        let (lw, lh) = (req.width / scale, req.height / scale);
        let n = lw * lh * lat_c;
        let mut sigmas = req.plan.sigmas(&self.schedule)?;
        let noise = req.noise_rng.randn(n);
        let start = match req.init {
            None => vec![0.0; n],
            Some((latent, strength)) => {
                if latent.data.len() != n {
                    return Err(Error::Unsupported(format!(
                        "init image latent is {}x{}x{}, expected {lw}x{lh}x{lat_c}",
                        latent.w, latent.h, latent.c
                    )));
                }
                sigmas = super::img2img_sigmas(&sigmas, strength);
                latent.data.clone()
            }
        };
        let x0 = self.schedule.noise_scaling(sigmas[0], &noise, &start)?;

        let t1 = Instant::now();
        let steps = sigmas.len().saturating_sub(1);
        let mut progress = Progress::new("sampling", steps);
        let batch = if use_cfg { 2 } else { 1 };
        let mut denoiser = PixArtDenoiser {
            pipe: self,
            schedule: &self.schedule,
            context: &context,
            mask: mask.as_deref(),
            batch,
            lat: (lw, lh, lat_c),
            image: (req.width, req.height),
            cfg_scale: req.cfg_scale,
            progress: &mut progress,
        };
        let latent = req
            .plan
            .run(&self.schedule, &mut denoiser, x0, &sigmas, req.sampler_rng)?;
        let mib = |b: usize| b as f64 / 1048576.0;
        log::debug!(
            "pixart: condition {:.2}s, sampling {:.2}s ({steps} steps); memory: T5 weights {:.1} MiB + {:.1} MiB compute, DiT weights {:.1} MiB + {:.1} MiB compute",
            condition_secs,
            t1.elapsed().as_secs_f64(),
            mib(self.t5_runner.weights().map_or(0, |w| w.bytes())),
            mib(self.t5_runner.last_compute_bytes()),
            mib(self.dit_runner.weights().map_or(0, |w| w.bytes())),
            mib(self.dit_runner.last_compute_bytes()),
        );
        let z: Vec<f32> = latent.iter().map(|v| v / self.vae_scale).collect();
        Ok(Planar::new(lw, lh, lat_c, z)?)
    }

    /// Encodes an image in [0, 1] ([W, H, 3]) to the scaled latent sampling starts from
    /// (posterior mean × scaling factor).
    pub fn encode_image(
        &self,
        image: &FloatImage,
        tiling: Option<&TileSettings>,
    ) -> Result<Planar> {
        let x: Vec<f32> = image.data.iter().map(|v| v * 2.0 - 1.0).collect();
        let x = Planar::new(image.width, image.height, image.channels, x)?;
        let mean = encode_image_kl(&self.vae_runner, &self.vae, &x, tiling)?;
        let scaled = mean.data.iter().map(|v| v * self.vae_scale).collect();
        Ok(Planar::new(mean.w, mean.h, mean.c, scaled)?)
    }

    /// Decodes a latent (already divided by the scaling factor) to an image in [0, 1].
    pub fn decode(&self, z: &Planar, tiling: Option<&TileSettings>) -> Result<FloatImage> {
        let decoded = decode_latents_kl(&self.vae_runner, &self.vae, z, tiling)?;
        let data: Vec<f32> = decoded
            .data
            .iter()
            .map(|v| (v * 0.5 + 0.5).clamp(0.0, 1.0))
            .collect();
        Ok(FloatImage {
            width: decoded.w,
            height: decoded.h,
            channels: decoded.c,
            data,
        })
    }
}

struct PixArtDenoiser<'a> {
    pipe: &'a PixArtPipeline,
    schedule: &'a ModelSchedule,
    context: &'a HostTensor,
    mask: Option<&'a [f32]>,
    batch: usize,
    lat: (usize, usize, usize),
    image: (usize, usize),
    cfg_scale: f32,
    progress: &'a mut Progress,
}

impl crate::sampling::Denoiser for PixArtDenoiser<'_> {
    fn denoise(&mut self, x: &[f32], sigma: f32, step: usize) -> Result<Vec<f32>, SamplingError> {
        let pred = Prediction::Eps;
        let xin = pred.model_input(x, sigma);
        let t = self.schedule.sigma_to_t(sigma);
        let out = self
            .pipe
            .predict_eps(
                &xin,
                self.lat,
                self.batch,
                t,
                self.context,
                self.mask,
                self.image,
            )
            .map_err(|e| SamplingError::Denoiser {
                sigma,
                message: format!("{e:#}"),
            })?;
        let n = x.len();
        let eps = if self.batch == 2 {
            guidance::cfg(&out[..n], &out[n..2 * n], self.cfg_scale)?
        } else {
            out[..n].to_vec()
        };
        self.progress.set(step);
        pred.to_denoised(&eps, x, sigma)
    }
}

#[cfg(test)]
mod tests {
    use crate::pipeline::img2img_sigmas;

    #[test]
    fn img2img_keeps_the_schedule_tail() {
        let s = [10.0, 5.0, 2.0, 1.0, 0.0];
        assert_eq!(img2img_sigmas(&s, 1.0), s.to_vec());
        assert_eq!(img2img_sigmas(&s, 0.75), s.to_vec());
        assert_eq!(img2img_sigmas(&s, 0.5), vec![5.0, 2.0, 1.0, 0.0]);
        assert_eq!(img2img_sigmas(&s, 0.3), vec![2.0, 1.0, 0.0]);
        assert_eq!(img2img_sigmas(&s, 0.0), vec![1.0, 0.0]);
    }
}
