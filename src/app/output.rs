//! Writing one finished image with its generation metadata.

use std::path::Path;
use std::time::Instant;

use super::RunConfig;
use crate::error::{Error, Result};
use crate::image_io::audio::Audio;
use crate::image_io::video::{self, video_output_path, VideoFormat};
use crate::image_io::{
    base_name, write_generation_image, Channels, GenerationParams, HiresUse, Image, LoraUse,
    VideoUse,
};
use crate::sampling::{Guidance, SamplingPlan};
use crate::tensor::HostTensor;

/// What every image of a `--batch-count` run shares, for its metadata.
pub(super) struct BatchInfo<'a> {
    pub width: u32,
    pub height: u32,
    pub plan: &'a SamplingPlan,
    pub guidance: Guidance,
    /// File names of the text encoders given (the family's metadata slots).
    pub text_encoders: Vec<String>,
    /// `--strength` when an init image was used.
    pub strength: Option<f32>,
    /// (name, weight, short hash) of each LoRA.
    pub loras: Vec<(String, f32, String)>,
    /// The hires fix, when it runs.
    pub hires: Option<HiresUse>,
    /// Settings only this model or run reads (VACE strength, the MoE expert's).
    pub settings: Vec<(String, String)>,
}

fn file_name(p: &Option<std::path::PathBuf>) -> Option<String> {
    p.as_deref().map(|p: &Path| base_name(p))
}

fn to_png_image(img: &HostTensor) -> Result<Image> {
    let channels = if img.channels() == 4 {
        Channels::Rgba
    } else {
        Channels::Rgb
    };
    Ok(Image::new(
        img.width() as u32,
        img.height() as u32,
        channels,
        img.to_u8_interleaved(),
    )?)
}

/// Creates the output's missing parent directories when the checks found some (upstream
/// creates them too).
pub(super) fn create_parent(cfg: &RunConfig, path: &Path) -> Result<()> {
    if cfg.output.create_parent_dirs {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| Error::Model {
                path: parent.to_path_buf(),
                reason: format!("cannot create the output directory: {e}"),
            })?;
        }
    }
    Ok(())
}

/// Writes image `index` (seed `seed`) of the batch to its output path, with metadata unless
/// disabled.
pub(super) fn write(
    cfg: &RunConfig,
    batch: &BatchInfo<'_>,
    index: u32,
    seed: i64,
    image: &HostTensor,
    started: Instant,
) -> Result<()> {
    let path = cfg.output_path_for(index);
    create_parent(cfg, &path)?;
    let params = params(cfg, batch, index, seed);
    write_generation_image(&path, &to_png_image(image)?, params.as_ref())?;
    log::info!(
        "saved {} ({:.1}s)",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One generated video: its frames [W, H, C, F] in [0, 1], rate and soundtrack.
pub(super) struct VideoOut<'a> {
    pub frames: &'a HostTensor,
    pub fps: u32,
    pub audio: Option<&'a Audio>,
}

/// Writes video `index` as upstream does: a `%d` pattern gives one image per frame numbered
/// from `--output-begin-idx`; `.avi`, `.webm` and `.webp` are single files; any other
/// extension becomes `.avi`. The soundtrack goes into AVI and WebM files, beside the others.
pub(super) fn write_video(
    cfg: &RunConfig,
    batch: &BatchInfo<'_>,
    index: u32,
    seed: i64,
    video: VideoOut<'_>,
    started: Instant,
) -> Result<()> {
    let VideoOut { frames, fps, audio } = video;
    let [w, h, c, n] = frames.ne;
    let images = (0..n)
        .map(|f| {
            let one = HostTensor {
                ne: [w, h, c, 1],
                data: frames.data[f * w * h * c..(f + 1) * w * h * c].to_vec(),
            };
            to_png_image(&one)
        })
        .collect::<Result<Vec<_>>>()?;
    let raw = std::path::PathBuf::from(&cfg.output.pattern);
    // Patterns and .avi/.webm/.webp names as given (a video run writes one file); anything
    // else through the image naming rules, then upstream's `.avi` fallback.
    let path = if VideoFormat::of(&raw).is_some() {
        raw
    } else {
        video_output_path(&cfg.output_path_for(index))
    };
    create_parent(cfg, &path)?;
    let text = params(cfg, batch, index, seed).map(|mut p| {
        p.mode = "vid_gen".into();
        p.video = Some(VideoUse {
            frames: n as u32,
            fps,
        });
        p.to_a1111()
    });
    let first = cfg.output.begin_idx;
    let written =
        video::write_video_with_audio(&path, &images, fps, text.as_deref(), first, audio)?;
    log::info!(
        "saved {} ({n} frames, {:.1}s)",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    if let Some(a) = audio {
        let secs = a.duration();
        match written
            .iter()
            .find(|p| p.extension().is_some_and(|e| e == "wav"))
        {
            Some(wav) => log::info!("saved the soundtrack ({secs:.2}s) as {}", wav.display()),
            None => log::info!("the soundtrack ({secs:.2}s) is in {}", path.display()),
        }
    }
    Ok(())
}

/// The generation parameters written into an output, unless disabled.
fn params(
    cfg: &RunConfig,
    batch: &BatchInfo<'_>,
    index: u32,
    seed: i64,
) -> Option<GenerationParams> {
    let plan = batch.plan;
    cfg.output.embed_metadata.then(|| {
        let s = &cfg.sampling;
        let mut p = GenerationParams::new();
        p.prompt = cfg.prompt.clone();
        p.negative_prompt = cfg.negative_prompt.clone();
        p.steps = plan.steps as u32;
        p.cfg_scale = batch.guidance.scale;
        p.eta = Some(plan.eta());
        p.seed = seed;
        p.batch_index = index;
        p.width = batch.width;
        p.height = batch.height;
        p.sampler = plan.sampler.to_string();
        p.scheduler = plan
            .custom_sigmas
            .is_none()
            .then(|| plan.schedule.to_string());
        p.custom_sigmas = plan.custom_sigmas.clone().unwrap_or_default();
        p.rng = s.rng.to_string();
        p.sampler_rng = s.sampler_rng.map(|r| r.to_string());
        p.model = file_name(&cfg.models.model);
        p.diffusion_model = file_name(&cfg.models.diffusion_model);
        p.text_encoders = batch.text_encoders.clone();
        p.vae = file_name(&cfg.models.vae);
        p.extra_sample_args = s.extra_text.clone();
        p.model_args = cfg.model_args.to_string();
        p.strength = batch.strength;
        p.clip_skip = cfg.clip_skip;
        p.hires = batch.hires.clone();
        p.model_settings = batch.settings.clone();
        p.loras = batch
            .loras
            .iter()
            .map(|(name, weight, hash)| LoraUse {
                name: name.clone(),
                weight: *weight,
                hash: hash.clone(),
            })
            .collect();
        p
    })
}
