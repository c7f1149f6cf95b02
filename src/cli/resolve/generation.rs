//! Prompts, size, seed, batch, strength and the input images.

use std::path::PathBuf;

use crate::app::{InputImages, Mode, UpscaleSettings, VideoSettings};
use crate::cli::args::Cli;
use crate::cli::checks::{image_side, random_seed, read_text};
use crate::cli::error::{check_finite, invalid, CliError};
use crate::pipeline::RefImageArgs;

pub(super) struct Generation {
    pub prompt: String,
    pub negative_prompt: String,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub seed: i64,
    pub seed_was_random: bool,
    pub batch_count: u32,
    pub clip_skip: Option<u32>,
    pub strength: f32,
    pub video: Option<VideoSettings>,
    pub inputs: InputImages,
    pub upscale: UpscaleSettings,
}

pub(super) fn resolve(cli: &Cli, warnings: &mut Vec<String>) -> Result<Generation, CliError> {
    let g = &cli.generation;
    let mode = cli.mode;
    let read = |file: &Option<PathBuf>, flag, text: &str| match file {
        Some(p) => read_text(flag, p),
        None => Ok(text.to_string()),
    };
    let prompt = read(&g.prompt_file, "--prompt-file", &g.prompt)?;
    let negative_prompt = read(
        &g.negative_prompt_file,
        "--negative-prompt-file",
        &g.negative_prompt,
    )?;
    let width = image_side("-W/--width", g.width)?;
    let height = image_side("-H/--height", g.height)?;
    if g.batch_count < 1 {
        return Err(invalid(
            "-b/--batch-count",
            g.batch_count,
            "must be at least 1",
        ));
    }
    let strength = check_finite("--strength", g.strength)?;
    if !(0.0..=1.0).contains(&strength) {
        return Err(invalid("--strength", strength, "must be in [0.0, 1.0]"));
    }
    let control_strength = check_finite("--control-strength", g.control_strength)?;
    let vace_strength = check_finite("--vace-strength", g.vace_strength)?;
    if g.qwen_image_layers < 0 {
        return Err(invalid(
            "--qwen-image-layers",
            g.qwen_image_layers,
            "must not be negative",
        ));
    }
    if mode == Mode::VidGen && g.video_frames <= 0 {
        return Err(invalid(
            "--video-frames",
            g.video_frames,
            "must be greater than 0",
        ));
    }
    if mode == Mode::VidGen && g.fps <= 0 {
        return Err(invalid("--fps", g.fps, "must be greater than 0"));
    }
    if g.ref_video_audio.len() > g.ref_video.len() {
        return Err(CliError::Conflict(
            "each --ref-video-audio needs a corresponding --ref-video".into(),
        ));
    }
    if mode != Mode::VidGen
        && (!g.ref_video.is_empty() || !g.ref_video_audio.is_empty() || !g.ref_audio.is_empty())
    {
        return Err(CliError::Conflict(
            "--ref-video, --ref-video-audio and --ref-audio require -M vid_gen".into(),
        ));
    }
    if g.upscale_repeats < 1 {
        return Err(invalid(
            "--upscale-repeats",
            g.upscale_repeats,
            "must be at least 1",
        ));
    }
    if g.upscale_tile_size < 1 {
        return Err(invalid(
            "--upscale-tile-size",
            g.upscale_tile_size,
            "must be at least 1",
        ));
    }
    let (seed, seed_was_random) = if g.seed < 0 {
        (random_seed(), true)
    } else {
        (g.seed, false)
    };
    let mut ref_args = RefImageArgs::default();
    if g.disable_auto_resize_ref_image {
        ref_args.resize_before_vae = false;
    }
    warnings.extend(ref_args.apply(&g.ref_image_args));
    let inputs = InputImages {
        init: g.init_img.clone(),
        end: g.end_img.clone(),
        mask: g.mask.clone(),
        control: g.control_image.clone(),
        control_video: g.control_video.clone(),
        vace_strength,
        refs: g.ref_image.clone(),
        ref_audio: g.ref_audio.clone(),
        ref_videos: g.ref_video.clone(),
        ref_video_audio: g.ref_video_audio.clone(),
        increase_ref_index: g.increase_ref_index,
        ref_args,
        control_strength,
    };
    Ok(Generation {
        prompt,
        negative_prompt,
        width,
        height,
        seed,
        seed_was_random,
        batch_count: g.batch_count as u32,
        clip_skip: (g.clip_skip > 0).then_some(g.clip_skip as u32),
        strength,
        video: (mode == Mode::VidGen).then_some(VideoSettings {
            frames: g.video_frames as u32,
            fps: g.fps as u32,
        }),
        inputs,
        upscale: UpscaleSettings {
            repeats: g.upscale_repeats as u32,
            tile_size: g.upscale_tile_size as u32,
        },
    })
}
