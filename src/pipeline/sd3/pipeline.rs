//! The SD3 pipeline: loading, conditioning, sampling, decoding.

use std::time::Instant;

use super::conditioner::{ClipEncoder, Sd3Conditioner};
use super::{Sd3Condition, CLIP_G, CLIP_L, DIFFUSION, FLOW_SHIFT, T5, VAE_SCALE, VAE_SHIFT};
use crate::error::{Error, Result};
use crate::models::dit::sd3::{unpatchify, Sd3, Sd3Config};
use crate::models::te::clip::{clip_skip_layers, ClipActivation};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{BatchInputs, Generator, ImageJob, LoadContext, Prepared, SizeRule};
use crate::pipeline::passes::{denoise_pass, sample_passes, PassRequest, PassStage};
use crate::pipeline::text::{load_clip, load_t5, load_t5_tokenizer};
use crate::pipeline::vae::{load_decoders, LatentNorm, VaeStage};
use crate::progress::Progress;
use crate::runner::{Loaded, Runner, StoreSource};
use crate::sampling::{GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions};
use crate::tensor::HostTensor;
use crate::tokenizers::clip::ClipTokenizer;

pub struct Sd3Pipeline {
    text: Sd3Conditioner,
    dit: Loaded<Sd3>,
    vae: VaeStage,
    preview_vae: Option<VaeStage>,
    schedule: ModelSchedule,
    prediction: Prediction,
    batch: Option<Prepared>,
}

impl Sd3Pipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let dit_files = files.require(&DIFFUSION)?;
        let present = |id| files.get(id).filter(|s| !s.is_empty());
        let t5_tok = present(T5.id)
            .map(|f| load_t5_tokenizer(f, ctx.t5_tokenizer))
            .transpose()?;
        let mut bar = Progress::new("loading model", 4);

        let head_dim = dit_files
            .config()
            .and_then(|c| c.get("attention_head_dim")?.as_u64());
        let root = dit_files.root(ComponentId::Diffusion);
        let src = StoreSource::new(&dit_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let dit = Runner::load("sd3", &src, opts, |wb| -> Result<Sd3> {
            let mut config = Sd3Config::detect(wb)?;
            if let Some(hd) = head_dim {
                config = config.with_head_dim(hd as usize)?;
            }
            log::debug!("sd3: {config:?}");
            Ok(Sd3::new(wb, config)?)
        })?;
        bar.tick();

        let skip = ctx.clip_skip.map_or(2, |s| s as i32);
        let clip = |id,
                    spec: &crate::pipeline::components::ComponentSpec,
                    act,
                    pad,
                    project|
         -> Result<Option<ClipEncoder>> {
            let Some(f) = present(spec.id) else {
                log::warn!(
                    "no {} ({}): its part of the conditioning is zeros",
                    spec.what,
                    match id {
                        ComponentId::ClipL => "--clip_l",
                        _ => "--clip_g",
                    }
                );
                return Ok(None);
            };
            let (model, _) = load_clip(f, id, ctx, act)?;
            let layers = clip_skip_layers(model.model.config().layers, skip);
            Ok(Some(ClipEncoder {
                model,
                layers,
                pad,
                project,
            }))
        };
        let tokenizer = ClipTokenizer::new()?;
        let eos = tokenizer.eos();
        let clip_l = clip(
            ComponentId::ClipL,
            &CLIP_L,
            ClipActivation::QuickGelu,
            eos,
            false,
        )?;
        let clip_g = clip(ComponentId::ClipG, &CLIP_G, ClipActivation::Gelu, 0, true)?;
        bar.tick();
        let t5 = match (present(T5.id), t5_tok) {
            (Some(f), Some(tok)) => Some((tok, load_t5(f, ctx)?)),
            _ => {
                log::warn!("no T5-XXL text encoder (--t5xxl): its states are zeros");
                None
            }
        };
        bar.tick();
        let (vae, preview_vae) = load_decoders(
            files,
            ctx,
            LatentNorm::Scale {
                scale: VAE_SCALE,
                shift: VAE_SHIFT,
            },
            "SD3 needs its VAE: pass --vae, or --taesd with TAESD3",
        )?;
        bar.tick();

        let c = dit.model.config();
        // Missing CLIPs stand for zeros of the released widths, scaled to the pooled width.
        let widths = match (&clip_l, &clip_g) {
            (Some(l), None) => {
                let w = l.model.model.config().hidden;
                (w, c.pooled_dim.saturating_sub(w))
            }
            (None, Some(g)) => {
                let w = g
                    .model
                    .model
                    .config()
                    .projection_dim
                    .unwrap_or(g.model.model.config().hidden);
                (
                    c.pooled_dim.saturating_sub(w),
                    g.model.model.config().hidden,
                )
            }
            _ => (
                c.pooled_dim * 768 / 2048,
                c.pooled_dim - c.pooled_dim * 768 / 2048,
            ),
        };
        if let Some((_, t5)) = &t5 {
            if t5.model.config().d_model != c.context_dim {
                return Err(Error::Unsupported(format!(
                    "the T5 encoder gives {}-wide states but the MMDiT reads {} (mismatched --t5xxl?)",
                    t5.model.config().d_model,
                    c.context_dim
                )));
            }
        }
        let text = Sd3Conditioner {
            tokenizer,
            clip_l,
            clip_g,
            t5,
            context_dim: c.context_dim,
            pooled_dim: c.pooled_dim,
            widths,
        };
        Ok(Self {
            text,
            schedule: ModelSchedule::Flow {
                shift: ctx.flow_shift.unwrap_or(FLOW_SHIFT),
            },
            prediction: ctx.prediction.unwrap_or(Prediction::Sd3Flow),
            dit,
            vae,
            preview_vae,
            batch: None,
        })
    }

    pub fn condition(&self, prompt: &str) -> Result<Sd3Condition> {
        self.text.encode(prompt)
    }

    pub fn size_multiple(&self) -> usize {
        self.vae.scale_factor() * self.dit.model.config().patch_size
    }

    fn velocity(
        &self,
        x: &[f32],
        lat: (usize, usize, usize),
        cond: &Sd3Condition,
        sigma: f32,
        skip: &[usize],
    ) -> Result<Vec<f32>> {
        let (w, h, ch) = lat;
        let c = self.dit.model.config();
        let model = &self.dit.model;
        let v = self.dit.runner.compute_one(|g| {
            let latent = g.input_f32("sd3.x", [w, h, ch, 1], x.to_vec());
            let context = g.input_f32("sd3.context", cond.context.ne, cond.context.data.clone());
            let pooled = g.input_f32("sd3.pooled", [c.pooled_dim, 1, 1, 1], cond.pooled.clone());
            model.forward(g, latent, context, pooled, &[sigma], skip)
        })?;
        Ok(unpatchify(&v.data, w, h, ch, c.patch_size).data)
    }

    fn sample(&self, req: PassRequest<'_>) -> Result<HostTensor> {
        crate::pipeline::check_size(req.width, req.height, self.size_multiple())?;
        let t0 = Instant::now();
        let cond = self.condition(req.prompt)?;
        let uncond = if req.guidance.needs_uncond() {
            Some(self.condition(req.negative_prompt)?)
        } else {
            None
        };
        let condition_secs = t0.elapsed().as_secs_f64();
        let f = self.vae.scale_factor();
        let lc = self.dit.model.config().out_channels;
        let (lw, lh) = (req.width / f, req.height / f);
        let t1 = Instant::now();
        let model = Sd3Model {
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
            family: "SD3",
        };
        let (latent, steps) = denoise_pass(req, model, &stage, (lw, lh, lc))?;
        log::debug!(
            "sd3: condition {condition_secs:.2}s, sampling {:.2}s ({steps} steps)",
            t1.elapsed().as_secs_f64()
        );
        Ok(latent)
    }

    fn decode(&self, x: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        let t = Instant::now();
        let image = self.vae.decode(x, tiling)?;
        log::debug!("sd3: decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(image)
    }
}

struct Sd3Model<'a> {
    pipe: &'a Sd3Pipeline,
    cond: &'a Sd3Condition,
    uncond: Option<&'a Sd3Condition>,
    lat: (usize, usize, usize),
}

impl GuidedModel for Sd3Model<'_> {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        Predictions::one_call_each(&call, self.cond, self.uncond, |c, skip| {
            self.pipe
                .velocity(call.x, self.lat, c, call.sigma, skip)
                .map_err(|e| format!("{e:#}"))
        })
    }

    fn can_skip_layers(&self) -> bool {
        true
    }
}

impl Generator for Sd3Pipeline {
    fn size_rule(&self) -> SizeRule {
        SizeRule {
            multiple: self.size_multiple() as u32,
            round_up: true,
            refs_set_size: false,
        }
    }

    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()> {
        self.batch = Some(Prepared::encode(&self.vae, batch, "SD3")?);
        Ok(())
    }

    fn generate(&mut self, job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let tiling = job.tiling;
        let x = sample_passes(job, batch, &self.vae, |req| self.sample(req))?;
        self.decode(&x, tiling)
    }
}
