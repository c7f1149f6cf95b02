//! The FLUX.1 pipeline: loading, conditioning, sampling in packed tokens, decoding.

use std::time::Instant;

use super::{flow_shift, CLIP_L, DIFFUSION, T5, T5_CHUNK, VAE_SCALE, VAE_SHIFT};
use crate::error::{Error, Result};
use crate::image_io::Image;
use crate::models::dit::flux::packing::{self, RefIndex};
use crate::models::dit::flux::{Flux, FluxConfig, FluxInputs};
use crate::models::te::clip::{self, ClipActivation, ClipOutputs, ClipTextModel, PooledOutput};
use crate::models::te::t5::T5Encoder;
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{BatchInputs, Generator, ImageJob, LoadContext, Prepared, SizeRule};
use crate::pipeline::hires::second_pass;
use crate::pipeline::mask::InpaintMask;
use crate::pipeline::preview::PreviewRequest;
use crate::pipeline::resample::{resize, Resample};
use crate::pipeline::text::{
    encode_t5_chunks, load_clip, load_t5, load_t5_tokenizer, t5_weighted_chunks,
};
use crate::pipeline::vae::{load_decoders, LatentNorm, VaeStage};
use crate::pipeline::{denoise, SampleJob};
use crate::pipeline::{RefImageArgs, RefIndexMode};
use crate::progress::Progress;
use crate::rng::Rng;
use crate::runner::{Loaded, Runner, StoreSource};
use crate::sampling::{
    Guidance, GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions, SamplingPlan,
};
use crate::tensor::HostTensor;
use crate::tokenizers::clip::{tokenize_weighted, ClipTokenizer};
use crate::tokenizers::T5Tokenizer;

/// A prompt's conditioning: T5 hidden states [text_dim, L], the pooled CLIP vector (FLUX)
/// and Chroma's DiT mask over the text keys (0 or −∞ per token).
pub struct FluxCondition {
    pub text: HostTensor,
    pub pooled: Vec<f32>,
    pub mask: Option<Vec<f32>>,
}

/// Chroma's text settings (`--model-args`, upstream's defaults): T5 over 512-token chunks,
/// unmasked unless `chroma_use_t5_mask`; the DiT masks text keys past the prompt and
/// `chroma_t5_mask_pad` padding tokens unless `chroma_use_dit_mask=false`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChromaText {
    pub use_dit_mask: bool,
    pub use_t5_mask: bool,
    pub mask_pad: usize,
}

pub struct FluxPipeline {
    clip: Option<(ClipTokenizer, Loaded<ClipTextModel>)>,
    t5: Option<(T5Tokenizer, Loaded<T5Encoder>)>,
    dit: Loaded<Flux>,
    vae: VaeStage,
    /// TAEF1 for `--preview tae` with `--taesd-preview-only`.
    preview_vae: Option<VaeStage>,
    schedule: ModelSchedule,
    prediction: Prediction,
    /// `--ref-image-args ref_index_mode` of the batch.
    ref_index: RefIndex,
    /// FLUX Fill (inpainting) model.
    fill: bool,
    /// Chroma (T5 only, approximator modulation, DiT text mask).
    chroma: Option<ChromaText>,
    /// The batch's size, init latent, mask, Kontext reference latents and Fill channels.
    batch: Option<Prepared<(Vec<HostTensor>, Option<HostTensor>)>>,
}

/// One image request.
pub struct FluxRequest<'a> {
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub width: usize,
    pub height: usize,
    /// `--cfg-scale` (real CFG when ≠ 1) and `--guidance` (the distilled input of dev).
    pub guidance: Guidance,
    pub plan: &'a SamplingPlan,
    pub noise_rng: &'a mut dyn Rng,
    pub sampler_rng: &'a mut dyn Rng,
    /// img2img: the init image's sampler latent and `--strength`.
    pub init: Option<(&'a HostTensor, f32)>,
    pub preview: Option<PreviewRequest<'a>>,
    /// `--mask`: the latent mask each step's denoised estimate is blended with.
    pub mask: Option<&'a HostTensor>,
    /// Kontext: reference latents (sampler space) and how they are numbered.
    pub refs: &'a [HostTensor],
    pub ref_index: RefIndex,
    /// FLUX Fill: the masked-image latent and mask channels ([`FluxPipeline::prepare`]).
    pub fill: Option<&'a HostTensor>,
}

impl FluxPipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let dit_files = files.require(&DIFFUSION)?;
        let present = |id| files.get(id).filter(|s| !s.is_empty());
        let t5_files = present(T5.id);
        let tokenizer = t5_files
            .map(|f| load_t5_tokenizer(f, ctx.t5_tokenizer))
            .transpose()?;
        let mut bar = Progress::new("loading model", 4);

        let axes = dit_files
            .config()
            .and_then(|c| c.get("axes_dims_rope")?.as_array().cloned())
            .and_then(|a| {
                let v: Vec<usize> = a
                    .iter()
                    .filter_map(|x| x.as_u64().map(|x| x as usize))
                    .collect();
                (v.len() == 3).then(|| [v[0], v[1], v[2]])
            });
        let root = dit_files.root(ComponentId::Diffusion);
        let src = StoreSource::new(&dit_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let dit = Runner::load("flux", &src, opts, |wb| -> Result<Flux> {
            let mut config = FluxConfig::detect(wb)?;
            if let Some(a) = axes {
                config = config.with_axes_dims(a)?;
            }
            log::debug!("flux: {config:?}");
            Ok(Flux::new(wb, config)?)
        })?;
        bar.tick();

        let clip = match present(CLIP_L.id) {
            Some(f) => {
                let (model, _) = load_clip(f, ComponentId::ClipL, ctx, ClipActivation::QuickGelu)?;
                Some((ClipTokenizer::new()?, model))
            }
            None => {
                log::warn!("no CLIP-L text encoder (--clip_l): the pooled text vector is zeros");
                None
            }
        };
        bar.tick();
        let t5 = match (t5_files, tokenizer) {
            (Some(f), Some(tok)) => Some((tok, load_t5(f, ctx)?)),
            _ => {
                log::warn!("no T5-XXL text encoder (--t5xxl): the text states are zeros");
                None
            }
        };
        bar.tick();
        // TAEF1 (`--taesd`) decodes instead of the `ae`, or with `--taesd-preview-only` only
        // the previews.
        let (vae, preview_vae) = load_decoders(
            files,
            ctx,
            LatentNorm::Scale {
                scale: VAE_SCALE,
                shift: VAE_SHIFT,
            },
            "FLUX needs its VAE (ae.safetensors): pass --vae, or --taesd with TAEF1",
        )?;
        bar.tick();

        let c = dit.model.config();
        if let Some((_, t5)) = &t5 {
            let have = t5.model.config().d_model;
            if have != c.text_dim {
                return Err(Error::Unsupported(format!(
                    "the T5 encoder gives {have}-wide states but the FLUX transformer reads {} \
                     (mismatched --t5xxl?)",
                    c.text_dim
                )));
            }
        }
        if let Some((_, clip)) = clip.as_ref().filter(|_| c.chroma.is_none()) {
            let have = clip.model.config().hidden;
            if have != c.pooled_dim {
                return Err(Error::Unsupported(format!(
                    "the CLIP encoder gives a {have}-wide pooled vector but the FLUX transformer \
                     reads {} (mismatched --clip_l?)",
                    c.pooled_dim
                )));
            }
        }
        // Latent channels from the output; FLUX Fill's input adds the masked image's latent
        // and the f × f pixel mask of each latent pixel, per 2×2 patch.
        let f = vae.scale_factor();
        let packed = c.out_channels;
        let fill = match c.in_channels {
            n if n == packed => false,
            n if n == 2 * packed + 4 * f * f => true,
            n => {
                return Err(Error::Unsupported(format!(
                    "a FLUX transformer with {n} input channels per token: neither plain \
                     ({packed}) nor FLUX Fill ({} with this VAE)",
                    2 * packed + 4 * f * f
                )))
            }
        };
        if packed % 4 != 0 {
            return Err(Error::Unsupported(format!(
                "the FLUX transformer gives {packed} channels per token, not 2x2 patches"
            )));
        }
        let shift = ctx.flow_shift.unwrap_or_else(|| flow_shift(c));
        let chroma = c
            .chroma
            .map(|_| super::chroma::text_settings(ctx.model_args));
        Ok(Self {
            clip,
            t5,
            schedule: ModelSchedule::FluxFlow { shift },
            prediction: ctx.prediction.unwrap_or(Prediction::FluxFlow),
            dit,
            vae,
            preview_vae,
            ref_index: RefIndex::Fixed,
            fill,
            chroma,
            batch: None,
        })
    }

    pub fn config(&self) -> &FluxConfig {
        self.dit.model.config()
    }

    /// Latent channels (packed output channels / 4).
    fn latent_channels(&self) -> usize {
        self.config().out_channels / 4
    }

    /// Whether this is FLUX Fill (inpainting: masked-image latent and mask channels in).
    pub fn is_fill(&self) -> bool {
        self.fill
    }

    /// FLUX Fill's extra input [w, h, C + f²]: the latent of the init image with the
    /// repainted pixels grey (zeros without one), then each latent pixel's f × f mask pixels
    /// (channel dx + f·dy).
    fn fill_channels(
        &self,
        mask: &InpaintMask,
        init: Option<&HostTensor>,
        tiling: Option<&TileSettings>,
    ) -> Result<HostTensor> {
        let f = self.vae.scale_factor();
        let (lw, lh) = (mask.latent.width(), mask.latent.height());
        let lc = self.latent_channels();
        let masked = match init {
            Some(x) => self
                .vae
                .encode_unit(&mask.masked_image(x), tiling, "masked image")?,
            None => HostTensor::zeros([lw, lh, lc, 1]),
        };
        let pw = mask.pixels.width();
        let mut data = masked.data;
        for dy in 0..f {
            for dx in 0..f {
                for y in 0..lh {
                    for x in 0..lw {
                        data.push(mask.pixels.data[(y * f + dy) * pw + x * f + dx]);
                    }
                }
            }
        }
        Ok(HostTensor::image(lw, lh, lc + f * f, data)?)
    }

    /// VAE factor × 2 (the 2×2 patches).
    pub fn size_multiple(&self) -> usize {
        self.vae.scale_factor() * 2
    }

    /// The T5 states and pooled CLIP vector of `prompt` (zeros for a missing encoder), and
    /// Chroma's DiT mask.
    pub fn condition(&self, prompt: &str) -> Result<FluxCondition> {
        let c = self.config();
        if let Some(chroma) = self.chroma {
            return self.chroma_condition(prompt, chroma);
        }
        let pooled = match &self.clip {
            Some((tok, model)) => {
                let chunks = tokenize_weighted(tok, prompt, tok.eos())?;
                let ids = &chunks[0].ids;
                let out = clip::encode(
                    &model.runner,
                    &model.model,
                    ids,
                    None,
                    &ClipOutputs {
                        hidden: None,
                        pooled: Some(PooledOutput {
                            position: clip::pooled_position(ids, tok.eos()),
                            project: false,
                        }),
                    },
                )?;
                out.pooled
                    .map(|p| p.data)
                    .ok_or_else(|| Error::Unsupported("CLIP returned no pooled output".into()))?
            }
            None => vec![0.0; c.pooled_dim],
        };
        let text = match &self.t5 {
            Some((tok, t5)) => {
                encode_t5_chunks(t5, &t5_weighted_chunks(tok, prompt, T5_CHUNK)?, false)?
            }
            None => HostTensor::zeros([c.text_dim, T5_CHUNK, 1, 1]),
        };
        Ok(FluxCondition {
            text,
            pooled,
            mask: None,
        })
    }

    /// Chroma: T5 over 512-token chunks; the mask keeps the prompt's tokens and the first
    /// `mask_pad` padding tokens (upstream); without T5, zeros and every key masked.
    fn chroma_condition(&self, prompt: &str, chroma: ChromaText) -> Result<FluxCondition> {
        let c = self.config();
        let Some((tok, t5)) = &self.t5 else {
            return Ok(FluxCondition {
                text: HostTensor::zeros([c.text_dim, 256, 1, 1]),
                pooled: Vec::new(),
                mask: chroma.use_dit_mask.then(|| vec![f32::NEG_INFINITY; 256]),
            });
        };
        let chunks = t5_weighted_chunks(tok, prompt, super::chroma::T5_CHUNK)?;
        let text = encode_t5_chunks(t5, &chunks, chroma.use_t5_mask)?;
        let mut mask: Vec<f32> = chunks
            .iter()
            .flat_map(|ch| {
                (0..ch.ids.len()).map(move |i| if i < ch.real { 0.0 } else { f32::NEG_INFINITY })
            })
            .collect();
        let mut left = chroma.mask_pad;
        for v in mask.iter_mut().filter(|v| v.is_infinite()) {
            if left == 0 {
                break;
            }
            *v = 0.0;
            left -= 1;
        }
        Ok(FluxCondition {
            text,
            pooled: Vec::new(),
            mask: chroma.use_dit_mask.then_some(mask),
        })
    }

    /// The transformer's velocity for latent `x` ([w, h, C]) under `cond`.
    fn velocity(
        &self,
        x: &[f32],
        lat: (usize, usize, usize),
        refs: &RefTokens,
        cond: &FluxCondition,
        step: StepInputs<'_>,
    ) -> Result<Vec<f32>> {
        let StepInputs {
            sigma,
            guidance,
            skip,
        } = step;
        let (w, h, ch) = lat;
        let latent = HostTensor::image(w, h, ch, x.to_vec())?;
        let mut tokens = packing::pack(&latent);
        if let Some(extra) = &refs.fill {
            // Fill: each token's features are [latent, masked latent, mask].
            let (a, b) = (4 * ch, extra.len() / (tokens.len() / (4 * ch)).max(1));
            tokens = tokens
                .chunks_exact(a)
                .zip(extra.chunks_exact(b))
                .flat_map(|(t, e)| t.iter().chain(e).copied())
                .collect();
        }
        let mut pos = packing::positions(w, h, 0.0, (0.0, 0.0));
        let targets = pos.len();
        tokens.extend_from_slice(&refs.tokens);
        pos.extend_from_slice(&refs.positions);
        let n = pos.len();
        let c = self.config();
        let model = &self.dit.model;
        let v = self.dit.runner.compute_one(|g| {
            let inputs = FluxInputs {
                img: g.input_f32("flux.img", [c.in_channels, n, 1, 1], tokens.clone()),
                img_pos: &pos,
                targets,
                txt: g.input_f32("flux.txt", cond.text.ne, cond.text.data.clone()),
                pooled: (!cond.pooled.is_empty()).then(|| {
                    g.input_f32("flux.pooled", [c.pooled_dim, 1, 1, 1], cond.pooled.clone())
                }),
                txt_mask: cond.mask.as_deref(),
                timesteps: &[sigma],
                guidance: &[guidance],
                skip_layers: skip,
            };
            model.forward(g, &inputs)
        })?;
        Ok(packing::unpack(&v.data, w, h, ch).data)
    }

    /// Kontext: the references' tokens and positions, appended after the target's.
    fn ref_tokens(
        &self,
        refs: &[HostTensor],
        mode: RefIndex,
        fill: Option<&HostTensor>,
    ) -> RefTokens {
        let sizes: Vec<(usize, usize)> = refs.iter().map(|r| (r.width(), r.height())).collect();
        RefTokens {
            tokens: refs.iter().flat_map(packing::pack).collect(),
            positions: packing::ref_positions(&sizes, mode),
            fill: fill.map(packing::pack),
        }
    }

    /// A Kontext reference as upstream prepares it: resized (nearest) to about the output's
    /// area at its own aspect ratio, sides rounded to 16 pixels (`resize_before_vae`, the
    /// default), and encoded.
    fn encode_reference(
        &self,
        img: &Image,
        out_area: u64,
        args: &RefImageArgs,
        tiling: Option<&TileSettings>,
    ) -> Result<HostTensor> {
        let (rw, rh) = (img.width as u64, img.height as u64);
        let x = HostTensor::from_u8_interleaved(
            rw as usize,
            rh as usize,
            img.channels.count(),
            3,
            &img.data,
        );
        let m = self.size_multiple();
        let (w, h) = if args.resize_before_vae {
            let area = args.target_area(out_area).min(1024 * 1024);
            let vw = ((area * rw / rh) as f64).sqrt();
            let vh = vw * rh as f64 / rw as f64;
            let round = |v: f64| ((v / REF_MULTIPLE).round() * REF_MULTIPLE) as usize;
            (round(vw).max(m), round(vh).max(m))
        } else {
            ((rw as usize / m).max(1) * m, (rh as usize / m).max(1) * m)
        };
        let x = resize(&x, w, h, Resample::Nearest);
        log::debug!("flux: reference {rw}x{rh} -> {w}x{h}");
        self.vae.encode_unit(&x, tiling, "reference image")
    }

    /// Conditioning and sampling; returns the final sampler latent [w, h, C].
    pub fn sample(&self, req: FluxRequest<'_>) -> Result<HostTensor> {
        crate::pipeline::check_size(req.width, req.height, self.size_multiple())?;
        let f = self.vae.scale_factor();
        if self.fill {
            let want = [
                req.width / f,
                req.height / f,
                self.latent_channels() + f * f,
                1,
            ];
            if req.fill.map(|t| t.ne) != Some(want) || !req.refs.is_empty() {
                return Err(Error::Unsupported(
                    "FLUX Fill needs its mask channels at the output size and takes no -r \
                     references"
                        .into(),
                ));
            }
        }
        let t0 = Instant::now();
        let cond = self.condition(req.prompt)?;
        let uncond = if req.guidance.needs_uncond() {
            Some(self.condition(req.negative_prompt)?)
        } else {
            None
        };
        let condition_secs = t0.elapsed().as_secs_f64();
        let (lw, lh, lc) = (req.width / f, req.height / f, self.latent_channels());
        // sd-cli's `flux` schedule reads the latent pixel count (not the packed tokens).
        let mut plan = req.plan.clone();
        plan.schedule_opts.image_seq_len = (lw * lh) as u32;
        let t1 = Instant::now();
        let model = FluxModel {
            pipe: self,
            cond: &cond,
            uncond: uncond.as_ref(),
            lat: (lw, lh, lc),
            refs: self.ref_tokens(req.refs, req.ref_index, req.fill),
        };
        let job = SampleJob {
            plan: &plan,
            guidance: req.guidance,
            noise_rng: req.noise_rng,
            sampler_rng: req.sampler_rng,
            init: req.init,
            preview: req
                .preview
                .map(|p| p.with_decoders(None, &self.vae, self.preview_vae.as_ref())),
            mask: req.mask,
        };
        if let Some(p) = &job.preview {
            p.check("FLUX");
        }
        let (latent, steps) = denoise(model, self.prediction, &self.schedule, job, (lw, lh, lc))?;
        log::debug!(
            "flux: condition {condition_secs:.2}s, sampling {:.2}s ({steps} steps); transformer weights {:.1} MiB + {:.1} MiB compute",
            t1.elapsed().as_secs_f64(),
            self.dit.runner.weights().map_or(0, |w| w.bytes()) as f64 / 1048576.0,
            self.dit.runner.last_compute_bytes() as f64 / 1048576.0,
        );
        Ok(HostTensor::image(lw, lh, lc, latent)?)
    }

    /// Decodes a sampler latent to an image in [0, 1].
    pub fn decode(&self, x: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        let t = Instant::now();
        let image = self.vae.decode(x, tiling)?;
        log::debug!("flux: decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(image)
    }

    pub fn schedule(&self) -> &ModelSchedule {
        &self.schedule
    }
}

/// Reference tokens [64 · n] and their positions; FLUX Fill's packed extra features.
#[derive(Default)]
struct RefTokens {
    tokens: Vec<f32>,
    positions: Vec<[f32; 3]>,
    fill: Option<Vec<f32>>,
}

/// Upstream rounds FLUX reference sizes to 16 pixels.
const REF_MULTIPLE: f64 = 16.0;

/// One call's step values: σ, the distilled guidance, the blocks to leave out.
#[derive(Clone, Copy)]
struct StepInputs<'a> {
    sigma: f32,
    guidance: f32,
    skip: &'a [usize],
}

/// The transformer as the guided denoiser's model (cond and uncond as separate calls: their
/// T5 lengths may differ).
struct FluxModel<'a> {
    pipe: &'a FluxPipeline,
    cond: &'a FluxCondition,
    uncond: Option<&'a FluxCondition>,
    lat: (usize, usize, usize),
    refs: RefTokens,
}

impl GuidedModel for FluxModel<'_> {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        Predictions::one_call_each(&call, self.cond, self.uncond, |c, skip| {
            let step = StepInputs {
                sigma: call.sigma,
                guidance: call.distilled_guidance,
                skip,
            };
            self.pipe
                .velocity(call.x, self.lat, &self.refs, c, step)
                .map_err(|e| format!("{e:#}"))
        })
    }

    /// Upstream's FLUX takes `--skip-layers` too (double blocks first, then single ones).
    fn can_skip_layers(&self) -> bool {
        true
    }
}

impl Generator for FluxPipeline {
    fn size_rule(&self) -> SizeRule {
        SizeRule {
            multiple: self.size_multiple() as u32,
            round_up: true,
            refs_set_size: false,
        }
    }

    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()> {
        let (w, h) = (batch.width, batch.height);
        if self.fill && batch.hires {
            return Err(Error::Unsupported(
                "--hires does not work with FLUX Fill (its mask channels are at the first \
                 pass's size)"
                    .into(),
            ));
        }
        let refs = batch
            .refs
            .iter()
            .map(|r| self.encode_reference(r, (w * h) as u64, batch.ref_args, batch.tiling))
            .collect::<Result<Vec<_>>>()?;
        self.ref_index = match batch.ref_args.ref_index_mode {
            RefIndexMode::Fixed => RefIndex::Fixed,
            RefIndexMode::Increase => RefIndex::Increase,
            RefIndexMode::Decrease => RefIndex::Decrease,
        };
        let factor = self.vae.scale_factor();
        let init_pixels = batch.init.map(|img| self.vae.init_pixels(img, w, h));
        let init = init_pixels
            .as_ref()
            .map(|x| self.vae.encode_unit(x, batch.tiling, "init image"))
            .transpose()?;
        let mask = batch.mask.map(|m| InpaintMask::from_image(m, w, h, factor));
        let fill = if self.fill {
            if init.is_none() || mask.is_none() {
                log::warn!("FLUX Fill wants both --init-img and --mask");
            }
            let full = mask
                .clone()
                .unwrap_or_else(|| InpaintMask::full(w, h, factor));
            Some(self.fill_channels(&full, init_pixels.as_ref(), batch.tiling)?)
        } else {
            None
        };
        self.batch = Some(Prepared {
            width: w,
            height: h,
            init,
            mask,
            extra: (refs, fill),
        });
        Ok(())
    }

    fn generate(&mut self, mut job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let hires = job.hires.take();
        // Fill blends with the mask widened by a latent pixel (upstream's inpainting rule).
        let dilated = match (&batch.mask, self.fill) {
            (Some(m), true) => Some(m.dilated_latent()),
            _ => None,
        };
        let x = self.sample(FluxRequest {
            prompt: job.prompt,
            negative_prompt: job.negative_prompt,
            width: batch.width,
            height: batch.height,
            guidance: job.guidance,
            plan: job.plan,
            noise_rng: job.noise_rng,
            sampler_rng: job.sampler_rng,
            init: batch.init.as_ref().map(|z| (z, job.strength)),
            preview: ImageJob::preview_request(job.preview.as_deref_mut(), job.tiling),
            mask: dilated.as_ref().or(batch.denoise_mask()),
            refs: &batch.extra.0,
            ref_index: self.ref_index,
            fill: batch.extra.1.as_ref(),
        })?;
        let x = match hires {
            Some(h) => second_pass(&self.vae, &x, h, job.tiling, batch.mask.as_ref(), |p| {
                self.sample(FluxRequest {
                    prompt: job.prompt,
                    negative_prompt: job.negative_prompt,
                    width: p.width,
                    height: p.height,
                    guidance: job.guidance,
                    plan: p.plan,
                    noise_rng: p.noise_rng,
                    sampler_rng: p.sampler_rng,
                    init: Some((p.init, p.strength)),
                    preview: ImageJob::preview_request(job.preview.as_deref_mut(), job.tiling),
                    mask: p.mask,
                    refs: &batch.extra.0,
                    ref_index: self.ref_index,
                    fill: None,
                })
            })?,
            None => x,
        };
        self.decode(&x, job.tiling)
    }
}
