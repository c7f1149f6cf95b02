//! The Z-Image pipeline: loading, conditioning, sampling, decoding.

use std::time::Instant;

use super::{DIFFUSION, FLOW_SHIFT, LLM, PROMPT_PREFIX, PROMPT_SUFFIX, VAE_SCALE, VAE_SHIFT};
use crate::error::{Error, Result};
use crate::models::dit::sd3::unpatchify;
use crate::models::dit::z_image::{patchify, ZImage, ZImageConfig, ZImageInputs};
use crate::models::te::qwen3::{self, qwen3_hparams_or, Qwen3Config, Qwen3Source, Qwen3TextModel};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{BatchInputs, Generator, ImageJob, LoadContext, Prepared, SizeRule};
use crate::pipeline::memo::Memo;
use crate::pipeline::passes::{denoise_pass, sample_passes, PassRequest, PassStage};
use crate::pipeline::text::{apply_token_weights, load_qwen_tokenizer_of, weighted_template_ids};
use crate::pipeline::vae::{load_decoders, LatentNorm, VaeStage};
use crate::progress::Progress;
use crate::runner::{Loaded, Runner, StoreSource};
use crate::sampling::{GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions};
use crate::tensor::HostTensor;
use crate::tokenizers::BpeTokenizer;

/// The template and the prompt's emphasis parts tokenized one piece at a time (as upstream's LLM
/// embedder does), with each token's weight: (ids, weights).
pub fn weighted_ids(tokenizer: &BpeTokenizer, prompt: &str) -> Result<(Vec<i32>, Vec<f32>)> {
    weighted_template_ids(tokenizer, PROMPT_PREFIX, prompt, PROMPT_SUFFIX)
}

/// Qwen3-4B's rope base (files without a config or GGUF metadata).
const QWEN3_ROPE_THETA: f32 = 1_000_000.0;

pub struct ZImagePipeline {
    tokenizer: BpeTokenizer,
    te: Loaded<Qwen3TextModel>,
    dit: Loaded<ZImage>,
    vae: VaeStage,
    preview_vae: Option<VaeStage>,
    schedule: ModelSchedule,
    prediction: Prediction,
    /// Caption states of the last prompts (cond and uncond repeat across a batch).
    captions: Memo<HostTensor>,
    batch: Option<Prepared>,
}

impl ZImagePipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let dit_files = files.require(&DIFFUSION)?;
        let llm_files = files.require(&LLM)?;
        let mut bar = Progress::new("loading model", 3);

        let json = dit_files.config();
        let axes = json
            .and_then(|c| c.get("axes_dims")?.as_array().cloned())
            .map(|a| a.iter().filter_map(|v| v.as_u64()).collect::<Vec<_>>());
        let theta = json
            .and_then(|c| c.get("rope_theta")?.as_f64())
            .map(|t| t as f32);
        let root = dit_files.root(ComponentId::Diffusion);
        let src = StoreSource::new(&dit_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let dit = Runner::load("z_image", &src, opts, |wb| -> Result<ZImage> {
            let mut config = ZImageConfig::detect(wb)?;
            if let Some([f, h, w]) = axes.as_deref() {
                config = config.with_axes_dims([*f as usize, *h as usize, *w as usize])?;
            }
            if let Some(t) = theta {
                config = config.with_rope_theta(t);
            }
            log::debug!("z_image: {config:?}");
            Ok(ZImage::new(wb, config)?)
        })?;
        bar.tick();

        let (theta, eps) = qwen3_hparams_or(&llm_files.store, QWEN3_ROPE_THETA);
        let src = Qwen3Source::new(&llm_files.store, ComponentId::Llm.prefix());
        let opts = ctx.load_options(ComponentId::Llm, true)?;
        let cap_dim = dit.model.config().cap_dim;
        let te = Runner::load("qwen3", &src, opts, |wb| -> Result<Qwen3TextModel> {
            let config = Qwen3Config::detect(wb, Some(theta), Some(eps))?;
            if config.hidden != cap_dim {
                return Err(Error::Unsupported(format!(
                    "the text encoder's hidden size {} does not match the transformer's caption \
                     input {cap_dim} (Z-Image reads Qwen3-4B)",
                    config.hidden
                )));
            }
            log::debug!("qwen3: {config:?}");
            Ok(Qwen3TextModel::new(wb, config)?)
        })?;
        let tokenizer = load_qwen_tokenizer_of(llm_files)?;
        bar.tick();
        let (vae, preview_vae) = load_decoders(
            files,
            ctx,
            LatentNorm::Scale {
                scale: VAE_SCALE,
                shift: VAE_SHIFT,
            },
            "Z-Image needs FLUX's VAE (ae.safetensors): pass --vae, or --taesd with TAEF1",
        )?;
        bar.tick();
        Ok(Self {
            tokenizer,
            te,
            dit,
            vae,
            preview_vae,
            schedule: ModelSchedule::Flow {
                shift: ctx.flow_shift.unwrap_or(FLOW_SHIFT),
            },
            prediction: ctx.prediction.unwrap_or(Prediction::Sd3Flow),
            captions: Memo::new(2),
            batch: None,
        })
    }

    pub fn size_multiple(&self) -> usize {
        self.vae.scale_factor() * self.dit.model.config().patch_size
    }

    /// The prompt's caption states [cap_dim, L]: the templated prompt through all but the last
    /// decoder layer (no final norm), every token kept, upstream's emphasis weights applied.
    pub fn encode_prompt(&self, prompt: &str) -> Result<HostTensor> {
        self.captions.get_or_try(prompt, || -> Result<HostTensor> {
            let (ids, weights) = weighted_ids(&self.tokenizer, prompt)?;
            let layers = self.te.model.config().layers.saturating_sub(1).max(1);
            let mut states =
                qwen3::encode_layers(&self.te.runner, &self.te.model, &ids, Some(layers))?;
            apply_token_weights(&mut states.data, states.ne[0], &weights);
            Ok(states)
        })
    }

    fn velocity(
        &self,
        x: &[f32],
        lat: (usize, usize, usize),
        cap: &HostTensor,
        sigma: f32,
    ) -> Result<Vec<f32>> {
        let (w, h, ch) = lat;
        let c = self.dit.model.config();
        let p = c.patch_size;
        let tokens = patchify(
            &HostTensor {
                ne: [w, h, ch, 1],
                data: x.to_vec(),
            },
            p,
        );
        let model = &self.dit.model;
        let v = self.dit.runner.compute_one(|g| {
            let inputs = ZImageInputs {
                img: g.input_f32("zimage.img", tokens.ne, tokens.data.clone()),
                grid: (h / p, w / p),
                cap: g.input_f32("zimage.cap", cap.ne, cap.data.clone()),
                sigmas: &[sigma],
            };
            model.forward(g, &inputs)
        })?;
        Ok(unpatchify(&v.data, w, h, c.out_channels, p).data)
    }

    fn sample(&self, req: PassRequest<'_>) -> Result<HostTensor> {
        crate::pipeline::check_size(req.width, req.height, self.size_multiple())?;
        let t0 = Instant::now();
        let cond = self.encode_prompt(req.prompt)?;
        let uncond = if req.guidance.needs_uncond() {
            Some(self.encode_prompt(req.negative_prompt)?)
        } else {
            None
        };
        let condition_secs = t0.elapsed().as_secs_f64();
        let f = self.vae.scale_factor();
        let lc = self.dit.model.config().out_channels;
        let (lw, lh) = (req.width / f, req.height / f);
        let t1 = Instant::now();
        let model = ZImageModel {
            pipe: self,
            cond: &cond,
            uncond: uncond.as_ref(),
            lat: (lw, lh, lc),
        };
        let stage = PassStage {
            vae: &self.vae,
            preview_vae: self.preview_vae.as_ref(),
            prediction: self.prediction,
            schedule: &self.schedule,
            family: "Z-Image",
        };
        let (latent, steps) = denoise_pass(req, model, &stage, (lw, lh, lc))?;
        log::debug!(
            "z_image: condition {condition_secs:.2}s, sampling {:.2}s ({steps} steps)",
            t1.elapsed().as_secs_f64()
        );
        Ok(latent)
    }

    fn decode(&self, x: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        let t = Instant::now();
        let image = self.vae.decode(x, tiling)?;
        log::debug!("z_image: decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(image)
    }
}

/// The transformer as the guided denoiser's model (cond and uncond as separate calls: their
/// caption lengths differ).
struct ZImageModel<'a> {
    pipe: &'a ZImagePipeline,
    cond: &'a HostTensor,
    uncond: Option<&'a HostTensor>,
    lat: (usize, usize, usize),
}

impl GuidedModel for ZImageModel<'_> {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        Predictions::one_call_each(&call, self.cond, self.uncond, |cap, _| {
            self.pipe
                .velocity(call.x, self.lat, cap, call.sigma)
                .map_err(|e| format!("{e:#}"))
        })
    }
}

impl Generator for ZImagePipeline {
    fn size_rule(&self) -> SizeRule {
        SizeRule {
            multiple: self.size_multiple() as u32,
            round_up: true,
            refs_set_size: false,
        }
    }

    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()> {
        self.batch = Some(Prepared::encode(&self.vae, batch, "Z-Image")?);
        Ok(())
    }

    fn generate(&mut self, job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let tiling = job.tiling;
        let x = sample_passes(job, batch, &self.vae, |req| self.sample(req))?;
        self.decode(&x, tiling)
    }
}
