//! `-M img_gen`: open the diffusion model, find its family in the registry, open and load the
//! family's components, and generate the batch. Nothing here knows a family.

use std::time::Instant;

use super::output::{self, BatchInfo};
use super::preview::FilePreview;
use super::upscale::Upscaler;
use super::{HiresMethod, HiresSettings, RunConfig};
use crate::error::{Error, Result};
use crate::image_io::audio::{read_wav, Audio};
use crate::image_io::{base_name, cpp_float, read_frames_dir, read_image, HiresUse, Image};
use crate::pipeline::components::{
    ComponentFiles, ComponentId, ComponentStore, MetaSlot, ModelFlag, Needs,
};
use crate::pipeline::family::{
    BatchInputs, Family, Generator, HighNoiseJob, ImageJob, InputSummary, LoadContext, RefVideo,
};
use crate::pipeline::hires::{hires_plan, HiresJob, HiresUpscaler};
use crate::pipeline::preview::PreviewSink;
use crate::pipeline::registry;
use crate::runner::BackendPlan;
use crate::sampling::{Guidance, SamplingPlan};

pub fn run(cfg: &RunConfig) -> Result<()> {
    // Input images first: a bad file fails before gigabytes of weights load.
    let init = cfg.inputs.init.as_deref().map(read_image).transpose()?;
    let refs = cfg
        .inputs
        .refs
        .iter()
        .map(|p| read_image(p))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mask = cfg.inputs.mask.as_deref().map(read_image).transpose()?;
    let ref_audio = cfg
        .inputs
        .ref_audio
        .iter()
        .map(|p| read_wav(p))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let ref_videos = read_ref_videos(cfg)?;
    let end = cfg.inputs.end.as_deref().map(read_image).transpose()?;
    let control_frames = match &cfg.inputs.control_video {
        Some(dir) => {
            // Upstream reads at most --video-frames of them.
            let max = cfg.video.map_or(1, |v| v.frames as usize);
            let frames = read_frames_dir(dir, max)?;
            if frames.is_empty() {
                log::warn!(
                    "--control-video {}: no .png/.jpg/.jpeg/.bmp/.webp frames; the control \
                     video is grey",
                    dir.display()
                );
            }
            frames
        }
        None => Vec::new(),
    };
    if mask.is_some() && init.is_none() {
        log::warn!(
            "--mask without --init-img: outside the mask the picture is pulled toward an empty \
             latent (as upstream sd-cli does)"
        );
    }

    let t_load = Instant::now();
    let diffusion = open_diffusion(cfg)?;
    let family = registry::detect(&diffusion).ok_or_else(|| unrecognised(&diffusion))?;
    log::debug!("model family: {}", family.name());
    if cfg.sampling.flow_shift.is_some() && family.defaults().flow_shift.is_none() {
        log::warn!(
            "--flow-shift has no effect on {} (not a shifted flow model); ignored",
            family.name()
        );
    }
    if cfg.models.high_noise_diffusion_model.is_some()
        && !family
            .components()
            .iter()
            .any(|c| c.id == ComponentId::HighNoiseDiffusion)
    {
        return Err(Error::Unsupported(format!(
            "--high-noise-diffusion-model is Wan 2.2 A14B's high-noise expert; {} has none",
            family.name()
        )));
    }
    if end.is_some() && !family.makes_video() {
        return Err(Error::Unsupported(format!(
            "--end-img sets a video's last frame; {} makes images",
            family.name()
        )));
    }
    if (!ref_audio.is_empty() || !ref_videos.is_empty()) && family.id() != "minimax_h3" {
        return Err(Error::Unsupported(format!(
            "--ref-video and --ref-audio condition MiniMax-H3 (Ref2VA); {} takes neither",
            family.name()
        )));
    }
    if !control_frames.is_empty() && !family.makes_video() {
        log::warn!(
            "--control-video is read by Wan VACE models only; {} ignores it",
            family.name()
        );
    }
    if cfg.video.is_some() && !family.makes_video() {
        return Err(Error::Unsupported(format!(
            "{} makes images, not video: use -M img_gen (video needs a Wan model)",
            family.name()
        )));
    }
    family.check_inputs(&InputSummary {
        init_image: init.is_some(),
        references: refs.len(),
        ref_args: &cfg.inputs.ref_args,
    })?;
    let hires_encodes = cfg
        .hires
        .as_ref()
        .is_some_and(|h| !matches!(h.method, HiresMethod::Latent(_)));
    let needs = Needs {
        encoder: init.is_some()
            || end.is_some()
            || !refs.is_empty()
            || !ref_videos.is_empty()
            || hires_encodes,
        references: !refs.is_empty(),
        audio_references: !ref_audio.is_empty() || ref_videos.iter().any(|v| v.audio.is_some()),
    };
    let mut files = ComponentFiles::new(family.name()).with(ComponentId::Diffusion, diffusion);
    files.open_missing(family.components(), &cfg.models, needs)?;
    let loras = super::lora::prepare(cfg, family, &files)?;
    let upscaler = match cfg.models.upscale_model.as_deref() {
        Some(path) => Some(Upscaler::load(cfg, path)?),
        None => None,
    };
    let hires_model = match cfg.hires.as_ref().map(|h| (&h.method, h.tile_size)) {
        Some((HiresMethod::Model(path), tile)) => Some(Upscaler::load_with(cfg, path, 1, tile)?),
        _ => None,
    };
    let backends = BackendPlan::new(cfg.runtime.backends.clone(), cfg.runtime.threads as usize);
    let ctx = LoadContext {
        backends: &backends,
        memory: cfg.runtime.memory.clone(),
        wtype: cfg.weight_type,
        flash_attn: cfg.runtime.flash_attn,
        model_args: &cfg.model_args,
        needs,
        t5_tokenizer: cfg.models.t5xxl_tokenizer.as_deref(),
        prediction: cfg.prediction,
        clip_skip: cfg.clip_skip,
        embd_dir: cfg.models.embd_dir.as_deref(),
        lora: loras.set.clone(),
        taesd_preview_only: cfg.output.taesd_preview_only,
        flow_shift: cfg.sampling.flow_shift,
    };
    let high_noise_boundary = files
        .get(ComponentId::HighNoiseDiffusion)
        .map(|_| moe_boundary(cfg));
    let mut generator = family.load(&files, &ctx)?;
    drop(files);
    if let Some(set) = &loras.set {
        set.check_matched(family.name())?;
    }
    log::debug!("models loaded in {:.2}s", t_load.elapsed().as_secs_f64());

    let inputs = RunInputs {
        prompt: &loras.prompt,
        loras: super::lora::metadata(loras.set.as_deref())?,
        init: init.as_ref(),
        end: end.as_ref(),
        refs: &refs,
        ref_audio: &ref_audio,
        ref_videos: &ref_videos,
        mask: mask.as_ref(),
        control_frames: &control_frames,
        upscaler: upscaler.as_ref(),
        hires_model: hires_model.as_ref(),
        high_noise_boundary,
    };
    let result = run_batch(cfg, family, generator.as_mut(), &inputs);
    generator.finish();
    result
}

/// `--ref-video` folders (every frame, in file-name order) with their `--ref-video-audio`.
fn read_ref_videos(cfg: &RunConfig) -> Result<Vec<RefVideo>> {
    let inputs = &cfg.inputs;
    inputs
        .ref_videos
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let frames = read_frames_dir(dir, usize::MAX)?;
            if frames.is_empty() {
                return Err(Error::Flag {
                    flag: "--ref-video".into(),
                    reason: format!(
                        "{}: no .png/.jpg/.jpeg/.bmp/.webp frames in the folder",
                        dir.display()
                    ),
                });
            }
            let audio = inputs
                .ref_video_audio
                .get(i)
                .map(|p| read_wav(p))
                .transpose()?;
            Ok(RefVideo { frames, audio })
        })
        .collect()
}

/// The diffusion model's own store: `--diffusion-model`, else its part of `-m`.
fn open_diffusion(cfg: &RunConfig) -> Result<ComponentStore> {
    let id = ComponentId::Diffusion;
    let store = match (
        cfg.models.diffusion_model.as_deref(),
        cfg.models.model.as_deref(),
    ) {
        (Some(path), _) => ComponentStore::open(id, path, false)?,
        (None, Some(bundle)) => ComponentStore::open(id, bundle, true)?,
        (None, None) => {
            return Err(Error::Unsupported(
                "no diffusion model: give -m/--model or --diffusion-model".into(),
            ))
        }
    };
    Ok(store)
}

fn unrecognised(store: &ComponentStore) -> Error {
    let root = store.root(ComponentId::Diffusion);
    let hint = registry::what_it_is(&store.store, &root)
        .map(|what| format!("; '{}' looks like {what}", base_name(&store.path)))
        .unwrap_or_default();
    Error::Unsupported(format!(
        "could not recognise the diffusion model from its tensor names{hint}; supported \
         families: {}",
        registry::supported_names()
    ))
}

/// The output size: `-W`/`-H`, else the init image's (or, for families that say so, the
/// first reference's) size, else the family's default; then the loaded model's size rule.
fn output_size(
    cfg: &RunConfig,
    family: &dyn Family,
    generator: &dyn Generator,
    init: Option<&Image>,
    refs: &[Image],
) -> Result<(u32, u32)> {
    let rule = generator.size_rule();
    let defaults = family.defaults();
    let from_image = init.or(refs.first().filter(|_| rule.refs_set_size));
    let (w, h) = match (from_image, cfg.size_is_set()) {
        (Some(img), false) => (img.width, img.height),
        _ => (cfg.width_or(defaults.width), cfg.height_or(defaults.height)),
    };
    rule.apply(w, h)
}

/// What the batch reads besides the configuration.
struct RunInputs<'a> {
    /// `-p` without its LoRA tags.
    prompt: &'a str,
    /// (name, weight, hash) of each LoRA, for the metadata.
    loras: Vec<(String, f32, String)>,
    init: Option<&'a Image>,
    end: Option<&'a Image>,
    refs: &'a [Image],
    mask: Option<&'a Image>,
    /// `--control-video`'s frames.
    control_frames: &'a [Image],
    ref_audio: &'a [Audio],
    ref_videos: &'a [RefVideo],
    /// `--upscale-model`: applied to each image before it is written.
    upscaler: Option<&'a Upscaler>,
    /// The hires fix's model upscaler (`--hires-upscaler NAME`).
    hires_model: Option<&'a Upscaler>,
    /// With a high-noise expert loaded: the boundary of its steps.
    high_noise_boundary: Option<f32>,
}

/// The MoE boundary: `--moe-boundary` when given, else the `boundary_ratio` of a diffusers
/// Wan 2.2 pipeline folder given as `-m`, else the flag's default.
fn moe_boundary(cfg: &RunConfig) -> f32 {
    let from_folder = cfg
        .models
        .model
        .as_deref()
        .and_then(crate::pipeline::components::pipeline_moe_boundary);
    match from_folder {
        Some(b) if !cfg.high_noise.boundary_given => {
            log::info!("MoE boundary {b} (the pipeline folder's boundary_ratio)");
            b
        }
        _ => cfg.high_noise.boundary,
    }
}

/// The hires fix of a batch: its target size, second-pass plan and upscaler.
struct HiresBatch<'a> {
    width: usize,
    height: usize,
    plan: SamplingPlan,
    settings: &'a HiresSettings,
    upscaler: HiresUpscaler<'a>,
}

impl<'a> HiresBatch<'a> {
    fn new(
        cfg: &'a RunConfig,
        generator: &dyn Generator,
        base: (u32, u32),
        plan: &SamplingPlan,
        model: Option<&'a Upscaler>,
    ) -> Result<Option<Self>> {
        let Some(settings) = cfg.hires.as_ref() else {
            return Ok(None);
        };
        let (tw, th) = settings.target(base.0, base.1);
        let (tw, th) = generator
            .size_rule()
            .apply(tw, th)
            .map_err(|_| Error::Flag {
                flag: "--hires-width/--hires-height/--hires-scale".into(),
                reason: format!("a {tw}x{th} hires target is too small for this model"),
            })?;
        let upscaler = match &settings.method {
            HiresMethod::Latent(r) => HiresUpscaler::Latent(*r),
            HiresMethod::Image(r) => HiresUpscaler::Image(*r),
            HiresMethod::Model(path) => {
                HiresUpscaler::Model(model.ok_or_else(|| Error::Model {
                    path: path.clone(),
                    reason: "the hires upscaler model was not loaded".into(),
                })?)
            }
        };
        let plan = hires_plan(
            plan,
            settings.steps as usize,
            settings.strength,
            settings.sigmas.clone(),
        );
        log::info!(
            "hires fix: {}x{} -> {tw}x{th} with {}, {} scheduler steps at strength {}",
            base.0,
            base.1,
            settings.name,
            plan.steps,
            settings.strength
        );
        Ok(Some(Self {
            width: tw as usize,
            height: th as usize,
            plan,
            settings,
            upscaler,
        }))
    }

    /// The second pass of the image with `seed` (both RNGs restart from it, as upstream).
    fn job(&self, cfg: &RunConfig, seed: i64) -> HiresJob<'a> {
        HiresJob {
            width: self.width,
            height: self.height,
            upscaler: self.upscaler,
            plan: self.plan.clone(),
            strength: self.settings.strength,
            noise_rng: cfg.sampling.rng.create(seed as u64),
            sampler_rng: cfg.sampling.sampler_rng().create(seed as u64),
        }
    }

    fn metadata(&self) -> HiresUse {
        let s = self.settings;
        HiresUse {
            upscaler: s.name.clone(),
            scale: s.scale,
            width: s.width,
            height: s.height,
            steps: s.steps,
            strength: s.strength,
            sigmas: s.sigmas.clone().unwrap_or_default(),
        }
    }
}

/// Generates the batch: image i uses seed + i (upstream rule) with fresh noise and sampler
/// RNGs, and is written with its metadata as soon as it is done.
fn run_batch(
    cfg: &RunConfig,
    family: &dyn Family,
    generator: &mut dyn Generator,
    inputs: &RunInputs<'_>,
) -> Result<()> {
    let (init, refs) = (inputs.init, inputs.refs);
    let (width, height) = output_size(cfg, family, generator, init, refs)?;
    let defaults = family.defaults();
    let plan = cfg.plan(&defaults);
    let tiling = cfg.vae_tiling;
    let hires = HiresBatch::new(cfg, generator, (width, height), &plan, inputs.hires_model)?;
    generator.prepare(&BatchInputs {
        width: width as usize,
        height: height as usize,
        init,
        end: inputs.end,
        refs,
        ref_audio: inputs.ref_audio,
        ref_videos: inputs.ref_videos,
        mask: inputs.mask,
        ref_args: &cfg.inputs.ref_args,
        tiling: tiling.as_ref(),
        hires: hires.is_some(),
        video_frames: cfg.video.map(|v| v.frames as usize),
        control_frames: inputs.control_frames,
        vace_strength: cfg.inputs.vace_strength,
    })?;
    let info = BatchInfo {
        width,
        height,
        plan: &plan,
        guidance: cfg.guidance(&defaults),
        text_encoders: text_encoder_names(cfg, family),
        strength: init.is_some().then_some(cfg.strength),
        loras: inputs.loras.clone(),
        hires: hires.as_ref().map(HiresBatch::metadata),
        settings: run_settings(cfg, generator.settings(), inputs.high_noise_boundary),
    };
    let high_noise_plan = {
        let mut p = plan.clone();
        if let Some(s) = cfg.high_noise.sampler {
            p.sampler = s;
        }
        p
    };
    let high_noise = inputs.high_noise_boundary.map(|boundary| HighNoiseJob {
        plan: &high_noise_plan,
        guidance: Guidance {
            scale: cfg.high_noise.cfg_scale,
            img_scale: cfg.high_noise.cfg_scale,
            distilled: info.guidance.distilled,
        },
        boundary,
        steps: cfg.high_noise.steps,
    });
    let mut preview = cfg
        .output
        .preview
        .clone()
        .map(|p| FilePreview::new(p, plan.steps));
    for i in 0..cfg.batch_count {
        let seed = cfg.seed.wrapping_add(i as i64);
        let mut noise_rng = cfg.sampling.rng.create(seed as u64);
        let mut sampler_rng = cfg.sampling.sampler_rng().create(seed as u64);
        let t0 = Instant::now();
        let image = generator.generate(ImageJob {
            index: i,
            more_follow: i + 1 < cfg.batch_count,
            prompt: inputs.prompt,
            negative_prompt: &cfg.negative_prompt,
            guidance: info.guidance,
            plan: &plan,
            strength: cfg.strength,
            seed: seed as u64,
            noise_rng: noise_rng.as_mut(),
            sampler_rng: sampler_rng.as_mut(),
            tiling: tiling.as_ref(),
            preview: preview.as_mut().map(|p| p as &mut dyn PreviewSink),
            hires: hires.as_ref().map(|h| h.job(cfg, seed)),
            high_noise,
        })?;
        let audio = generator.take_audio();
        if let Some(video) = cfg.video.filter(|_| image.ne[3] > 1) {
            let fps = generator.fps(video.fps);
            let out = output::VideoOut {
                frames: &image,
                fps,
                audio: audio.as_ref(),
            };
            output::write_video(cfg, &info, i, seed, out, t0)?;
            continue;
        }
        let image = match inputs.upscaler {
            Some(u) => u.upscale_tensor(&image)?,
            None => image,
        };
        output::write(cfg, &info, i, seed, &image, t0)?;
    }
    Ok(())
}

/// File names of the text encoders given, in the order the family lists them.
fn text_encoder_names(cfg: &RunConfig, family: &dyn Family) -> Vec<String> {
    family
        .components()
        .iter()
        .filter(|c| c.metadata == Some(MetaSlot::TextEncoder))
        .filter_map(|c| {
            c.flags
                .iter()
                .filter(|f| **f != ModelFlag::Model)
                .find_map(|&f| cfg.models.get(f))
        })
        .map(base_name)
        .collect()
}

/// The metadata's model-specific settings: the model's own, then the MoE expert's.
fn run_settings(
    cfg: &RunConfig,
    model: Vec<(&'static str, String)>,
    high_noise_boundary: Option<f32>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = model.into_iter().map(|(k, v)| (k.into(), v)).collect();
    let Some(boundary) = high_noise_boundary else {
        return out;
    };
    let h = &cfg.high_noise;
    if let Some(p) = &cfg.models.high_noise_diffusion_model {
        out.push(("High noise model".into(), base_name(p)));
    }
    out.push(match h.steps {
        Some(n) => ("High noise steps".into(), n.to_string()),
        None => ("MoE boundary".into(), cpp_float(boundary)),
    });
    out.push(("High noise CFG scale".into(), cpp_float(h.cfg_scale)));
    if let Some(s) = h.sampler {
        out.push(("High noise sampler".into(), s.to_string()));
    }
    out
}
