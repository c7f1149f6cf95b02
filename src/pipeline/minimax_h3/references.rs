//! Ref2VA references as upstream sd-cli prepares them (`-r` images, `--ref-audio` clips):
//!
//! - an image keeps its aspect ratio, scaled down (never up) to at most the output's area,
//!   each side rounded to a multiple of 32 (at least 32), resized nearest-neighbour; it is
//!   VAE-encoded and noised like a keyframe, and its picture opens the prompt as
//!   `<Picture k>: ` + a vision block;
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
}
