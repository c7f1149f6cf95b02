//! The SD1/SD2/SDXL pipeline: loading the UNet, the text encoders and the VAE, and text-to-image
//! / img2img.
//!
//! Matches diffusers' `StableDiffusionPipeline` / `StableDiffusionXLPipeline` with an
//! Euler-family scheduler on the scaled-linear DDPM table (k-diffusion form as upstream: latent
//! `noise · σ_max`, model input `x / sqrt(σ² + 1)` at timestep t(σ)), with upstream's text
//! conditioning (see [`super::conditioner`]).

use std::time::Instant;

use super::conditioner::{Condition, SdConditioner, TextEncoder};
use super::embeddings::CustomEmbeddings;
use super::prediction::{self, CheckpointExtras, Source};
use super::variant::{self, SdVersion};
use super::{CLIP, CLIP_G, CLIP_L_XL, DIFFUSION};
use crate::error::{Error, Result};
use crate::models::te::clip::ClipActivation;
use crate::models::unet::{refiner_time_ids, sdxl_time_ids, UNet, UNetConfig, UNetHparams};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{BatchInputs, Generator, ImageJob, LoadContext, Prepared, SizeRule};
use crate::pipeline::hires::second_pass;
use crate::pipeline::mask::InpaintMask;
use crate::pipeline::preview::{PreviewRequest, SDXL_PROJECTION, SD_PROJECTION};
use crate::pipeline::text::load_clip;
use crate::pipeline::vae::{load_decoders, LatentNorm, VaeStage};
use crate::pipeline::{denoise, SampleJob};
use crate::progress::Progress;
use crate::runner::{Loaded, Runner, StoreSource};
use crate::sampling::{GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions};
use crate::tensor::HostTensor;
use crate::tokenizers::clip::ClipTokenizer;

/// diffusers' SDXL refiner aesthetic scores (prompt / negative prompt); upstream has no
/// refiner conditioning.
const REFINER_AESTHETIC: (f32, f32) = (6.0, 2.5);

pub struct SdPipeline {
    version: SdVersion,
    text: SdConditioner,
    unet: Loaded<UNet>,
    vae: VaeStage,
    /// TAESD for `--preview tae` with `--taesd-preview-only`.
    preview_vae: Option<VaeStage>,
    schedule: ModelSchedule,
    prediction: Prediction,
    /// The batch's size, init-image latent and mask (set by `prepare`); for inpainting
    /// UNets also the extra input channels (latent mask + masked image latent).
    batch: Option<Prepared<Option<HostTensor>>>,
}

/// The layers an encoder runs for `--clip-skip` (or the version's default). diffusers converts
/// SD2's OpenCLIP-H without its last layer (its pipeline reads the last hidden state), so a
/// transformers-layout SD2 encoder counts the skip as if that layer were still there: the
/// default (penultimate) is then its last layer, the same layer a single file runs to.
fn encoder_layers(
    total: usize,
    version: SdVersion,
    clip_skip: Option<u32>,
    openclip: bool,
) -> Result<usize> {
    let skip = clip_skip.unwrap_or_else(|| version.default_clip_skip());
    let layers = if version == SdVersion::Sd2 && !openclip {
        SdConditioner::layers_for(total + 1, skip).min(total)
    } else {
        SdConditioner::layers_for(total, skip)
    };
    if layers == 0 {
        return Err(Error::Flag {
            flag: "--clip-skip".into(),
            reason: format!("{skip} skips every layer of a {total}-layer text encoder"),
        });
    }
    Ok(layers)
}

impl SdPipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let unet_files = files.require(&DIFFUSION)?;
        let version = variant::detect(unet_files).ok_or_else(|| {
            Error::Unsupported("the diffusion model is not a Stable Diffusion UNet".into())
        })?;
        let extras = match unet_files.path.is_file() {
            true => prediction::checkpoint_extras(&unet_files.path)?,
            false => CheckpointExtras::default(),
        };
        let tokenizer = ClipTokenizer::new()?;
        let mut bar = Progress::new("loading model", 3);

        // Text encoders.
        let (first, big_g) = if version == SdVersion::Sdxl {
            let g_files = files.require(&CLIP_G)?;
            let (g, g_openclip) =
                load_clip(g_files, ComponentId::ClipG, ctx, ClipActivation::Gelu)?;
            let g_layers =
                encoder_layers(g.model.config().layers, version, ctx.clip_skip, g_openclip)?;
            let first = match files.get(CLIP_L_XL.id).filter(|s| !s.is_empty()) {
                Some(l_files) => {
                    let (l, l_openclip) =
                        load_clip(l_files, ComponentId::ClipL, ctx, ClipActivation::QuickGelu)?;
                    let layers = encoder_layers(
                        l.model.config().layers,
                        version,
                        ctx.clip_skip,
                        l_openclip,
                    )?;
                    Some(TextEncoder {
                        clip: l,
                        layers,
                        final_norm: false,
                    })
                }
                None => None,
            };
            let g = TextEncoder {
                clip: g,
                layers: g_layers,
                final_norm: false,
            };
            (first, Some(g))
        } else {
            let act = match version {
                SdVersion::Sd1 => ClipActivation::QuickGelu,
                _ => ClipActivation::Gelu,
            };
            let (clip, openclip) = load_clip(files.require(&CLIP)?, ComponentId::ClipL, ctx, act)?;
            let layers =
                encoder_layers(clip.model.config().layers, version, ctx.clip_skip, openclip)?;
            (
                Some(TextEncoder {
                    clip,
                    layers,
                    final_norm: true,
                }),
                None,
            )
        };
        let widths = [
            first.as_ref().map_or(0, |e| e.clip.model.config().hidden),
            big_g.as_ref().map_or(0, |e| e.clip.model.config().hidden),
        ];
        let embeddings = match ctx.embd_dir {
            Some(dir) => CustomEmbeddings::load(dir, widths)?,
            None => CustomEmbeddings::default(),
        };
        let text = SdConditioner::new(version, tokenizer, first, big_g, &embeddings)?;
        bar.tick();

        // UNet: heads from a diffusers config.json, else upstream's rules.
        let hparams = match unet_files.config() {
            Some(cfg) => UNetHparams::from_diffusers_config(cfg)?,
            None => UNetHparams::default(),
        };
        let root = unet_files.root(ComponentId::Diffusion);
        let src = StoreSource::new(&unet_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let unet = Runner::load("unet", &src, opts, |wb| -> Result<UNet> {
            let config = UNetConfig::detect(wb, &hparams)?;
            log::debug!("unet: {config:?}");
            Ok(UNet::new(wb, config)?)
        })?;
        let want = text.context_width();
        let have = unet.model.config().context_dim;
        if want != have {
            return Err(Error::Unsupported(format!(
                "the text encoders give {want}-wide context but the UNet cross-attends to {have} \
                 (mismatched text encoder and UNet files?)"
            )));
        }
        bar.tick();

        // TAESD decodes instead of the VAE, or with `--taesd-preview-only` only the previews.
        let (vae, preview_vae) = load_decoders(
            files,
            ctx,
            LatentNorm::Scale {
                scale: version.vae_scale(),
                shift: 0.0,
            },
            "Stable Diffusion needs a VAE: none was found in the model files (pass --vae, or \
             --taesd)",
        )?;
        bar.tick();

        let mut pipe = Self {
            version,
            text,
            unet,
            vae,
            preview_vae,
            schedule: ModelSchedule::sd_discrete(),
            prediction: Prediction::Eps,
            batch: None,
        };
        let (prediction, source) =
            match prediction::decide(ctx.prediction, version, &unet_files.path, &extras) {
                Some(p) => p,
                None => {
                    let v = prediction::sd2_probe_says_v(&pipe.sd2_probe()?);
                    let p = if v { Prediction::V } else { Prediction::Eps };
                    (p, Source::Sd2Probe)
                }
            };
        log::debug!("{version:?}: {prediction} prediction ({source:?})");
        pipe.prediction = prediction;
        pipe.schedule = prediction::schedule(prediction, &extras)?;
        Ok(pipe)
    }

    /// An inpainting UNet's extra input: the latent mask, then the latent of the init image
    /// with the repainted pixels grey (zeros without an init image), [w, h, 5].
    fn inpaint_channels(
        &self,
        mask: &InpaintMask,
        init: Option<&HostTensor>,
        tiling: Option<&TileSettings>,
    ) -> Result<HostTensor> {
        let lat = &mask.latent;
        let (lw, lh) = (lat.width(), lat.height());
        let lat_c = self.unet.model.config().out_channels;
        let masked = match init {
            Some(x) => self
                .vae
                .encode_unit(&mask.masked_image(x), tiling, "masked image")?,
            None => HostTensor::zeros([lw, lh, lat_c, 1]),
        };
        let data = [lat.data.as_slice(), masked.data.as_slice()].concat();
        let want = self.concat_channels();
        if 1 + masked.channels() != want {
            return Err(Error::Unsupported(format!(
                "the inpainting UNet takes {want} extra channels, the mask and VAE give {}",
                1 + masked.channels()
            )));
        }
        Ok(HostTensor::image(lw, lh, want, data)?)
    }

    pub fn version(&self) -> SdVersion {
        self.version
    }

    pub fn prediction(&self) -> Prediction {
        self.prediction
    }

    pub fn schedule(&self) -> &ModelSchedule {
        &self.schedule
    }

    pub fn conditioner(&self) -> &SdConditioner {
        &self.text
    }

    /// VAE downscale × the UNet's: image sizes must be multiples of this (64 for real models).
    pub fn size_multiple(&self) -> usize {
        self.vae.scale_factor() * self.unet.model.config().downscale_factor()
    }

    /// Upstream's SD2 v-prediction probe: the UNet on x = 0.5 ([8, 8, C, 1]), a two-token
    /// context of 0.5, t = 999.
    /// An inpainting UNet reads zeros in its extra channels.
    fn sd2_probe(&self) -> Result<Vec<f32>> {
        let c = self.unet.model.config();
        let lat_c = c.out_channels;
        let x = vec![0.5; 64 * lat_c];
        let concat = (self.concat_channels() > 0).then(|| vec![0.0; 64 * self.concat_channels()]);
        let ctx = HostTensor::new([c.context_dim, 2, 1, 1], vec![0.5; c.context_dim * 2])
            .ok_or_else(|| Error::Unsupported("probe shape".into()))?;
        self.predict(&x, (8, 8, lat_c), concat.as_deref(), 999.0, &[&ctx], None)
    }

    /// Input channels beyond the latent's: 5 for inpainting UNets (mask + masked image
    /// latent), else 0.
    pub fn concat_channels(&self) -> usize {
        let c = self.unet.model.config();
        c.in_channels.saturating_sub(c.out_channels)
    }

    /// Whether this is an inpainting UNet (9 input channels for a 4-channel latent).
    pub fn is_inpaint(&self) -> bool {
        self.concat_channels() > 0
    }

    /// The UNet's prediction for one latent `x` ([w, h, c]) with the inpainting channels
    /// `concat` after it, under each context (batched).
    fn predict(
        &self,
        x: &[f32],
        lat: (usize, usize, usize),
        concat: Option<&[f32]>,
        t: f32,
        contexts: &[&HostTensor],
        y: Option<&[f32]>,
    ) -> Result<Vec<f32>> {
        let batch = contexts.len();
        let (w, h, c) = lat;
        let x = match concat {
            Some(extra) => [x, extra].concat(),
            None => x.to_vec(),
        };
        let c = c + concat.map_or(0, |e| e.len() / (w * h).max(1));
        let x_ne = [w, h, c, batch];
        let (d, n) = (contexts[0].ne[0], contexts[0].ne[1]);
        let ctx_ne = [d, n, batch, 1];
        let mut ctx_data = Vec::with_capacity(d * n * batch);
        for ctx in contexts {
            ctx_data.extend_from_slice(&ctx.data);
        }
        let mut xin = Vec::with_capacity(x.len() * batch);
        for _ in 0..batch {
            xin.extend_from_slice(&x);
        }
        let unet = &self.unet.model;
        let y_ne = y.map(|y| [y.len() / batch, batch, 1, 1]);
        unet.check_inputs(x_ne, batch, ctx_ne, y_ne)?;
        let out = self.unet.runner.compute(|g| {
            let x = g.input_f32("unet.x", x_ne, xin.clone());
            let t = g.input_f32("unet.t", [batch, 1, 1, 1], vec![t; batch]);
            let context = g.input_f32("unet.context", ctx_ne, ctx_data.clone());
            let y = y
                .zip(y_ne)
                .map(|(y, ne)| g.input_f32("unet.y", ne, y.to_vec()));
            vec![unet.forward(g, x, t, context, y)]
        })?;
        Ok(out.into_iter().next().map(|t| t.data).unwrap_or_default())
    }

    /// SDXL's vector conditioning for a prompt's pooled embedding at `size` (w, h).
    fn adm(
        &self,
        pooled: Option<&[f32]>,
        size: (usize, usize),
        negative: bool,
    ) -> Result<Option<Vec<f32>>> {
        let c = self.unet.model.config();
        if c.adm_in_channels.is_none() {
            return Ok(None);
        }
        let pooled = pooled.ok_or_else(|| {
            Error::Unsupported("this UNet needs a pooled text embedding (SDXL)".into())
        })?;
        let (w, h) = (size.0 as f32, size.1 as f32);
        // The refiner (bigG alone) takes an aesthetic score instead of the target size.
        let time_ids: Vec<f32> = if self.text.has_clip_l() {
            sdxl_time_ids((h, w), (0.0, 0.0), (h, w)).to_vec()
        } else {
            let score = if negative {
                REFINER_AESTHETIC.1
            } else {
                REFINER_AESTHETIC.0
            };
            refiner_time_ids((h, w), (0.0, 0.0), score).to_vec()
        };
        Ok(Some(c.adm_vector(pooled, &time_ids)?))
    }

    /// Conditions of a request: the prompt's, and with CFG the negative prompt's (SDXL's
    /// empty negative prompt zeroes its context, as upstream).
    pub fn conditions(
        &self,
        prompt: &str,
        negative: &str,
        cfg: bool,
    ) -> Result<(Condition, Option<Condition>)> {
        let cond = self.text.encode(prompt, false)?;
        let uncond = if cfg {
            let zero = self.version == SdVersion::Sdxl
                && negative.is_empty()
                && self.prediction != Prediction::EdmV;
            Some(self.text.encode(negative, zero)?)
        } else {
            None
        };
        Ok((cond, uncond))
    }

    /// Runs conditioning and sampling; returns the final latent divided by the VAE scaling
    /// factor (what the VAE decodes), [w, h, C].
    pub fn sample(&self, req: SdRequest<'_>) -> Result<HostTensor> {
        crate::pipeline::check_size(req.width, req.height, self.size_multiple())?;
        let t0 = Instant::now();
        let (cond, uncond) =
            self.conditions(req.prompt, req.negative_prompt, req.guidance.needs_uncond())?;
        let size = req.condition_size.unwrap_or((req.width, req.height));
        let y_cond = self.adm(cond.pooled.as_deref(), size, false)?;
        let y_uncond = match &uncond {
            Some(u) => self.adm(u.pooled.as_deref(), size, true)?,
            None => None,
        };
        let condition_secs = t0.elapsed().as_secs_f64();

        let lat_c = self.unet.model.config().out_channels;
        let scale = self.vae.scale_factor();
        let (lw, lh) = (req.width / scale, req.height / scale);
        let concat = match (self.is_inpaint(), req.concat) {
            (false, _) => None,
            (true, Some(c)) if c.ne == [lw, lh, self.concat_channels(), 1] => Some(&c.data[..]),
            (true, _) => {
                return Err(Error::Unsupported(format!(
                    "an inpainting UNet needs its {} mask channels at {lw}x{lh}",
                    self.concat_channels()
                )))
            }
        };
        let t1 = Instant::now();
        let model = UNetModel {
            pipe: self,
            cond: (&cond.context, y_cond.as_deref()),
            uncond: uncond.as_ref().map(|u| (&u.context, y_uncond.as_deref())),
            lat: (lw, lh, lat_c),
            concat,
        };
        let job = SampleJob {
            plan: req.plan,
            guidance: req.guidance,
            noise_rng: req.noise_rng,
            sampler_rng: req.sampler_rng,
            init: req.init,
            preview: req.preview.map(|p| {
                let projection = if self.version == SdVersion::Sdxl {
                    SDXL_PROJECTION
                } else {
                    SD_PROJECTION
                };
                p.with_decoders(Some(projection), &self.vae, self.preview_vae.as_ref())
            }),
            mask: req.mask,
        };
        let (latent, steps) =
            denoise(model, self.prediction, &self.schedule, job, (lw, lh, lat_c))?;
        let mib = |b: usize| b as f64 / 1048576.0;
        let unet = &self.unet.runner;
        log::debug!(
            "{:?}: condition {:.2}s, sampling {:.2}s ({steps} steps); memory: UNet weights {:.1} MiB + {:.1} MiB compute",
            self.version,
            condition_secs,
            t1.elapsed().as_secs_f64(),
            mib(unet.weights().map_or(0, |w| w.bytes())),
            mib(unet.last_compute_bytes()),
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

/// One image request.
pub struct SdRequest<'a> {
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub width: usize,
    pub height: usize,
    pub guidance: crate::sampling::Guidance,
    pub plan: &'a crate::sampling::SamplingPlan,
    pub noise_rng: &'a mut dyn crate::rng::Rng,
    pub sampler_rng: &'a mut dyn crate::rng::Rng,
    /// img2img: the encoded init image (scaled latent, [w, h, C]) and `--strength`.
    pub init: Option<(&'a HostTensor, f32)>,
    /// `--preview`.
    pub preview: Option<PreviewRequest<'a>>,
    /// `--mask`: the latent mask each step's denoised estimate is blended with.
    pub mask: Option<&'a HostTensor>,
    /// Inpainting UNets: the latent mask and the masked image's latent ([w, h, 5]).
    pub concat: Option<&'a HostTensor>,
    /// The size SDXL's conditioning names (the hires fix keeps the first pass's); `None`:
    /// `width × height`.
    pub condition_size: Option<(usize, usize)>,
}

/// The UNet as the guided denoiser's model: cond and uncond in one batch when their contexts
/// have the same length (one call each otherwise: a context cannot be padded).
struct UNetModel<'a> {
    pipe: &'a SdPipeline,
    cond: (&'a HostTensor, Option<&'a [f32]>),
    uncond: Option<(&'a HostTensor, Option<&'a [f32]>)>,
    lat: (usize, usize, usize),
    /// Inpainting UNets' extra input channels.
    concat: Option<&'a [f32]>,
}

impl GuidedModel for UNetModel<'_> {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        let run = |contexts: &[&HostTensor], y: Option<Vec<f32>>| {
            self.pipe
                .predict(
                    call.x,
                    self.lat,
                    self.concat,
                    call.t,
                    contexts,
                    y.as_deref(),
                )
                .map_err(|e| format!("{e:#}"))
        };
        let n = call.x.len();
        let (cond_ctx, cond_y) = self.cond;
        let uncond = self.uncond.filter(|_| call.needs.uncond);
        if call.needs.uncond && uncond.is_none() {
            return Err("the unconditional prediction was asked without a negative prompt".into());
        }
        let (cond, uncond) = match uncond {
            Some((u_ctx, u_y)) if u_ctx.ne[1] == cond_ctx.ne[1] => {
                let y = cond_y.zip(u_y).map(|(c, u)| [c, u].concat());
                let out = run(&[cond_ctx, u_ctx], y)?;
                if out.len() != 2 * n {
                    return Err(format!(
                        "the UNet returned {} values for 2 x {n}",
                        out.len()
                    ));
                }
                (out[..n].to_vec(), Some(out[n..].to_vec()))
            }
            Some((u_ctx, u_y)) => (
                run(&[cond_ctx], cond_y.map(<[f32]>::to_vec))?,
                Some(run(&[u_ctx], u_y.map(<[f32]>::to_vec))?),
            ),
            None => (run(&[cond_ctx], cond_y.map(<[f32]>::to_vec))?, None),
        };
        Ok(Predictions {
            cond,
            uncond,
            img_uncond: None,
            skip_cond: None,
        })
    }
}

impl Generator for SdPipeline {
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
                "Stable Diffusion does not take reference images (-r); use --init-img for img2img"
                    .into(),
            ));
        }
        if batch.hires && self.is_inpaint() {
            return Err(Error::Unsupported(
                "--hires does not work with inpainting UNets (their mask channels are at the \
                 first pass's size)"
                    .into(),
            ));
        }
        let (w, h) = (batch.width, batch.height);
        let factor = self.vae.scale_factor();
        let init_pixels = batch.init.map(|img| self.vae.init_pixels(img, w, h));
        let init = init_pixels
            .as_ref()
            .map(|x| self.vae.encode_unit(x, batch.tiling, "init image"))
            .transpose()?;
        let mask = batch.mask.map(|m| InpaintMask::from_image(m, w, h, factor));
        let concat = if self.is_inpaint() {
            if init.is_none() || mask.is_none() {
                log::warn!("an inpainting model wants both --init-img and --mask");
            }
            let full = mask
                .clone()
                .unwrap_or_else(|| InpaintMask::full(w, h, factor));
            Some(self.inpaint_channels(&full, init_pixels.as_ref(), batch.tiling)?)
        } else {
            None
        };
        self.batch = Some(Prepared {
            width: w,
            height: h,
            init,
            mask,
            extra: concat,
        });
        Ok(())
    }

    fn generate(&mut self, mut job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let hires = job.hires.take();
        // Inpainting UNets blend with the mask widened by a latent pixel (upstream).
        let dilated = match (&batch.mask, self.is_inpaint()) {
            (Some(m), true) => Some(m.dilated_latent()),
            _ => None,
        };
        let mask = dilated.as_ref().or(batch.denoise_mask());
        let z = self.sample(SdRequest {
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
            mask,
            concat: batch.extra.as_ref(),
            condition_size: None,
        })?;
        let z = match hires {
            Some(h) => {
                let x = self.vae.norm.from_vae(&z)?;
                second_pass(&self.vae, &x, h, job.tiling, batch.mask.as_ref(), |p| {
                    self.sample(SdRequest {
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
                        concat: None,
                        condition_size: Some((batch.width, batch.height)),
                    })
                })?
            }
            None => z,
        };
        let t = Instant::now();
        let image = self.decode(&z, job.tiling)?;
        log::debug!("decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(image)
    }
}
