//! The Wan pipeline: loading, conditioning, sampling over the video latent, decoding.

use std::time::Instant;

use super::condition::{clip_tokens, concat_condition, ClipTower, ImageCondition, MASK_CHANNELS};
use super::moe::denoise_two_experts;
use super::vace::{vace_condition, VaceCondition};
use super::vae::load_vae;
use super::{DIFFUSION, FLOW_SHIFT, T5, TEXT_LEN, VAE};
use crate::error::{Error, Result};
use crate::image_io::cpp_float;
use crate::models::dit::wan::{VaceContext, Wan, WanConfig, WanHints, WanInputs};
use crate::models::te::clip::{clip_skip_layers, ClipActivation};
use crate::models::te::clip_vision::{
    ClipVisionConfig, ClipVisionHparams, ClipVisionModel, ClipVisionSource,
};
use crate::models::te::t5::{self, T5Encoder};
use crate::models::vae::tiling::TileSettings;
use crate::models::vae::wan_vae::LatentStats;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{
    BatchInputs, Generator, HighNoiseJob, ImageJob, LoadContext, Prepared, SizeRule,
};
use crate::pipeline::memo::Memo;
use crate::pipeline::passes::{denoise_pass, PassRequest, PassStage};
use crate::pipeline::text::{encode_t5_chunks, load_t5, load_umt5_tokenizer, t5_weighted_chunks};
use crate::pipeline::vae::VaeStage;
use crate::progress::Progress;
use crate::runner::{Loaded, Runner, StoreSource};
use crate::sampling::{GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions};
use crate::tensor::HostTensor;
use crate::tokenizers::T5Tokenizer;

/// Latent frames for a requested frame count (upstream: (F − 1)/4 + 1, at least 1).
pub fn latent_frames(frames: usize) -> usize {
    frames.saturating_sub(1) / 4 + 1
}

/// Frames the VAE makes from `latent` latent frames.
pub fn video_frames(latent: usize) -> usize {
    4 * latent.saturating_sub(1) + 1
}

pub struct WanPipeline {
    tokenizer: T5Tokenizer,
    te: Loaded<T5Encoder>,
    dit: Loaded<Wan>,
    /// Wan 2.2 A14B's high-noise expert, when given.
    high: Option<Loaded<Wan>>,
    /// The VAE for single frames (img2img, `-M img_gen`) and its statistics.
    vae: VaeStage,
    stats: LatentStats,
    schedule: ModelSchedule,
    prediction: Prediction,
    states: Memo<HostTensor>,
    /// The CLIP tower of a transformer with an image branch (I2V, FLF2V).
    clip: Option<ClipTower>,
    /// The VAE is Wan 2.2's (TI2V-5B: `--init-img` fixes the first latent frame).
    wan22: bool,
    batch: Option<Prepared<WanBatch>>,
}

/// What a batch shares: its latent frames and, for image-to-video models, the condition.
struct WanBatch {
    /// Latent frames of the video (without a VACE reference frame).
    frames: usize,
    /// VACE models: the control context and `--vace-strength`.
    vace: Option<(VaceCondition, f32)>,
    condition: Option<ImageCondition>,
    /// TI2V-5B image-to-video: the init image's normalised latent [w, h, C], the first frame.
    first_frame: Option<Vec<f32>>,
}

impl WanPipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let dit_files = files.require(&DIFFUSION)?;
        let t5_files = files.require(&T5)?;
        let vae_files = files.require(&VAE)?;
        let mut bar = Progress::new("loading model", 3);

        let hints = dit_files
            .config()
            .map(WanHints::from_config)
            .unwrap_or_default();
        let root = dit_files.root(ComponentId::Diffusion);
        let src = StoreSource::new(&dit_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let dit = Runner::load("wan", &src, opts, |wb| -> Result<Wan> {
            let config = WanConfig::detect(wb, hints.clone())?;
            log::debug!("wan: {config:?}");
            Ok(Wan::new(wb, config)?)
        })?;
        bar.tick();

        let high = match files.get(ComponentId::HighNoiseDiffusion) {
            Some(store) => {
                let root = store.root(ComponentId::HighNoiseDiffusion);
                let src = StoreSource::new(&store.store, &root);
                let hints = store
                    .config()
                    .map(WanHints::from_config)
                    .unwrap_or_else(|| hints.clone());
                let opts = ctx.load_options(ComponentId::HighNoiseDiffusion, true)?;
                let high = Runner::load("wan_high_noise", &src, opts, |wb| -> Result<Wan> {
                    let config = WanConfig::detect(wb, hints.clone())?;
                    Ok(Wan::new(wb, config)?)
                })?;
                let (a, b) = (dit.model.config(), high.model.config());
                if (a.in_channels, a.out_channels, a.text_dim, a.image)
                    != (b.in_channels, b.out_channels, b.text_dim, b.image)
                {
                    return Err(Error::Unsupported(format!(
                        "the high-noise expert ({}) does not match the diffusion model: \
                         channels {}→{} vs {}→{}, text width {} vs {}",
                        store.path.display(),
                        b.in_channels,
                        b.out_channels,
                        a.in_channels,
                        a.out_channels,
                        b.text_dim,
                        a.text_dim
                    )));
                }
                Some(high)
            }
            None => None,
        };
        let clip = match c_image_dim(&dit.model) {
            Some(in_dim) => Some(load_clip(files, ctx, in_dim)?),
            None => None,
        };
        let te = load_t5(t5_files, ctx)?;
        let tokenizer = load_umt5_tokenizer(t5_files, ctx.t5_tokenizer)?;
        t5::check_tokenizer(&te.model, &tokenizer, &t5_files.path.display().to_string())?;
        let c = dit.model.config();
        if te.model.config().d_model != c.text_dim {
            return Err(Error::Unsupported(format!(
                "the text encoder's width {} does not match the transformer's text input {} \
                 (Wan reads umT5-XXL)",
                te.model.config().d_model,
                c.text_dim
            )));
        }
        bar.tick();

        let (vae, stats, wan22) = load_vae(vae_files, ctx, c.out_channels, c.vace.is_some())?;
        bar.tick();
        Ok(Self {
            tokenizer,
            te,
            dit,
            vae,
            stats,
            schedule: ModelSchedule::Flow {
                shift: ctx.flow_shift.unwrap_or(FLOW_SHIFT),
            },
            prediction: ctx.prediction.unwrap_or(Prediction::Sd3Flow),
            states: Memo::new(2),
            high,
            clip,
            wan22,
            batch: None,
        })
    }

    /// Input channels the transformer reads beyond the latent (mask and condition latent of
    /// image-to-video models; 0 for text-to-video).
    fn concat_channels(&self) -> usize {
        let c = self.dit.model.config();
        c.in_channels.saturating_sub(c.out_channels)
    }

    /// Sizes must be multiples of this (VAE 8 × patch 2).
    pub fn size_multiple(&self) -> usize {
        let p = self.dit.model.config().patch;
        self.vae.scale_factor() * p[1].max(p[2])
    }

    /// The prompt's umT5 states [text_dim, 512·chunks]: tokens and `</s>` padded per chunk,
    /// the padding masked in attention and zeroed, emphasis weights applied.
    pub fn encode_prompt(&self, prompt: &str) -> Result<HostTensor> {
        self.states.get_or_try(prompt, || -> Result<HostTensor> {
            let chunks = t5_weighted_chunks(&self.tokenizer, prompt, TEXT_LEN)?;
            let mut states = encode_t5_chunks(&self.te, &chunks, true)?;
            let d = states.ne[0];
            for (i, c) in chunks.iter().enumerate() {
                let start = (i * TEXT_LEN + c.real) * d;
                let end = (i + 1) * TEXT_LEN * d;
                states.data[start..end].iter_mut().for_each(|v| *v = 0.0);
            }
            Ok(states)
        })
    }

    /// The transformer's velocity for latent `x` [W, H, T, C] at `sigma`.
    fn velocity(
        &self,
        dit: &Loaded<Wan>,
        x: &[f32],
        lat: [usize; 4],
        text: &HostTensor,
        sigma: f32,
        extra: CallExtras<'_>,
    ) -> Result<Vec<f32>> {
        let CallExtras {
            condition,
            frame_timesteps,
            vace,
        } = extra;
        let model = &dit.model;
        let [w, h, t, _] = lat;
        let mut input = x.to_vec();
        if let Some(cond) = condition {
            input.extend_from_slice(&cond.concat);
        }
        let channels = input.len() / (w * h * t).max(1);
        let v = dit.runner.compute_one(|g| {
            let inputs = WanInputs {
                latent: g.input_f32("wan.latent", [w, h, t, channels], input.clone()),
                text: g.input_f32("wan.text", text.ne, text.data.clone()),
                image: condition
                    .and_then(|cond| cond.clip.as_ref())
                    .map(|clip| g.input_f32("wan.image", clip.ne, clip.data.clone())),
                timestep: sigma * 1000.0,
                vace: vace.map(|(v, strength)| VaceContext {
                    context: g.input_f32("wan.vace", v.context.ne, v.context.data.clone()),
                    strength,
                }),
            };
            match frame_timesteps {
                Some(ts) => model.forward_per_frame(g, &inputs, ts),
                None => model.forward(g, &inputs),
            }
        })?;
        Ok(v.data)
    }

    /// Samples the video latent [W, H, T·C] (channel-major, as torch's (C, T, H, W)).
    fn sample(
        &self,
        req: PassRequest<'_>,
        frames: usize,
        cond_in: Conditioning<'_>,
        expert: Option<&HighNoiseJob<'_>>,
    ) -> Result<HostTensor> {
        let condition = cond_in.condition;
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
        let c = self.dit.model.config().out_channels;
        let (lw, lh) = (req.width / f, req.height / f);
        let t1 = Instant::now();
        let model = WanModel {
            pipe: self,
            dit: &self.dit,
            cond: &cond,
            uncond: uncond.as_ref(),
            lat: [lw, lh, frames, c],
            condition,
            first: cond_in.first,
            vace: cond_in.vace,
        };
        if let (Some(high), Some(expert)) = (&self.high, expert) {
            if req.preview.is_some() || req.mask.is_some() {
                return Err(Error::Unsupported(
                    "--preview and --mask are not supported with a high-noise expert".into(),
                ));
            }
            // The expert's own guidance decides whether it needs the negative prompt.
            let uncond_high = match (&uncond, expert.guidance.needs_uncond()) {
                (Some(u), _) => Some(u.clone()),
                (None, true) => Some(self.encode_prompt(req.negative_prompt)?),
                (None, false) => None,
            };
            let high_model = WanModel {
                dit: high,
                uncond: uncond_high.as_ref(),
                ..model
            };
            let job = crate::pipeline::SampleJob {
                plan: req.plan,
                guidance: req.guidance,
                noise_rng: req.noise_rng,
                sampler_rng: req.sampler_rng,
                init: req.init,
                preview: None,
                mask: None,
            };
            let shape = (lw, lh, frames * c);
            let (latent, steps) = denoise_two_experts(
                high_model,
                model,
                self.prediction,
                &self.schedule,
                job,
                expert,
                shape,
            )?;
            log::debug!(
                "wan: condition {condition_secs:.2}s, sampling {:.2}s ({steps} steps, two experts)",
                t1.elapsed().as_secs_f64()
            );
            return Ok(HostTensor::image(lw, lh, frames * c, latent)?);
        }
        let stage = PassStage {
            vae: &self.vae,
            preview_vae: None,
            prediction: self.prediction,
            schedule: &self.schedule,
            family: "Wan",
        };
        let mut req = req;
        if frames > 1 && req.preview.take().is_some() {
            log::warn!("Wan: --preview does not show video latents; no previews");
        }
        let (latent, steps) = denoise_pass(req, model, &stage, (lw, lh, frames * c))?;
        log::debug!(
            "wan: condition {condition_secs:.2}s, sampling {:.2}s ({steps} steps)",
            t1.elapsed().as_secs_f64()
        );
        Ok(latent)
    }

    /// Frames [W, H, 3, F] in [0, 1] of a sampler latent [w, h, T·C].
    fn decode_video(
        &self,
        x: &HostTensor,
        frames: usize,
        tiling: Option<&TileSettings>,
    ) -> Result<HostTensor> {
        let t = Instant::now();
        let [w, h, tc, _] = x.ne;
        let c = tc / frames;
        let (mean, std) = (self.stats.mean(), self.stats.std());
        let mut z = x.data.clone();
        for ch in 0..c {
            let plane = frames * w * h;
            for v in &mut z[ch * plane..(ch + 1) * plane] {
                *v = *v * std[ch] + mean[ch];
            }
        }
        let z = HostTensor {
            ne: [w, h, frames, c],
            data: z,
        };
        let out = self.vae.decode_video(&z, tiling)?;
        log::debug!("wan: decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(crate::pipeline::vae::clip_to_frames(&out))
    }
}

impl WanPipeline {
    /// The condition of an image-to-video transformer: the concatenated mask and condition
    /// latent, and the CLIP tokens when it has an image branch (FLF2V: both images).
    fn image_condition(
        &self,
        batch: &BatchInputs<'_>,
        frames: usize,
        concat: usize,
    ) -> Result<ImageCondition> {
        let z = self.stats.channels();
        if concat != MASK_CHANNELS + z {
            return Err(Error::Unsupported(format!(
                "the transformer reads {concat} condition channels; Wan image-to-video models \
                 read {MASK_CHANNELS} mask + {z} latent channels"
            )));
        }
        if batch.init.is_none() {
            log::warn!("Wan image-to-video without --init-img: conditioning on a grey video");
        }
        let (w, h) = (batch.width, batch.height);
        let t = Instant::now();
        let concat = concat_condition(
            &self.vae,
            &self.stats,
            batch.init,
            batch.end,
            w,
            h,
            video_frames(frames),
        )?;
        let image = self.dit.model.config().image;
        let clip = match (&self.clip, image) {
            (Some(clip), Some(branch)) => {
                let images: &[Option<&crate::image_io::Image>] = if branch.pos_len.is_some() {
                    &[batch.init, batch.end]
                } else {
                    if batch.end.is_some() {
                        log::warn!(
                            "this Wan I2V model has no first/last-frame image branch: --end-img \
                             only conditions the last frame's latent"
                        );
                    }
                    &[batch.init]
                };
                Some(clip_tokens(clip, &self.vae, images, w, h)?)
            }
            _ => None,
        };
        log::debug!("wan: image condition in {:.2}s", t.elapsed().as_secs_f64());
        Ok(ImageCondition { concat, clip })
    }
}

/// The latent [w, h, T·C] (channel-major) without its first `drop` frames.
fn drop_leading_frames(x: HostTensor, frames: usize, drop: usize) -> HostTensor {
    if drop == 0 {
        return x;
    }
    let [w, h, tc, _] = x.ne;
    let c = tc / frames;
    let plane = w * h;
    let mut data = Vec::with_capacity((frames - drop) * c * plane);
    for ch in 0..c {
        let start = (ch * frames + drop) * plane;
        data.extend_from_slice(&x.data[start..(ch + 1) * frames * plane]);
    }
    HostTensor {
        ne: [w, h, (frames - drop) * c, 1],
        data,
    }
}

/// The CLIP width a transformer's image branch reads, if it has one.
fn c_image_dim(model: &Wan) -> Option<usize> {
    model.config().image.map(|i| i.in_dim)
}

/// Loads `--clip_vision` for a transformer with an image branch of width `in_dim`: every layer
/// as upstream, or `--clip-skip` n as the CLIP encoders count it (2: diffusers' penultimate).
fn load_clip(files: &ComponentFiles, ctx: &LoadContext<'_>, in_dim: usize) -> Result<ClipTower> {
    let store = files.get(ComponentId::ClipVision).ok_or_else(|| {
        Error::Unsupported(
            "this Wan model is image-to-video with a CLIP image branch: pass --clip_vision \
             (clip_vision_h.safetensors)"
                .into(),
        )
    })?;
    let prefix = ComponentId::ClipVision.prefix();
    let src = ClipVisionSource::new(&store.store, prefix);
    let hp = ClipVisionHparams::new(ClipActivation::Gelu)
        .with_store_config(&store.store, prefix)?
        .with_openclip_layout(src.layout().is_openclip());
    let opts = ctx.load_options(ComponentId::ClipVision, true)?;
    let tower = Runner::load("clip_vision", &src, opts, |wb| -> Result<ClipVisionModel> {
        let config = ClipVisionConfig::detect(wb, &hp)?;
        if config.hidden != in_dim {
            return Err(Error::Unsupported(format!(
                "the CLIP vision encoder's width {} does not match the transformer's image \
                 input {in_dim} ({})",
                config.hidden,
                store.path.display()
            )));
        }
        log::debug!("clip vision: {config:?}");
        Ok(ClipVisionModel::new(wb, config)?)
    })?;
    let depth = tower.model.config().layers;
    let layers = ctx
        .clip_skip
        .map_or(depth, |s| clip_skip_layers(depth, s as i32));
    Ok(ClipTower { tower, layers })
}

/// The transformer as the guided denoiser's model.
struct WanModel<'a> {
    pipe: &'a WanPipeline,
    dit: &'a Loaded<Wan>,
    cond: &'a HostTensor,
    uncond: Option<&'a HostTensor>,
    lat: [usize; 4],
    condition: Option<&'a ImageCondition>,
    /// TI2V-5B: the first latent frame, fixed (see [`WanModel::predict`]).
    first: Option<&'a [f32]>,
    vace: Option<(&'a VaceCondition, f32)>,
}

/// What one transformer call reads beyond latent, text and sigma.
#[derive(Clone, Copy)]
struct CallExtras<'a> {
    condition: Option<&'a ImageCondition>,
    /// One timestep per latent frame (TI2V's fixed first frame at 0).
    frame_timesteps: Option<&'a [f32]>,
    vace: Option<(&'a VaceCondition, f32)>,
}

/// What a sampling pass is conditioned on beyond the text.
#[derive(Clone, Copy)]
struct Conditioning<'a> {
    condition: Option<&'a ImageCondition>,
    first: Option<&'a [f32]>,
    vace: Option<(&'a VaceCondition, f32)>,
}

impl GuidedModel for WanModel<'_> {
    /// With a fixed first frame (TI2V-5B image-to-video, as upstream and diffusers'
    /// `expand_timesteps`): the transformer sees that frame clean at timestep 0 and the others
    /// at the step's; its velocity there is replaced by the one whose denoised estimate is the
    /// frame itself, so the sampler lands on it.
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        let [w, h, t, c] = self.lat;
        let plane = w * h;
        let x_in = match self.first {
            Some(f0) => {
                let mut x = call.x.to_vec();
                for ch in 0..c {
                    let at = ch * t * plane;
                    x[at..at + plane].copy_from_slice(&f0[ch * plane..(ch + 1) * plane]);
                }
                x
            }
            None => call.x.to_vec(),
        };
        let frame_t = self.first.map(|_| {
            let mut ts = vec![call.sigma * 1000.0; t];
            ts[0] = 0.0;
            ts
        });
        Predictions::one_call_each(&call, self.cond, self.uncond, |text, _| {
            let mut v = self
                .pipe
                .velocity(
                    self.dit,
                    &x_in,
                    self.lat,
                    text,
                    call.sigma,
                    CallExtras {
                        condition: self.condition,
                        frame_timesteps: frame_t.as_deref(),
                        vace: self.vace,
                    },
                )
                .map_err(|e| format!("{e:#}"))?;
            if let (Some(f0), true) = (self.first, call.sigma > 0.0) {
                for ch in 0..c {
                    let at = ch * t * plane;
                    for i in 0..plane {
                        v[at + i] = (call.x[at + i] - f0[ch * plane + i]) / call.sigma;
                    }
                }
            }
            Ok(v)
        })
    }
}

impl Generator for WanPipeline {
    fn settings(&self) -> Vec<(&'static str, String)> {
        let vace = self.batch.as_ref().and_then(|b| b.extra.vace.as_ref());
        vace.map(|(_, strength)| vec![("VACE strength", cpp_float(*strength))])
            .unwrap_or_default()
    }

    fn size_rule(&self) -> SizeRule {
        SizeRule {
            multiple: self.size_multiple() as u32,
            round_up: true,
            refs_set_size: false,
        }
    }

    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()> {
        if !batch.refs.is_empty() {
            return Err(Error::Unsupported(
                "Wan text-to-video takes no reference images (-r)".into(),
            ));
        }
        let frames = latent_frames(batch.video_frames.unwrap_or(1));
        if batch
            .video_frames
            .is_some_and(|f| video_frames(frames) != f)
        {
            log::warn!(
                "Wan makes 4k + 1 frames: {} requested, {} generated",
                batch.video_frames.unwrap_or(1),
                video_frames(frames)
            );
        }
        let vace = self.dit.model.config().vace.clone();
        if vace.is_none() && !batch.control_frames.is_empty() {
            log::warn!("--control-video is read by Wan VACE models only; ignored");
        }
        let concat = self.concat_channels();
        if let (Some(v), 0) = (vace, concat) {
            if batch.end.is_some() || batch.mask.is_some() || batch.hires {
                return Err(Error::Unsupported(
                    "--end-img, --mask and --hires are not supported by Wan VACE models".into(),
                ));
            }
            let (w, h) = (batch.width, batch.height);
            let t = Instant::now();
            let cond = vace_condition(
                &self.vae,
                &self.stats,
                batch.control_frames,
                batch.init,
                w,
                h,
                video_frames(frames),
                v.in_channels,
            )?;
            log::debug!(
                "wan: VACE control ({} frames, {} reference) in {:.2}s",
                batch.control_frames.len().min(video_frames(frames)),
                cond.ref_frames,
                t.elapsed().as_secs_f64()
            );
            self.batch = Some(Prepared {
                width: w,
                height: h,
                init: None,
                mask: None,
                extra: WanBatch {
                    frames,
                    vace: Some((cond, batch.vace_strength)),
                    condition: None,
                    first_frame: None,
                },
            });
            return Ok(());
        }
        if concat == 0 {
            if batch.end.is_some() {
                return Err(Error::Unsupported(
                    "--end-img needs a Wan image-to-video model (I2V / FLF2V); this one is \
                     text-to-video"
                        .into(),
                ));
            }
            if self.wan22 && frames > 1 && batch.init.is_some() {
                if batch.mask.is_some() || batch.hires {
                    return Err(Error::Unsupported(
                        "--mask and --hires are not supported by Wan 2.2 TI2V videos".into(),
                    ));
                }
                let (w, h) = (batch.width, batch.height);
                let first = batch
                    .init
                    .map(|img| self.vae.encode_init(img, w, h, batch.tiling))
                    .transpose()?
                    .map(|z| z.data);
                self.batch = Some(Prepared {
                    width: w,
                    height: h,
                    init: None,
                    mask: None,
                    extra: WanBatch {
                        frames,
                        condition: None,
                        first_frame: first,
                        vace: None,
                    },
                });
                return Ok(());
            }
            if frames > 1 && (batch.init.is_some() || batch.mask.is_some() || batch.hires) {
                return Err(Error::Unsupported(
                    "--init-img, --mask and --hires need a Wan image-to-video model for videos; \
                     this one is text-to-video"
                        .into(),
                ));
            }
            let base = Prepared::encode(&self.vae, batch, "Wan")?;
            self.batch = Some(Prepared {
                width: base.width,
                height: base.height,
                init: base.init,
                mask: base.mask,
                extra: WanBatch {
                    frames,
                    condition: None,
                    first_frame: None,
                    vace: None,
                },
            });
            return Ok(());
        }
        if batch.mask.is_some() || batch.hires {
            return Err(Error::Unsupported(
                "--mask and --hires are not supported by Wan image-to-video models".into(),
            ));
        }
        let condition = self.image_condition(batch, frames, concat)?;
        self.batch = Some(Prepared {
            width: batch.width,
            height: batch.height,
            init: None,
            mask: None,
            extra: WanBatch {
                frames,
                condition: Some(condition),
                first_frame: None,
                vace: None,
            },
        });
        Ok(())
    }

    fn generate(&mut self, job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let frames = batch.extra.frames;
        let condition = batch.extra.condition.as_ref();
        let first = batch.extra.first_frame.as_deref();
        let vace = batch.extra.vace.as_ref().map(|(v, s)| (v, *s));
        // A VACE reference image is an extra latent frame in front, dropped before decoding.
        let refs = vace.map_or(0, |(v, _)| v.ref_frames);
        let tiling = job.tiling;
        let expert = job.high_noise;
        let x = crate::pipeline::passes::sample_passes(job, batch, &self.vae, |req| {
            self.sample(
                req,
                frames + refs,
                Conditioning {
                    condition,
                    first,
                    vace,
                },
                expert.as_ref(),
            )
        })?;
        let x = drop_leading_frames(x, frames + refs, refs);
        if frames == 1 {
            return self.vae.decode(&x, tiling);
        }
        self.decode_video(&x, frames, tiling)
    }
}
