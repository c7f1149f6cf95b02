//! Ref2VA references as upstream sd-cli prepares them (`-r` images, `--ref-audio` clips):
//!
//! - an image keeps its aspect ratio, scaled down (never up) to at most the output's area,
//!   each side rounded to a multiple of 32 (at least 32), resized nearest-neighbour; it is
//!   VAE-encoded and noised like a keyframe, and its picture opens the prompt as
//!   `<Picture k>: ` + a vision block;
//! - a video (a folder of frames, read at 24 fps) keeps its first min(count, frames)
//!   frames cut down to 17k + 5 (at least 5), at a 768-short-edge size capped at 768·1344
//!   pixels (or the frames' own size rounded to 32 when smaller), nearest-neighbour; it is
//!   VAE-encoded as a clip and noised like a keyframe; the prompt presents it as
//!   `<Video j>: ` and, for each pair of its frames sampled at 2 fps, a `<t seconds>` label
//!   and one vision block holding the pair (upstream uses `<|image_pad|>` pads there too); a
//!   paired soundtrack (`--ref-video-audio`) is packed and labelled just before it;
//! - a soundtrack is resampled linearly to the audio VAE's rate as two channels (mono
//!   doubled), clamped, zero-padded to whole 800-sample latents, encoded to the audio VAE's
//!   posterior mean and normalised; it enters clean (timestep 1) and the prompt names it with
//!   `<Audio k>: `.
//!
//! The blocks are packed images first, then soundtracks, each advancing the shared clock
//! (`layout`). diffusers' Ref2VA blocks differ: images at a 2048-pixel short edge with
//! Lanczos, references in request order, a sampled f16-rounded posterior, and soundtracks
//! cut to the generated duration.

use crate::error::{Error, Result};
use crate::image_io::audio::Audio;
use crate::image_io::{resize_nearest, Image};
use crate::models::vae::minimax_h3_audio_vae::MiniMaxH3AudioVae;
use crate::runner::Loaded;
use crate::tensor::HostTensor;

/// Reference sides are multiples of this (upstream's constant: the released VAE factor ×
/// patch, and the vision tower's patch × merge).
pub const REF_MULTIPLE: usize = 32;
/// Reference soundtracks are zero-padded to whole latents of this many samples (upstream's
/// constant, the released audio VAE's hop).
pub const AUDIO_PAD: usize = 800;

/// The size upstream encodes a reference image of `sw × sh` at for a `width × height`
/// output.
pub fn reference_size(sw: usize, sh: usize, width: usize, height: usize) -> (usize, usize) {
    let scale = ((width * height) as f64 / (sw * sh) as f64).sqrt().min(1.0);
    // `std::round` rounds halves away from zero, as `f64::round`.
    let side = |s: usize| {
        let v = (s as f64 * scale / REF_MULTIPLE as f64).round() as usize;
        (v * REF_MULTIPLE).max(REF_MULTIPLE)
    };
    (side(sw), side(sh))
}

/// The reference image at [`reference_size`], RGB, nearest-neighbour.
pub fn fit_reference(img: &Image, width: usize, height: usize) -> Image {
    let rgb = img.to_rgb();
    let (w, h) = reference_size(rgb.width as usize, rgb.height as usize, width, height);
    resize_nearest(&rgb, w as u32, h as u32)
}

/// The frame rate reference videos are read at (upstream's CLI).
pub const REF_VIDEO_FPS: usize = 24;
/// Presented frames are sampled every this many frames (2 fps).
const PRESENT_EVERY: usize = 12;

/// Reference video `index` (0-based) as upstream normalises it for a `frames`-frame output:
/// its first min(count, frames) frames cut down to 17k + 5, each resized to the size rule.
pub fn fit_reference_video(frames: &[Image], target: usize, index: usize) -> Result<Vec<Image>> {
    let count = frames.len();
    let mut n = count.min(target);
    if n < 5 {
        return Err(Error::Unsupported(format!(
            "--ref-video {}: {count} frames; a reference video needs at least 5",
            index + 1
        )));
    }
    while n % 17 != 5 {
        n -= 1;
    }
    let (sw, sh) = (frames[0].width as usize, frames[0].height as usize);
    let (w, h) = reference_video_size(sw, sh);
    Ok(frames[..n]
        .iter()
        .map(|f| resize_nearest(&f.to_rgb(), w as u32, h as u32))
        .collect())
}

/// Upstream's reference-video size for `sw × sh` frames: a 768 short edge at their aspect,
/// capped at 768·1344 pixels, sides rounded to 32; the frames' own size rounded to 32 when
/// they are smaller than that.
pub fn reference_video_size(sw: usize, sh: usize) -> (usize, usize) {
    let ratio = sw as f64 / sh as f64;
    let (mut nw, mut nh) = if ratio >= 1.0 {
        (768.0 * ratio, 768.0)
    } else {
        (768.0, 768.0 / ratio)
    };
    let cap = 768.0 * 1344.0;
    if nw * nh > cap {
        let scale = (cap / (nw * nh)).sqrt();
        nw *= scale;
        nh *= scale;
    }
    let side =
        |v: f64| ((v / REF_MULTIPLE as f64).round() as usize * REF_MULTIPLE).max(REF_MULTIPLE);
    let (w, h) = (side(nw), side(nh));
    if sw * sh < w * h {
        (side(sw as f64), side(sh as f64))
    } else {
        (w, h)
    }
}

/// The presented blocks of a normalised reference video: frames sampled at 2 fps, in pairs
/// (an odd last one pairs with itself), each with its `<t seconds>` label (the pair's mean
/// time, one decimal).
pub fn presentation_pairs(clip: &[Image]) -> Vec<(String, [Image; 2])> {
    let sampled: Vec<usize> = (0..clip.len()).step_by(PRESENT_EVERY).collect();
    sampled
        .chunks(2)
        .map(|pair| {
            let (a, b) = (pair[0], *pair.last().unwrap_or(&pair[0]));
            let t0 = a as f32 / REF_VIDEO_FPS as f32;
            let t1 = b as f32 / REF_VIDEO_FPS as f32;
            let label = format!("<{:.1} seconds>", (t0 + t1) * 0.5);
            (label, [clip[a].clone(), clip[b].clone()])
        })
        .collect()
}

/// Reference clip `index` (0-based) through the audio VAE's encoder: the normalised
/// posterior mean [T, C, 2].
pub fn encode_reference_audio(
    vae: &Loaded<MiniMaxH3AudioVae>,
    clip: &Audio,
    index: usize,
) -> Result<HostTensor> {
    if clip.is_empty() {
        return Err(Error::Unsupported(format!(
            "--ref-audio {}: the clip has no samples",
            index + 1
        )));
    }
    let mut stereo = clip.to_stereo(vae.model.sample_rate());
    for ch in &mut stereo.channels {
        let n = ch.len().div_ceil(AUDIO_PAD) * AUDIO_PAD;
        ch.resize(n, 0.0);
    }
    Ok(vae.model.encode_channels(&vae.runner, &stereo.channels)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_shrink_to_the_output_area_never_grow() {
        assert_eq!(reference_size(80, 80, 64, 64), (64, 64));
        // Smaller than the output: kept, sides rounded to 32.
        assert_eq!(reference_size(40, 100, 512, 512), (32, 96));
        // 1920x1080 for 864x480: scale 0.45 → 864x486 → 864x480.
        assert_eq!(reference_size(1920, 1080, 864, 480), (864, 480));
        assert_eq!(reference_size(10, 10, 64, 64), (32, 32));
    }

    #[test]
    fn reference_videos_follow_the_768_rule() {
        assert_eq!(reference_video_size(1920, 1080), (1344, 768));
        assert_eq!(reference_video_size(1080, 1920), (768, 1344));
        // Smaller than the nominal size: its own, rounded to 32.
        assert_eq!(reference_video_size(64, 64), (64, 64));
        assert_eq!(reference_video_size(70, 40), (64, 32));
    }

    #[test]
    fn pairs_are_labelled_with_their_mean_time() {
        let frame = Image {
            width: 1,
            height: 1,
            channels: crate::image_io::Channels::Rgb,
            data: vec![0; 3],
        };
        let clip = vec![frame; 39];
        let labels: Vec<String> = presentation_pairs(&clip).into_iter().map(|p| p.0).collect();
        // Sampled 0, 12, 24, 36: pairs (0, 12) and (24, 36): 0.25 s prints as 0.2.
        assert_eq!(labels, vec!["<0.2 seconds>", "<1.2 seconds>"]);
        let labels: Vec<String> = presentation_pairs(&clip[..22])
            .into_iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(labels, vec!["<0.2 seconds>"]);
        let labels: Vec<String> = presentation_pairs(&clip[..5])
            .into_iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(labels, vec!["<0.0 seconds>"]);
    }
}
