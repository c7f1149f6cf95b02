//! The MiniMax-H3 pipeline: loading, text conditioning, sampling the packed latent, decoding
//! the video and the soundtrack.

use std::cell::Cell;
use std::time::Instant;

use super::carrier::{CarrierPoint, Packing};
use super::frames::{align_frames, audio_latents, FPS};
use super::{AUDIO_VAE, CONTEXT_CACHE, DIFFUSION, FLOW_SHIFT, LLM, TEXT_LAYER, VAE};
use crate::error::{Error, Result};
use crate::image_io::audio::Audio;
use crate::models::dit::minimax_h3::{
    self, layout, LayoutRequest, MiniMaxH3, MiniMaxH3Config, MiniMaxH3Hints, MiniMaxH3Inputs,
};
use crate::models::te::qwen3::{self, qwen3_hparams, Qwen3Config, Qwen3Source, Qwen3TextModel};
use crate::models::vae::minimax_h3_audio_vae::MiniMaxH3AudioVae;
use crate::models::vae::minimax_h3_vae::{
    decode_video_tiled, denormalize_video_latent, LatentStats, MiniMaxH3Vae, MiniMaxH3VaeConfig,
};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{BatchInputs, Generator, ImageJob, LoadContext, Prepared, SizeRule};
use crate::pipeline::memo::Memo;
use crate::pipeline::text::load_qwen_tokenizer_of;
use crate::pipeline::vae::clip_to_frames;
use crate::pipeline::SampleJob;
use crate::progress::Progress;
use crate::runner::{Loaded, Runner, RunnerError, StoreSource};
use crate::sampling::{GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions};
use crate::tensor::HostTensor;
use crate::tokenizers::BpeTokenizer;

pub struct MiniMaxH3Pipeline {
    tokenizer: BpeTokenizer,
    te: Loaded<Qwen3TextModel>,
    dit: Loaded<MiniMaxH3>,
    vae: Loaded<MiniMaxH3Vae>,
    stats: LatentStats,
    audio_vae: Option<Loaded<MiniMaxH3AudioVae>>,
    /// The video flow shift (`--flow-shift`, else 12).
    shift: f32,
    schedule: ModelSchedule,
    prediction: Prediction,
    states: Memo<Option<HostTensor>>,
    /// `minimax_h3_context_cache`, and whether it is still on for this run (an allocation
    /// failure turns it off until the run ends, as upstream).
    context_cache: bool,
    cache_live: Cell<bool>,
    batch: Option<Prepared<usize>>,
    /// The last video's soundtrack, until the caller takes it.
    audio: Option<Audio>,
    /// `-M img_gen`: return the first frame only.
    image_only: bool,
}

impl MiniMaxH3Pipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let dit_files = files.require(&DIFFUSION)?;
        let llm_files = files.require(&LLM)?;
        let vae_files = files.require(&VAE)?;
        let mut bar = Progress::new("loading model", 4);

        let hints = dit_files
            .config()
            .map(MiniMaxH3Hints::from_config)
            .unwrap_or_default();
        let root = dit_files.root(ComponentId::Diffusion);
        let src = StoreSource::new(&dit_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let dit = Runner::load("minimax_h3", &src, opts, |wb| -> Result<MiniMaxH3> {
            let config = MiniMaxH3Config::detect(wb, &hints)?;
            log::debug!("minimax_h3: {config:?}");
            Ok(MiniMaxH3::new(wb, config)?)
        })?;
        bar.tick();

        let (theta, eps) = qwen3_hparams(&llm_files.store);
        let src = Qwen3Source::new(&llm_files.store, ComponentId::Llm.prefix());
        let opts = ctx.load_options(ComponentId::Llm, true)?;
        let text_dim = dit.model.config().text_dim;
        let te = Runner::load("qwen3", &src, opts, |wb| -> Result<Qwen3TextModel> {
            let config = Qwen3Config::detect(wb, Some(theta), Some(eps))?;
            if config.hidden != text_dim {
                return Err(Error::Unsupported(format!(
                    "the text encoder's hidden size {} does not match the transformer's text \
                     input {text_dim} (MiniMax-H3 reads its own Qwen3-VL-32B variant)",
                    config.hidden
                )));
            }
            Ok(Qwen3TextModel::new_truncated(wb, config)?)
        })?;
        let tokenizer = load_qwen_tokenizer_of(llm_files)?;
        bar.tick();

        let json = vae_files.config();
        let src = StoreSource::new(&vae_files.store, ComponentId::Vae.prefix());
        let opts = ctx.load_options(ComponentId::Vae, false)?;
        let channels = dit.model.config().video_channels;
        let vae = Runner::load("vae", &src, opts, |wb| -> Result<MiniMaxH3Vae> {
            let mut config = MiniMaxH3VaeConfig::detect(wb, json)?;
            if config.latent_channels != channels {
                return Err(Error::Unsupported(format!(
                    "the VAE's latent has {} channels, the transformer's {channels}",
                    config.latent_channels
                )));
            }
            // Keyframe conditioning is not implemented: the decoder is all that runs.
            config.encoder = false;
            Ok(MiniMaxH3Vae::new(wb, config)?)
        })?;
        let stats = vae.model.latent_stats().cloned().ok_or_else(|| {
            Error::Unsupported(format!(
                "the VAE has a {channels}-channel latent but no latents_mean/latents_std in its \
                 config.json (only the released 24-channel statistics are built in)"
            ))
        })?;
        if stats.channels() != channels {
            return Err(Error::Unsupported(format!(
                "the VAE's latent statistics have {} channels, its latent {channels}",
                stats.channels()
            )));
        }
        bar.tick();

        let audio_vae = match files.get(ComponentId::AudioVae).filter(|s| !s.is_empty()) {
            Some(store) => {
                let src = StoreSource::new(&store.store, ComponentId::AudioVae.prefix());
                let opts = ctx.load_options(ComponentId::AudioVae, false)?;
                let a = MiniMaxH3AudioVae::load("audio_vae", &src, store.config(), opts, false)?;
                let want = dit.model.config().audio_channels;
                if a.model.latent_channels() != want {
                    return Err(Error::Unsupported(format!(
                        "the audio VAE's latent has {} channels, the transformer's {want}",
                        a.model.latent_channels()
                    )));
                }
                Some(a)
            }
            None => {
                log::info!(
                    "MiniMax-H3 without {}: the video is written without its soundtrack",
                    AUDIO_VAE.flags[0].flag()
                );
                None
            }
        };
        bar.tick();
        let shift = ctx.flow_shift.unwrap_or(FLOW_SHIFT);
        Ok(Self {
            tokenizer,
            te,
            dit,
            vae,
            stats,
            audio_vae,
            shift,
            schedule: ModelSchedule::Flow { shift },
            prediction: ctx.prediction.unwrap_or(Prediction::Sd3Flow),
            states: Memo::new(2),
            context_cache: ctx.model_args.get(&CONTEXT_CACHE),
            cache_live: Cell::new(false),
            batch: None,
            audio: None,
            image_only: false,
        })
    }

    /// The prompt's states [text_dim, tokens] (`None` for a prompt without tokens): the text
    /// verbatim, no special tokens, the output of the first 50 layers (all of the released
    /// truncated export) before any final norm.
    pub fn encode_prompt(&self, prompt: &str) -> Result<Option<HostTensor>> {
        self.states
            .get_or_try(prompt, || -> Result<Option<HostTensor>> {
                let ids: Vec<i32> = self
                    .tokenizer
                    .encode(prompt)
                    .into_iter()
                    .map(|i| i as i32)
                    .collect();
                if ids.is_empty() {
                    return Ok(None);
                }
                let layers = self.te.model.config().layers;
                let run = (layers > TEXT_LAYER).then_some(TEXT_LAYER);
                Ok(Some(qwen3::encode_layers(
                    &self.te.runner,
                    &self.te.model,
                    &ids,
                    run,
                )?))
            })
    }

    /// The sampler's velocity of packed latent `x` at `sigma` for condition `text`; with the
    /// context cache on, an allocation failure clears the cache, turns it off for the rest of
    /// the run and tries once more without it.
    fn velocity(
        &self,
        x: &[f32],
        p: &Packing,
        text: &Condition<'_>,
        sigma: f32,
    ) -> Result<Vec<f32>> {
        if !self.cache_live.get() {
            return self.velocity_with(x, p, text.states, None, sigma);
        }
        match self.velocity_with(x, p, text.states, Some(text.cache_key), sigma) {
            Err(Error::Runner(e)) if e.is_alloc_failure() => {
                log::warn!("MiniMax-H3: out of memory with the context cache; running without it");
                self.clear_context_cache();
                self.cache_live.set(false);
                self.velocity_with(x, p, text.states, None, sigma)
            }
            other => other,
        }
    }

    fn clear_context_cache(&self) {
        self.dit.runner.clear_cache(CACHE_PREFIX);
    }

    fn velocity_with(
        &self,
        x: &[f32],
        p: &Packing,
        text: Option<&HostTensor>,
        cache_key: Option<&str>,
        sigma: f32,
    ) -> Result<Vec<f32>> {
        let c = self.dit.model.config();
        let point = CarrierPoint::new(sigma, self.shift);
        let (video, carrier) = p.split(x);
        let x_a = point.audio_in(carrier);
        let latent = HostTensor {
            ne: [p.width, p.height, p.frames, p.channels],
            data: video.to_vec(),
        };
        let rows = minimax_h3::patchify(&latent, c.patch);
        let audio_rows = p.audio_rows(&x_a);
        let tags = vec![layout::TEXT_TAG as u8; text.map_or(0, |t| t.ne[1])];
        let lay = layout::build(&LayoutRequest {
            text_tags: &tags,
            latent_frames: p.frames,
            latent_height: p.height,
            latent_width: p.width,
            patch: c.patch,
            audio_latents: p.audio_len,
            keyframes: &[],
            video_t: 1.0 - point.sigma_v,
            audio_t: 1.0 - point.sigma_a,
        })
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "a {}x{}x{} latent does not divide into the transformer's {:?} patches",
                p.width, p.height, p.frames, c.patch
            ))
        })?;
        let mut err: Option<RunnerError> = None;
        let out = self.dit.runner.compute(|g| {
            let inputs = MiniMaxH3Inputs {
                video: g.input_f32("minimax_h3.video", rows.ne, rows.data.clone()),
                audio: g.input_f32(
                    "minimax_h3.audio",
                    [p.audio_channels, 2 * p.audio_len, 1, 1],
                    audio_rows.clone(),
                ),
                text: text.map(|t| g.input_f32("minimax_h3.text", t.ne, t.data.clone())),
                layout: &lay,
                text_cache: cache_key,
            };
            match self.dit.model.forward(g, &inputs) {
                Ok(o) => vec![o.video, o.audio],
                Err(e) => {
                    err = Some(e);
                    vec![g.input_f32("minimax_h3.failed", [1, 1, 1, 1], vec![0.0])]
                }
            }
        })?;
        if let Some(e) = err {
            return Err(e.into());
        }
        // The network predicts the data-ward velocity; the samplers' is its negative.
        let mut it = out.into_iter();
        let (Some(mut v), Some(mut a)) = (it.next(), it.next()) else {
            return Err(Error::Runner(RunnerError::Internal(
                "MiniMax-H3 graph returned too few outputs".into(),
            )));
        };
        v.data.iter_mut().for_each(|x| *x = -*x);
        a.data.iter_mut().for_each(|x| *x = -*x);
        let video_v =
            minimax_h3::unpatchify(&v, p.channels, [p.frames, p.height, p.width], c.patch);
        let v_a = p.audio_values_of_rows(&a.data);
        Ok(p.join(&video_v.data, &point.carrier_velocity(&x_a, &v_a)))
    }

    /// Sizes are rounded up to a multiple of this: the VAE's factor × the patch (32 for the
    /// released model).
    fn size_multiple(&self) -> usize {
        let [_, ph, pw] = self.dit.model.config().patch;
        self.vae.model.scale_factor() * ph.max(pw)
    }

    fn packing(&self, width: usize, height: usize, frames: usize) -> Packing {
        let c = self.dit.model.config();
        let f = self.vae.model.scale_factor();
        Packing {
            width: width / f,
            height: height / f,
            frames: self.vae.model.latent_frames(frames),
            channels: c.video_channels,
            audio_len: audio_latents(frames),
            audio_channels: c.audio_channels,
        }
    }

    /// Frames [W, H, 3, F] in [0, 1] of the sampled video latent (normalised) [w, h, T, C].
    fn decode_video(&self, z: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        let t = Instant::now();
        let mut raw = z.clone();
        denormalize_video_latent(&self.stats, &mut raw)?;
        let clip = decode_video_tiled(&self.vae.model, &self.vae.runner, &raw, tiling)?;
        log::debug!("minimax_h3: video decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(clip_to_frames(&clip))
    }

    /// The soundtrack of the sampled audio values (packed order, already divided out of the
    /// carrier), when an audio VAE is loaded.
    fn decode_audio(&self, p: &Packing, audio: &[f32]) -> Result<Option<Audio>> {
        let Some(vae) = &self.audio_vae else {
            return Ok(None);
        };
        let t = Instant::now();
        // Packed (t, stream, channel) → the audio VAE's [T, C, S].
        let (n, c) = (p.audio_len, p.audio_channels);
        let mut z = vec![0f32; audio.len()];
        for ch in 0..c {
            for s in 0..2 {
                for i in 0..n {
                    z[i + n * (ch + c * s)] = audio[(ch * 2 + s) * n + i];
                }
            }
        }
        let z = HostTensor {
            ne: [n, c, 2, 1],
            data: z,
        };
        let channels = vae.model.decode_latent(&vae.runner, &z)?;
        log::debug!("minimax_h3: audio decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(Some(Audio {
            sample_rate: vae.model.sample_rate(),
            channels,
        }))
    }
}

/// Names of the context cache's entries start with this.
const CACHE_PREFIX: &str = "minimax_h3.ctx.";

/// One condition: its text states and its context-cache entry.
struct Condition<'a> {
    states: Option<&'a HostTensor>,
    cache_key: &'static str,
}

/// The guided model the samplers call: the packed latent through the transformer.
struct H3Model<'a> {
    pipe: &'a MiniMaxH3Pipeline,
    packing: Packing,
    cond: Condition<'a>,
    uncond: Option<Condition<'a>>,
}

impl GuidedModel for H3Model<'_> {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        let p = self.packing;
        Predictions::one_call_each(&call, &self.cond, self.uncond.as_ref(), |text, _| {
            self.pipe
                .velocity(call.x, &p, text, call.sigma)
                .map_err(|e| format!("{e:#}"))
        })
    }
}

impl Generator for MiniMaxH3Pipeline {
    fn size_rule(&self) -> SizeRule {
        SizeRule {
            multiple: self.size_multiple() as u32,
            round_up: true,
            refs_set_size: false,
        }
    }

    fn fps(&self, requested: u32) -> u32 {
        if requested != FPS {
            log::warn!("MiniMax-H3 uses {FPS} fps; overriding the requested {requested}");
        }
        FPS
    }

    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()> {
        if !batch.refs.is_empty() || batch.init.is_some() || batch.end.is_some() {
            return Err(Error::Unsupported(
                "MiniMax-H3 keyframe (--init-img/--end-img) and reference (-r) conditioning \
                 are not implemented yet"
                    .into(),
            ));
        }
        if batch.mask.is_some() || batch.hires {
            return Err(Error::Unsupported(
                "--mask and --hires are not supported by MiniMax-H3".into(),
            ));
        }
        if !batch.control_frames.is_empty() {
            log::warn!("--control-video is read by Wan VACE models only; ignored");
        }
        // `-M img_gen`: the shortest clip (5 frames), of which the first is the image.
        let requested = batch.video_frames.unwrap_or(1);
        let frames = align_frames(requested);
        if frames != requested && batch.video_frames.is_some() {
            log::warn!(
                "MiniMax-H3 makes 17k + 5 frames: {requested} requested, {frames} generated"
            );
        }
        self.image_only = batch.video_frames.is_none();
        crate::pipeline::check_size(batch.width, batch.height, self.size_multiple())?;
        self.batch = Some(Prepared {
            width: batch.width,
            height: batch.height,
            init: None,
            mask: None,
            extra: frames,
        });
        Ok(())
    }

    fn generate(&mut self, job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let frames = batch.extra;
        let p = self.packing(batch.width, batch.height, frames);
        let t0 = Instant::now();
        let cond = self.encode_prompt(job.prompt)?;
        let uncond = if job.guidance.needs_uncond() {
            Some(self.encode_prompt(job.negative_prompt)?)
        } else {
            None
        };
        log::debug!("minimax_h3: condition {:.2}s", t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        self.clear_context_cache();
        self.cache_live.set(self.context_cache);
        let model = H3Model {
            pipe: self,
            packing: p,
            cond: Condition {
                states: cond.as_ref(),
                cache_key: "minimax_h3.ctx.cond",
            },
            uncond: uncond.as_ref().map(|u| Condition {
                states: u.as_ref(),
                cache_key: "minimax_h3.ctx.uncond",
            }),
        };
        if job.preview.is_some() {
            log::warn!("MiniMax-H3: --preview does not show video latents; no previews");
        }
        let sample = SampleJob {
            plan: job.plan,
            guidance: job.guidance,
            noise_rng: job.noise_rng,
            sampler_rng: job.sampler_rng,
            init: None,
            preview: None,
            mask: None,
        };
        let sampled =
            crate::pipeline::denoise(model, self.prediction, &self.schedule, sample, p.shape());
        // The cache lives for one sampling run.
        self.clear_context_cache();
        let (x, steps) = sampled?;
        log::debug!(
            "minimax_h3: sampling {:.2}s ({steps} steps)",
            t1.elapsed().as_secs_f64()
        );
        let (video, carrier) = p.split(&x);
        // The sampled carrier is the audio latent times the shift ratio.
        let ratio = CarrierPoint::new(1.0, self.shift).ratio;
        let audio: Vec<f32> = carrier.iter().map(|c| c / ratio).collect();
        self.audio = self.decode_audio(&p, &audio)?;
        let z = HostTensor {
            ne: [p.width, p.height, p.frames, p.channels],
            data: video.to_vec(),
        };
        let frames = self.decode_video(&z, job.tiling)?;
        if self.image_only {
            // An image has no soundtrack; the first frame is the picture.
            self.audio = None;
            let [w, h, c, _] = frames.ne;
            return Ok(HostTensor {
                ne: [w, h, c, 1],
                data: frames.data[..w * h * c].to_vec(),
            });
        }
        Ok(frames)
    }

    fn take_audio(&mut self) -> Option<Audio> {
        self.audio.take()
    }
}
