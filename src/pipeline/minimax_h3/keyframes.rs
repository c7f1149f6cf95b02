//! First/last-frame conditioning (I2VA with `--init-img`, FL2VA with `--end-img` too), as
//! upstream sd-cli does it:
//!
//! - each keyframe is centre-cropped to the output's aspect ratio and resized to the output
//!   size, VAE-encoded to its posterior mean (one latent frame), normalised with the latent
//!   statistics, and held just short of clean: `0.999·z + (1 − 0.999)·ε` with ε from a fresh
//!   Philox generator seeded with the image's seed (so both keyframes get the same ε, and the
//!   sampler's noise is untouched);
//! - its latent patches are extra transformer rows in front of the generated ones (they are
//!   never sampled, and their outputs are dropped); a "first" keyframe sits at the clock's
//!   start, a "last" one at the last frame's time (`layout`);
//! - the prompt opens with a `<Picture i>: ` label and a vision block per keyframe, whose
//!   `<|image_pad|>` rows take the Qwen3-VL vision tower's embeddings (deepstack included);
//!   the block's rows are tagged as video for the transformer's AdaLN. The negative prompt
//!   carries the same pictures.
//!
//! diffusers' `MiniMaxH3` FL2VA blocks differ: they sample the posterior under seed 42 and
//! round it to f16, draw ε from the request's generator before the start noise, stretch (not
//! crop) the first keyframe, and resize the vision input with the checkpoint's processor.

use super::conditions::Item;
use crate::image_io::{crop_to_aspect, resize_bilinear, resize_nearest, Image};
use crate::models::dit::minimax_h3::{layout, Keyframe};
use crate::models::te::qwen3_vl_vision::smart_resize;
use crate::rng::{PhiloxRng, Rng};
use crate::tensor::HostTensor;
use crate::tokenizers::BpeTokenizer;

/// The timestep keyframe latents are noised to (upstream `VISUAL_COND_TIMESTEP`).
pub const KEYFRAME_LEVEL: f32 = layout::KEYFRAME_T;
/// Upstream's vision-input pixel bounds for MiniMax-H3 pictures (Qwen2-VL's processor values,
/// not the Qwen3-VL checkpoint's).
pub const VISION_MIN_PIXELS: u64 = 3136;
pub const VISION_MAX_PIXELS: u64 = 12_845_056;

pub const VISION_START: &str = "<|vision_start|>";
pub const VISION_END: &str = "<|vision_end|>";
pub const IMAGE_PAD: &str = "<|image_pad|>";

/// One keyframe: the image at the output size and where it anchors.
pub struct KeyframeImage {
    pub image: Image,
    pub anchor: Keyframe,
}

/// The batch's keyframes in packed order (`--init-img` first, then `--end-img`), each
/// centre-cropped to the aspect of `width × height` and resized to it.
pub fn fit_keyframes(
    init: Option<&Image>,
    end: Option<&Image>,
    width: usize,
    height: usize,
) -> Vec<KeyframeImage> {
    [(init, Keyframe::First), (end, Keyframe::Last)]
        .into_iter()
        .filter_map(|(img, anchor)| {
            let img = img?.to_rgb();
            let cropped = crop_to_aspect(&img, width, height);
            Some(KeyframeImage {
                image: resize_bilinear(&cropped, width as u32, height as u32),
                anchor,
            })
        })
        .collect()
}

/// `0.999·z + (1 − 0.999)·ε`, ε a fresh Philox stream of `seed` over the latent in order.
pub fn visual_noise(z: &HostTensor, seed: u64) -> HostTensor {
    let eps = PhiloxRng::new(seed).randn(z.data.len());
    let keep = KEYFRAME_LEVEL;
    let mix = 1.0 - KEYFRAME_LEVEL;
    HostTensor {
        ne: z.ne,
        data: z
            .data
            .iter()
            .zip(&eps)
            .map(|(&x, &e)| x * keep + e * mix)
            .collect(),
    }
}

/// The vision tower's input for a keyframe: the image resized (nearest, as upstream) to the
/// multiple of `factor` within upstream's pixel bounds; RGB u8 interleaved and its size.
pub fn vision_input(img: &Image, factor: usize) -> crate::error::Result<(Vec<u8>, usize, usize)> {
    let (w, h) = (img.width as usize, img.height as usize);
    let (th, tw) = smart_resize(h, w, factor, VISION_MIN_PIXELS, VISION_MAX_PIXELS)
        .map_err(|e| crate::error::Error::Unsupported(format!("keyframe vision input: {e}")))?;
    let rgb = img.to_rgb();
    let resized = resize_nearest(&rgb, tw as u32, th as u32);
    Ok((resized.data, tw, th))
}

/// The prompt with its media, as upstream presents it: per item `<Picture i>: ` + a vision
/// block, `<Audio k>: `, or `<Video j>: ` + per block its `<t seconds>` label and a vision
/// block (each kind numbered on its own), then the prompt. Vision blocks are vision start +
/// `pads[b]` image pads + vision end, in order. The whole string is tokenized at once, as
/// upstream does (a label's trailing space joins the next word: `: a` is `:`, ` a`). Returns
/// the ids and each token's modality tag (video from a vision start through its end, text
/// elsewhere).
pub fn presentation(
    tokenizer: &BpeTokenizer,
    prompt: &str,
    items: &[Item],
    pads: &[usize],
) -> (Vec<u32>, Vec<u8>) {
    let mut pads = pads.iter();
    let mut block = || {
        let n = pads.next().copied().unwrap_or(0);
        format!("{VISION_START}{}{VISION_END}", IMAGE_PAD.repeat(n))
    };
    let mut s = String::new();
    let (mut picture, mut audio, mut video) = (0, 0, 0);
    for item in items {
        match item {
            Item::Picture => {
                picture += 1;
                s += &format!("<Picture {picture}>: {}", block());
            }
            Item::Audio => {
                audio += 1;
                s += &format!("<Audio {audio}>: ");
            }
            Item::Video(labels) => {
                video += 1;
                s += &format!("<Video {video}>: ");
                for label in labels {
                    s += label;
                    s += &block();
                }
            }
        }
    }
    s += prompt;
    let ids = tokenizer.encode(&s);
    let (start, end) = (
        tokenizer.token_to_id(VISION_START),
        tokenizer.token_to_id(VISION_END),
    );
    let mut inside = false;
    let tags = ids
        .iter()
        .map(|&id| {
            inside |= Some(id) == start;
            let tag = if inside {
                layout::VIDEO_TAG
            } else {
                layout::TEXT_TAG
            };
            if Some(id) == end {
                inside = false;
            }
            tag as u8
        })
        .collect();
    (ids, tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visual_noise_mixes_a_fresh_philox_stream() {
        let z = HostTensor {
            ne: [2, 2, 1, 1],
            data: vec![1.0, -1.0, 0.5, 0.0],
        };
        let a = visual_noise(&z, 42);
        let b = visual_noise(&z, 42);
        assert_eq!(a.data, b.data, "the same seed gives the same noise");
        let eps = PhiloxRng::new(42).randn(4);
        for ((got, x), e) in a.data.iter().zip(&z.data).zip(&eps) {
            assert_eq!(*got, x * 0.999 + e * (1.0 - 0.999f32));
        }
        assert_ne!(visual_noise(&z, 43).data, a.data);
    }
}
