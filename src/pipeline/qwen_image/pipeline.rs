//! The Qwen Image (v1) pipeline: loading, conditioning, sampling, decoding.

use std::time::Instant;

use super::edit::{picture_blocks, EditRefs, Vision, EDIT_DROP_TOKENS, EDIT_SYSTEM, IMAGE_PAD};
use super::{
    DIFFUSION, DROP_TOKENS, FLOW_SHIFT, LLM, PROMPT_PREFIX, PROMPT_SUFFIX, VAE, VISION, ZERO_COND_T,
};
use crate::error::{Error, Result};
use crate::models::dit::flux::packing::{pack, unpack};
use crate::models::dit::qwen_image::{
    QwenImage, QwenImageConfig, QwenImageInputs, RefIndex, ZERO_COND_MARKER,
};
use crate::models::te::qwen3::{
    self, qwen3_heads, qwen3_hparams_or, Qwen3Config, Qwen3Source, Qwen3TextModel,
};
use crate::models::vae::qwen_image_2_1_vae::LatentStats;
use crate::models::vae::tiling::TileSettings;
use crate::models::vae::wan_vae::{WanVae, WanVaeConfig};
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::family::{BatchInputs, Generator, ImageJob, LoadContext, Prepared, SizeRule};
use crate::pipeline::mask::InpaintMask;
use crate::pipeline::memo::Memo;
use crate::pipeline::passes::{denoise_pass, sample_passes, PassRequest, PassStage};
use crate::pipeline::ref_args::RefIndexMode;
use crate::pipeline::text::{apply_token_weights, load_qwen_tokenizer_of, weighted_template_ids};
use crate::pipeline::vae::{LatentNorm, VaeStage};
use crate::progress::Progress;
use crate::runner::{Loaded, Runner, StoreSource};
use crate::sampling::{GuidedModel, ModelCall, ModelSchedule, Prediction, Predictions};
use crate::tensor::HostTensor;
use crate::tokenizers::BpeTokenizer;

/// Qwen2.5-VL's rope base (files without a config or GGUF metadata).
const QWEN25_ROPE_THETA: f32 = 1_000_000.0;

pub struct QwenImagePipeline {
    tokenizer: BpeTokenizer,
    te: Loaded<Qwen3TextModel>,
    dit: Loaded<QwenImage>,
    vae: VaeStage,
    schedule: ModelSchedule,
    prediction: Prediction,
    /// The vision tower (loaded when the run has references).
    vision: Option<Vision>,
    /// Edit 2511: reference tokens modulated at timestep 0.
    zero_cond_t: bool,
    /// Text states of the last prompts (cond and uncond repeat across a batch).
    captions: Memo<HostTensor>,
    /// The batch's size, init latent, mask, references and their rope numbering.
    batch: Option<Prepared<(Option<EditRefs>, RefIndex)>>,
}

impl QwenImagePipeline {
    pub fn load(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Self> {
        let dit_files = files.require(&DIFFUSION)?;
        let llm_files = files.require(&LLM)?;
        let vae_files = files.require(&VAE)?;
        let mut bar = Progress::new("loading model", 3);

        let json = dit_files.config();
        let axes = json
            .and_then(|c| c.get("axes_dims_rope")?.as_array().cloned())
            .map(|a| a.iter().filter_map(|v| v.as_u64()).collect::<Vec<_>>());
        let patch = json.and_then(|c| c.get("patch_size")?.as_u64());
        let root = dit_files.root(ComponentId::Diffusion);
        let marked = dit_files
            .store
            .with_prefix("")
            .any(|t| t.name.contains(ZERO_COND_MARKER));
        let zero_cond_t = ctx.model_args.get(&ZERO_COND_T) || marked;
        if zero_cond_t {
            log::info!("Qwen Image: reference tokens modulated at timestep 0 (Edit 2511)");
        }
        let src = StoreSource::new(&dit_files.store, &root);
        let opts = ctx.load_options(ComponentId::Diffusion, true)?;
        let dit = Runner::load("qwen_image", &src, opts, |wb| -> Result<QwenImage> {
            let mut config = QwenImageConfig::detect(wb)?;
            if let Some([f, h, w]) = axes.as_deref() {
                config = config.with_axes_dims([*f as usize, *h as usize, *w as usize])?;
            }
            if let Some(p) = patch {
                config = config.with_patch_size(p as usize)?;
            }
            log::debug!("qwen_image: {config:?}");
            Ok(QwenImage::new(wb, config)?)
        })?;
        bar.tick();

        let (theta, eps) = qwen3_hparams_or(&llm_files.store, QWEN25_ROPE_THETA);
        let heads = qwen3_heads(&llm_files.store);
        let src = Qwen3Source::new(&llm_files.store, ComponentId::Llm.prefix());
        let opts = ctx.load_options(ComponentId::Llm, true)?;
        let text_dim = dit.model.config().text_dim;
        let te = Runner::load("qwen2.5-vl", &src, opts, |wb| -> Result<Qwen3TextModel> {
            let config = Qwen3Config::detect_with_heads(wb, Some(theta), Some(eps), heads)?;
            if config.hidden != text_dim {
                return Err(Error::Unsupported(format!(
                    "the text encoder's hidden size {} does not match the transformer's text \
                     input {text_dim} (Qwen Image reads Qwen2.5-VL-7B)",
                    config.hidden
                )));
            }
            log::debug!("qwen2.5-vl: {config:?}");
            Ok(Qwen3TextModel::new(wb, config)?)
        })?;
        let tokenizer = load_qwen_tokenizer_of(llm_files)?;
        let vision = if ctx.needs.references {
            let vision_files = files.require(&VISION)?;
            let opts = ctx.load_options(ComponentId::LlmVision, false)?;
            let v = Vision::load(vision_files, opts)?;
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
        bar.tick();

        let stats_json = vae_files
            .config()
            .and_then(LatentStats::from_diffusers_config);
        let src = StoreSource::new(&vae_files.store, ComponentId::Vae.prefix());
        let opts = ctx.load_options(ComponentId::Vae, false)?;
        let need_encoder = ctx.needs.encoder;
        let latent_channels = dit.model.config().latent_channels();
        let mut stats = None;
        let vae = Runner::load("vae", &src, opts, |wb| -> Result<WanVae> {
            let mut config = WanVaeConfig::detect(wb)?;
            if !config.decoder {
                return Err(Error::Unsupported(
                    "the VAE file has no decoder weights".into(),
                ));
            }
            if need_encoder && !config.encoder {
                return Err(Error::Unsupported(
                    "--init-img needs a VAE with an encoder, but the VAE file has only a decoder"
                        .into(),
                ));
            }
            config.encoder = need_encoder;
            let s = match stats_json {
                Some(s) => s?,
                None => config.latent_stats.clone().ok_or_else(|| {
                    Error::Unsupported(format!(
                        "the VAE has a {}-channel latent but no latents_mean/latents_std \
                         (only the released 16-channel statistics are built in)",
                        config.z_dim
                    ))
                })?,
            };
            if s.channels() != config.z_dim || config.z_dim != latent_channels {
                return Err(Error::Unsupported(format!(
                    "latent channels disagree: VAE {}, statistics {}, transformer {latent_channels}",
                    config.z_dim,
                    s.channels(),
                )));
            }
            stats = Some(s);
            Ok(WanVae::new(wb, config)?)
        })?;
        let stats = stats.ok_or_else(|| Error::Unsupported("VAE latent statistics".into()))?;
        bar.tick();
        Ok(Self {
            tokenizer,
            te,
            dit,
            vae: VaeStage::new(vae, LatentNorm::Stats(stats)),
            schedule: ModelSchedule::Flow {
                shift: ctx.flow_shift.unwrap_or(FLOW_SHIFT),
            },
            prediction: ctx.prediction.unwrap_or(Prediction::Sd3Flow),
            vision,
            zero_cond_t,
            captions: Memo::new(2),
            batch: None,
        })
    }

    pub fn size_multiple(&self) -> usize {
        self.vae.scale_factor() * self.dit.model.config().patch_size
    }

    /// The prompt's text states [text_dim, L]: the templated prompt through every layer and
    /// the final norm, upstream's emphasis weights applied, the template's first
    /// [`DROP_TOKENS`] rows dropped. With references, the edit template with each picture's
    /// vision embeddings in its slots and [`EDIT_DROP_TOKENS`] rows dropped.
    pub fn encode_prompt(&self, prompt: &str, refs: Option<&EditRefs>) -> Result<HostTensor> {
        let Some(refs) = refs else {
            return self.captions.get_or_try(prompt, || -> Result<HostTensor> {
                let (ids, weights) =
                    weighted_template_ids(&self.tokenizer, PROMPT_PREFIX, prompt, PROMPT_SUFFIX)?;
                let mut states = qwen3::encode_normed(&self.te.runner, &self.te.model, &ids)?;
                apply_token_weights(&mut states.data, states.ne[0], &weights);
                drop_template(states, DROP_TOKENS)
            });
        };
        // References differ between batches only with the inputs: key on the prompt alone
        // within a batch (the memo is cleared with each new batch).
        self.captions.get_or_try(prompt, || -> Result<HostTensor> {
            let prefix = format!("{EDIT_SYSTEM}{}", picture_blocks(&refs.pads()));
            let (ids, weights) =
                weighted_template_ids(&self.tokenizer, &prefix, prompt, PROMPT_SUFFIX)?;
            let pad_id = self
                .tokenizer
                .token_to_id(IMAGE_PAD)
                .and_then(|i| i32::try_from(i).ok())
                .ok_or_else(|| {
                    Error::Unsupported("the Qwen tokenizer has no <|image_pad|> token".into())
                })?;
            let c = self.te.model.config();
            qwen3::check_ids(&ids, c.vocab)?;
            let input = refs.mm_input(ids, pad_id, c.hidden)?;
            let model = &self.te.model;
            let mut states = self
                .te
                .runner
                .compute_one(|g| Ok::<_, Error>(model.forward_sequential(g, &input, true)))?;
            apply_token_weights(&mut states.data, states.ne[0], &weights);
            drop_template(states, EDIT_DROP_TOKENS)
        })
    }

    fn velocity(
        &self,
        x: &[f32],
        lat: (usize, usize, usize),
        txt: &HostTensor,
        sigma: f32,
        refs: Option<(&EditRefs, RefIndex)>,
    ) -> Result<Vec<f32>> {
        let (w, h, ch) = lat;
        let c = self.dit.model.config();
        let mut tokens = pack(&HostTensor {
            ne: [w, h, ch, 1],
            data: x.to_vec(),
        });
        let mut grids = vec![(h / 2, w / 2)];
        let ref_index = refs.map_or(RefIndex::Increase, |r| r.1);
        for l in refs.map_or(&[][..], |r| &r.0.latents[..]) {
            tokens.extend(pack(l));
            grids.push((l.ne[1] / 2, l.ne[0] / 2));
        }
        let n = tokens.len() / c.in_channels;
        let model = &self.dit.model;
        let v = self.dit.runner.compute_one(|g| {
            let inputs = QwenImageInputs {
                img: g.input_f32("qwen_image.img", [c.in_channels, n, 1, 1], tokens.clone()),
                grids: &grids,
                txt: g.input_f32("qwen_image.txt", txt.ne, txt.data.clone()),
                timesteps: &[sigma],
                ref_index,
                zero_cond_t: self.zero_cond_t,
            };
            model.forward(g, &inputs)
        })?;
        Ok(unpack(&v.data, w, h, ch).data)
    }

    fn sample(
        &self,
        req: PassRequest<'_>,
        refs: Option<(&EditRefs, RefIndex)>,
    ) -> Result<HostTensor> {
        crate::pipeline::check_size(req.width, req.height, self.size_multiple())?;
        let t0 = Instant::now();
        let edit = refs.map(|r| r.0);
        let cond = self.encode_prompt(req.prompt, edit)?;
        let uncond = if req.guidance.needs_uncond() {
            Some(self.encode_prompt(req.negative_prompt, edit)?)
        } else {
            None
        };
        let condition_secs = t0.elapsed().as_secs_f64();
        let f = self.vae.scale_factor();
        let lc = self.dit.model.config().latent_channels();
        let (lw, lh) = (req.width / f, req.height / f);
        let t1 = Instant::now();
        let model = QwenImageModel {
            pipe: self,
            cond: &cond,
            uncond: uncond.as_ref(),
            lat: (lw, lh, lc),
            refs,
        };
        let stage = PassStage {
            vae: &self.vae,
            preview_vae: None,
            prediction: self.prediction,
            schedule: &self.schedule,
            family: "Qwen Image",
        };
        let (latent, steps) = denoise_pass(req, model, &stage, (lw, lh, lc))?;
        log::debug!(
            "qwen_image: condition {condition_secs:.2}s, sampling {:.2}s ({steps} steps)",
            t1.elapsed().as_secs_f64()
        );
        Ok(latent)
    }

    fn decode(&self, x: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        let t = Instant::now();
        let image = self.vae.decode(x, tiling)?;
        log::debug!("qwen_image: decode {:.2}s", t.elapsed().as_secs_f64());
        Ok(image)
    }
}

/// The states after the template's first `drop` rows.
fn drop_template(states: HostTensor, drop: usize) -> Result<HostTensor> {
    let [width, n, ..] = states.ne;
    if n <= drop {
        return Err(Error::Unsupported(format!(
            "the templated prompt has {n} tokens; Qwen Image drops the first {drop}"
        )));
    }
    Ok(HostTensor {
        ne: [width, n - drop, 1, 1],
        data: states.data[drop * width..].to_vec(),
    })
}

/// The transformer as the guided denoiser's model (cond and uncond as separate calls: their
/// text lengths differ).
struct QwenImageModel<'a> {
    pipe: &'a QwenImagePipeline,
    cond: &'a HostTensor,
    uncond: Option<&'a HostTensor>,
    lat: (usize, usize, usize),
    refs: Option<(&'a EditRefs, RefIndex)>,
}

impl GuidedModel for QwenImageModel<'_> {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
        Predictions::one_call_each(&call, self.cond, self.uncond, |txt, _| {
            self.pipe
                .velocity(call.x, self.lat, txt, call.sigma, self.refs)
                .map_err(|e| format!("{e:#}"))
        })
    }
}

impl Generator for QwenImagePipeline {
    fn size_rule(&self) -> SizeRule {
        SizeRule {
            multiple: self.size_multiple() as u32,
            round_up: true,
            refs_set_size: false,
        }
    }

    fn prepare(&mut self, batch: &BatchInputs<'_>) -> Result<()> {
        let (w, h) = (batch.width, batch.height);
        let refs = if batch.refs.is_empty() {
            None
        } else {
            let vision = self.vision.as_ref().ok_or_else(|| {
                Error::Unsupported("reference images need the Qwen2.5-VL vision tower".into())
            })?;
            let refs = EditRefs::prepare(
                batch.refs,
                (w, h),
                batch.ref_args,
                &self.vae,
                vision,
                batch.tiling,
            )?;
            Some(refs)
        };
        // Upstream's "qwen" preset numbers references 1, 2, ...; `decrease` is honoured.
        let ref_index = match batch.ref_args.ref_index_mode {
            RefIndexMode::Decrease => RefIndex::Decrease,
            _ => RefIndex::Increase,
        };
        let init = batch
            .init
            .map(|img| self.vae.encode_init(img, w, h, batch.tiling))
            .transpose()?;
        let factor = self.vae.scale_factor();
        self.captions.clear();
        self.batch = Some(Prepared {
            width: w,
            height: h,
            init,
            mask: batch.mask.map(|m| InpaintMask::from_image(m, w, h, factor)),
            extra: (refs, ref_index),
        });
        Ok(())
    }

    fn generate(&mut self, job: ImageJob<'_>) -> Result<HostTensor> {
        let batch = Prepared::get(&self.batch)?;
        let tiling = job.tiling;
        let refs = batch.extra.0.as_ref().map(|r| (r, batch.extra.1));
        let x = sample_passes(job, batch, &self.vae, |req| self.sample(req, refs))?;
        self.decode(&x, tiling)
    }
}
