//! The MiniMax-H3 pipeline: loading, text conditioning, sampling the packed latent, decoding
//! the video and the soundtrack.

use std::cell::Cell;
use std::time::Instant;

use super::carrier::{CarrierPoint, Packing};
use super::conditions::{ConditionRows, Conditions};
use super::frames::{align_frames, audio_latents, FPS};
use super::keyframes::{fit_keyframes, presentation, IMAGE_PAD};
use super::{AUDIO_VAE, CONTEXT_CACHE, DIFFUSION, FLOW_SHIFT, LLM, TEXT_LAYER, VAE};
use crate::error::{Error, Result};
use crate::image_io::audio::Audio;
use crate::models::dit::minimax_h3::{
    self, layout, Keyframe, LayoutRequest, MiniMaxH3, MiniMaxH3Config, MiniMaxH3Hints,
    MiniMaxH3Inputs, Reference,
};
use crate::models::te::qwen3::{
    self, qwen3_hparams, qwen3_mrope_section, Qwen3Config, Qwen3MmInput, Qwen3Source,
    Qwen3TextModel, DEFAULT_MROPE_SECTION,
};
use crate::models::vae::minimax_h3_audio_vae::MiniMaxH3AudioVae;
use crate::models::vae::minimax_h3_vae::{
    decode_video_tiled, denormalize_video_latent, LatentStats, MiniMaxH3Vae, MiniMaxH3VaeConfig,
};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{BatchInputs, Generator, ImageJob, LoadContext, Prepared, SizeRule};
use crate::pipeline::memo::Memo;
use crate::pipeline::qwen3_vision::Vision;
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
    /// The Qwen3-VL vision tower, loaded for runs with pictures when the files hold it.
    vision: Option<Vision>,
    /// The batch's keyframes or references, encoded once per batch.
    conditions: Option<Conditions>,
    /// The video flow shift (`--flow-shift`, else 12).
    shift: f32,
    schedule: ModelSchedule,
    prediction: Prediction,
    states: Memo<Option<TextCondition>>,
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
        let mrope = qwen3_mrope_section(&llm_files.store).unwrap_or(DEFAULT_MROPE_SECTION);
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
            Ok(Qwen3TextModel::new_truncated(wb, config)?.with_mrope_section(mrope))
        })?;
        let tokenizer = load_qwen_tokenizer_of(llm_files)?;
        let vision = if ctx.needs.encoder {
            Self::load_vision(files, llm_files, ctx, te.model.config().hidden)?
        } else {
            None
        };
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
            // The encoder runs for keyframes and references only.
            config.encoder = ctx.needs.encoder;
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
                let encoder = ctx.needs.audio_references;
                let a = MiniMaxH3AudioVae::load("audio_vae", &src, store.config(), opts, encoder)?;
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
            vision,
            conditions: None,
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

    /// The Qwen3-VL vision tower for keyframe and reference pictures, when the files hold it
    /// (a `--llm_vision` file or the LLM file). Without it the prompt carries no presentation
    /// and the media condition through their rows alone, as upstream.
    fn load_vision(
        files: &ComponentFiles,
        llm_files: &crate::pipeline::components::ComponentStore,
        ctx: &LoadContext<'_>,
        hidden: usize,
    ) -> Result<Option<Vision>> {
        let Some(vision_files) = files.get(ComponentId::LlmVision).filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let opts = ctx.load_options(ComponentId::LlmVision, false)?;
        let v = match Vision::load(
            vision_files,
            llm_files,
            opts,
            "MiniMax-H3 keyframe and reference pictures",
        ) {
            Ok(v) => v,
            Err(e) => {
                log::warn!(
                    "{e}; keyframes and references condition the video through their rows only \
                     (their pictures are left out of the prompt)"
                );
                return Ok(None);
            }
        };
        if v.out_hidden() != hidden {
            return Err(Error::Unsupported(format!(
                "the vision tower's output size {} does not match the text encoder's hidden \
                 size {hidden}",
                v.out_hidden()
            )));
        }
        Ok(Some(v))
    }

    /// The condition of `prompt` (`None` for a prompt without tokens): its states
    /// [text_dim, tokens] and each row's modality tag. The text goes verbatim, no special
    /// tokens, through the first 50 layers (all of the released truncated export) before any
    /// final norm; with keyframes or references it opens with their presentation.
    pub fn encode_condition(&self, prompt: &str) -> Result<Option<TextCondition>> {
        let pictures = self.conditions.as_ref().filter(|c| c.has_presentation());
        let key = match pictures {
            Some(k) => format!("{:016x}\u{0}{prompt}", k.id),
            None => prompt.to_owned(),
        };
        self.states
            .get_or_try(&key, || -> Result<Option<TextCondition>> {
                let layers = self.te.model.config().layers;
                // hidden_states[50], or the last layer's output of a shallower export.
                let run = Some(layers.min(TEXT_LAYER));
                let Some(k) = pictures else {
                    let ids: Vec<i32> = self
                        .tokenizer
                        .encode(prompt)
                        .into_iter()
                        .map(|i| i as i32)
                        .collect();
                    if ids.is_empty() {
                        return Ok(None);
                    }
                    let states = qwen3::encode_layers(&self.te.runner, &self.te.model, &ids, run)?;
                    let tags = vec![layout::TEXT_TAG as u8; ids.len()];
                    return Ok(Some(TextCondition { states, tags }));
                };
                let pad_id = self
                    .tokenizer
                    .token_to_id(IMAGE_PAD)
                    .and_then(|i| i32::try_from(i).ok())
                    .ok_or_else(|| {
                        Error::Unsupported(format!(
                            "the Qwen tokenizer has no {IMAGE_PAD} token for the pictures"
                        ))
                    })?;
                let pads: Vec<usize> = k.vision.iter().map(|v| v.grid_h * v.grid_w).collect();
                let (ids, tags) = presentation(&self.tokenizer, prompt, &k.presentation, &pads);
                let ids: Vec<i32> = ids.into_iter().map(|i| i as i32).collect();
                let c = self.te.model.config();
                let input = Qwen3MmInput::from_images(ids, pad_id, &k.vision, c.hidden)?;
                let states =
                    qwen3::encode_multimodal_layers(&self.te.runner, &self.te.model, &input, run)?;
                Ok(Some(TextCondition { states, tags }))
            })
    }

    /// The batch's conditioning video latents (keyframes or reference images; normalised,
    /// before the visual noise) in packed order.
    pub fn condition_latents(&self) -> Vec<&HostTensor> {
        self.conditions
            .iter()
            .flat_map(|c| c.latents.iter())
            .collect()
    }

    /// The batch's reference soundtracks as transformer audio rows ([audio channels, rows]
    /// data, normalised), clips in order.
    pub fn condition_audio_rows(&self) -> &[f32] {
        self.conditions.as_ref().map_or(&[], |c| &c.audio_rows[..])
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
            return self.velocity_with(x, p, text, None, sigma);
        }
        match self.velocity_with(x, p, text, Some(text.cache_key), sigma) {
            Err(Error::Runner(e)) if e.is_alloc_failure() => {
                log::warn!("MiniMax-H3: out of memory with the context cache; running without it");
                self.clear_context_cache();
                self.cache_live.set(false);
                self.velocity_with(x, p, text, None, sigma)
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
        cond: &Condition<'_>,
        cache_key: Option<&str>,
        sigma: f32,
    ) -> Result<Vec<f32>> {
        let text = cond.text.map(|t| &t.states);
        let c = self.dit.model.config();
        let point = CarrierPoint::new(sigma, self.shift);
        let (video, carrier) = p.split(x);
        let x_a = point.audio_in(carrier);
        let latent = HostTensor {
            ne: [p.width, p.height, p.frames, p.channels],
            data: video.to_vec(),
        };
        let mut rows = minimax_h3::patchify(&latent, c.patch);
        let mut audio_rows = p.audio_rows(&x_a);
        let (mut anchors, mut references): (&[Keyframe], &[Reference]) = (&[], &[]);
        if let Some(m) = cond.media {
            // Condition rows go in front of the generated ones.
            if m.video.ne[1] > 0 {
                let mut data = m.video.data.clone();
                data.extend_from_slice(&rows.data);
                rows = HostTensor {
                    ne: [rows.ne[0], m.video.ne[1] + rows.ne[1], 1, 1],
                    data,
                };
            }
            let mut audio = m.audio.clone();
            audio.extend_from_slice(&audio_rows);
            audio_rows = audio;
            anchors = &m.anchors;
            references = &m.references;
        }
        let audio_count = audio_rows.len() / p.audio_channels.max(1);
        let tags = cond.text.map_or(&[][..], |t| &t.tags[..]);
        let lay = layout::build(&LayoutRequest {
            text_tags: tags,
            latent_frames: p.frames,
            latent_height: p.height,
            latent_width: p.width,
            patch: c.patch,
            audio_latents: p.audio_len,
            keyframes: anchors,
            references,
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
                    [p.audio_channels, audio_count, 1, 1],
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

    pub(super) fn conditions(&self) -> Option<&Conditions> {
        self.conditions.as_ref()
    }

    pub(super) fn vision(&self) -> Option<&Vision> {
        self.vision.as_ref()
    }

    pub(super) fn video_vae(&self) -> (&Loaded<MiniMaxH3Vae>, &LatentStats) {
        (&self.vae, &self.stats)
    }

    pub(super) fn transformer_patch(&self) -> [usize; 3] {
        self.dit.model.config().patch
    }

    /// The audio VAE with its encoder (reference soundtracks).
    pub(super) fn audio_vae_encoder(&self) -> Result<&Loaded<MiniMaxH3AudioVae>> {
        self.audio_vae
            .as_ref()
            .filter(|a| a.model.has_encoder())
            .ok_or_else(|| {
                Error::Unsupported(
                    "--ref-audio needs --audio-vae with the audio VAE's encoder weights".into(),
                )
            })
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

/// A prompt's transformer condition: its states [text_dim, tokens] and each row's modality
/// tag (text, or video for a picture's vision block).
#[derive(Clone, Debug)]
pub struct TextCondition {
    pub states: HostTensor,
    pub tags: Vec<u8>,
}

/// One condition: its text, the condition rows (keyframes or references) and its
/// context-cache entry.
struct Condition<'a> {
    text: Option<&'a TextCondition>,
    media: Option<&'a ConditionRows>,
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
        let references =
            !batch.refs.is_empty() || !batch.ref_audio.is_empty() || !batch.ref_videos.is_empty();
        if references && (batch.init.is_some() || batch.end.is_some()) {
            return Err(Error::Unsupported(
                "MiniMax-H3 takes keyframes (--init-img/--end-img) or references (-r, \
                 --ref-video, --ref-audio), not both"
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
        self.conditions = None;
        let images = fit_keyframes(batch.init, batch.end, batch.width, batch.height);
        let pictures = !images.is_empty() || !batch.refs.is_empty() || !batch.ref_videos.is_empty();
        if pictures && self.vision.is_none() {
            log::warn!(
                "MiniMax-H3: no Qwen3-VL vision weights (--llm_vision, or an --llm file \
                 holding them): the pictures are left out of the prompt"
            );
        }
        if references {
            self.conditions = Some(self.encode_references(
                batch.refs,
                batch.ref_videos,
                batch.ref_audio,
                (batch.width, batch.height, frames),
                batch.tiling,
            )?);
        } else if !images.is_empty() {
            self.conditions = Some(self.encode_keyframes(&images, batch.tiling)?);
        }
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
        let cond = self.encode_condition(job.prompt)?;
        let uncond = if job.guidance.needs_uncond() {
            Some(self.encode_condition(job.negative_prompt)?)
        } else {
            None
        };
        let media = self.condition_rows(job.seed);
        log::debug!("minimax_h3: condition {:.2}s", t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        self.clear_context_cache();
        self.cache_live.set(self.context_cache);
        let model = H3Model {
            pipe: self,
            packing: p,
            cond: Condition {
                text: cond.as_ref(),
                media: media.as_ref(),
                cache_key: "minimax_h3.ctx.cond",
            },
            uncond: uncond.as_ref().map(|u| Condition {
                text: u.as_ref(),
                media: media.as_ref(),
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
