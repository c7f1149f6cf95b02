//! Image-to-video conditioning of the Wan models whose transformer takes more input channels
//! than it predicts (Wan 2.1 I2V / FLF2V, Wan 2.2 I2V): the condition video and its mask
//! concatenated to the latent, and for models with an image branch the CLIP vision tokens.
//!
//! As upstream (`generate_video`) and diffusers (`WanImageToVideoPipeline.prepare_latents`):
//! the condition video is grey (0 in [−1, 1]) except frame 0 = `--init-img` and the last frame =
//! `--end-img`, each resized to the output size; the VAE encodes it to its posterior mean,
//! normalised with the latent statistics. The mask has 4 channels per latent frame (one per
//! video frame the latent frame stands for): all 4 are 1 on latent frame 0 when there is an
//! init image, and channel 3 of the last latent frame is 1 when there is an end image. The
//! transformer reads `[latent; mask; condition latent]` along the channels.
//!
//! CLIP tokens: the init image (as the VAE sees it) through `clip_vision_preprocess` and the
//! tower; upstream takes every layer without `post_layernorm` (diffusers the penultimate layer:
//! `--clip-skip 2`); FLF2V appends the end image's tokens; a missing image gives zeros.

use crate::error::{Error, Result};
use crate::image_io::Image;
use crate::models::te::clip_vision::{clip_vision_preprocess, encode_hidden, ClipVisionModel};
use crate::models::vae::wan_vae::LatentStats;
use crate::pipeline::vae::VaeStage;
use crate::runner::Loaded;
use crate::tensor::HostTensor;

/// Mask channels per latent frame (the VAE's temporal factor).
pub const MASK_CHANNELS: usize = 4;

/// What an image-to-video transformer reads beside the latent.
pub struct ImageCondition {
    /// [w, h, T, 4 + z] channel-major (torch's (C, T, H, W)): mask then condition latent.
    pub concat: Vec<f32>,
    /// CLIP tokens [clip width, n] for models with an image branch.
    pub clip: Option<HostTensor>,
}

/// The CLIP tower a Wan image branch reads, and how deep it runs.
pub struct ClipTower {
    pub tower: Loaded<ClipVisionModel>,
    pub layers: usize,
}

/// The frames [W, H, F, 3] in [−1, 1] of the condition video: grey, `init` first, `end` last.
fn condition_video(
    vae: &VaeStage,
    init: Option<&Image>,
    end: Option<&Image>,
    width: usize,
    height: usize,
    frames: usize,
) -> HostTensor {
    let plane = width * height;
    let mut data = vec![0f32; plane * frames * 3];
    let mut put = |img: &Image, frame: usize| {
        let px = vae.init_pixels(img, width, height); // [W, H, 3] planar in [0, 1]
        for c in 0..3 {
            let dst = &mut data[(c * frames + frame) * plane..(c * frames + frame + 1) * plane];
            for (d, s) in dst.iter_mut().zip(&px.data[c * plane..(c + 1) * plane]) {
                *d = s * 2.0 - 1.0;
            }
        }
    };
    if let Some(img) = init {
        put(img, 0);
    }
    if let Some(img) = end {
        put(img, frames - 1);
    }
    HostTensor {
        ne: [width, height, frames, 3],
        data,
    }
}

/// Encodes frames [W, H, F, 3] in [−1, 1] to the normalised posterior mean [w, h, T, z].
pub(super) fn encode_normalised(
    vae: &VaeStage,
    stats: &LatentStats,
    video: &HostTensor,
) -> Result<HostTensor> {
    let mut z = vae.encode_video(video)?;
    let [w, h, t, c] = z.ne;
    if c != stats.channels() {
        return Err(Error::Unsupported(format!(
            "the VAE encodes {c} latent channels, its statistics have {}",
            stats.channels()
        )));
    }
    for (ch, chunk) in z.data.chunks_mut(w * h * t).enumerate() {
        let (m, s) = (stats.mean()[ch], stats.std()[ch]);
        chunk.iter_mut().for_each(|v| *v = (*v - m) / s);
    }
    Ok(z)
}

/// Builds the concatenated condition: the mask then the normalised latent of the condition
/// video, for `frames` output frames (1 + 4k).
pub fn concat_condition(
    vae: &VaeStage,
    stats: &LatentStats,
    init: Option<&Image>,
    end: Option<&Image>,
    width: usize,
    height: usize,
    frames: usize,
) -> Result<Vec<f32>> {
    let video = condition_video(vae, init, end, width, height, frames);
    let mut z = encode_normalised(vae, stats, &video)?;
    let [w, h, t, _] = z.ne;
    let block = w * h * t;
    let plane = w * h;
    let mut mask = vec![0f32; MASK_CHANNELS * block];
    for k in 0..MASK_CHANNELS {
        let mut fill = |frame: usize| {
            let start = (k * t + frame) * plane;
            mask[start..start + plane].iter_mut().for_each(|v| *v = 1.0);
        };
        if init.is_some() {
            fill(0);
        }
        if end.is_some() && k == MASK_CHANNELS - 1 {
            fill(t - 1);
        }
    }
    mask.append(&mut z.data);
    Ok(mask)
}

/// The CLIP tokens of `images` (one per slot; `None` gives zeros, as upstream), appended along
/// the tokens: [clip width, tokens · slots].
pub fn clip_tokens(
    clip: &ClipTower,
    vae: &VaeStage,
    images: &[Option<&Image>],
    width: usize,
    height: usize,
) -> Result<HostTensor> {
    let model = &clip.tower.model;
    let c = model.config();
    let (hidden, tokens) = (c.hidden, c.tokens());
    let mut data = Vec::with_capacity(hidden * tokens * images.len());
    for img in images {
        match img {
            Some(img) => {
                let rgb = vae.init_pixels(img, width, height);
                let px = clip_vision_preprocess(&rgb, c.image_size)?;
                let out = encode_hidden(&clip.tower.runner, model, &px, clip.layers)?;
                data.extend_from_slice(&out.data);
            }
            None => data.extend(std::iter::repeat_n(0.0, hidden * tokens)),
        }
    }
    Ok(HostTensor {
        ne: [hidden, tokens * images.len(), 1, 1],
        data,
    })
}
