//! Qwen Image Edit (v1, 2509, 2511) as upstream sd-cli runs it: every `-r` image is VAE-encoded
//! into latent tokens that follow the target's, and read by the Qwen2.5-VL vision tower whose
//! embeddings fill the "Picture N:" slots of the edit template (upstream uses
//! `QwenImageEditPlusPipeline`'s template for all three; diffusers' v1 `QwenImageEditPipeline`
//! has its own).
//!
//! Sizes follow upstream, not diffusers: the VAE copy keeps the reference's aspect ratio at
//! min(1024², output area) pixels, sides rounded to 32 (nearest-neighbour resize); the vision
//! copy is the reference rounded to multiples of 28 and scaled into [384², 560²] pixels when
//! outside it, then resized (nearest) to cover that size and centre-cropped. The language
//! model numbers image tokens like text (0..n on every rope axis), where transformers gives
//! them 3-D grid positions.

use crate::error::{Error, Result};
use crate::image_io::Image;
use crate::models::te::qwen25_vl_vision::{
    encode_image as encode_vision, qwen25_vl_preprocess_config, qwen25_vl_vision_hparams,
    Qwen25VlVision, Qwen25VlVisionConfig, Qwen25VlVisionSource,
};
use crate::models::te::qwen3::{Qwen3MmInput, VisionEmbeds};
use crate::models::te::qwen3_vl_vision::VisionPreprocessConfig;
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentId, ComponentStore};
use crate::pipeline::ref_args::RefImageArgs;
use crate::pipeline::resample::{resize, Resample};
use crate::pipeline::vae::VaeStage;
use crate::progress::Progress;
use crate::runner::{LoadOptions, Loaded, Runner};
use crate::tensor::HostTensor;

/// Reference VAE sizes are multiples of this (upstream's factor for Qwen Image).
pub const REF_MULTIPLE: f64 = 32.0;
/// Largest reference area for the VAE copy unless `vae_input_max_pixels` says otherwise.
pub const REF_MAX_AREA: u64 = 1024 * 1024;
/// Upstream's vision-copy area bounds (sides², area mode).
pub const VISION_MIN_SIDE: usize = 384;
pub const VISION_MAX_SIDE: usize = 560;
/// The edit template before the pictures, and each picture's block.
pub const EDIT_SYSTEM: &str = "<|im_start|>system\nDescribe the key features of the input image \
     (color, shape, size, texture, objects, background), then explain how the user's text \
     instruction should alter or modify the image. Generate a new image that meets the user's \
     requirements while maintaining consistency with the original input where \
     appropriate.<|im_end|>\n<|im_start|>user\n";
/// Leading template tokens whose states are dropped in edit prompts.
pub const EDIT_DROP_TOKENS: usize = 64;
pub const IMAGE_PAD: &str = "<|image_pad|>";

/// The user turn's opening: `Picture i: <|vision_start|>` + pads + `<|vision_end|>` per image.
pub fn picture_blocks(pads_per_image: &[usize]) -> String {
    let mut out = String::new();
    for (i, &pads) in pads_per_image.iter().enumerate() {
        out.push_str(&format!("Picture {}: <|vision_start|>", i + 1));
        out.push_str(&IMAGE_PAD.repeat(pads));
        out.push_str("<|vision_end|>");
    }
    out
}

/// The size (width, height) of a reference's VAE copy: `area` = min(cap, output area) pixels
/// at the reference's aspect ratio, sides rounded (half away from zero) to 32, at least `min`.
pub fn vae_ref_size(w: usize, h: usize, area: u64, min: usize) -> (usize, usize) {
    let vw = ((area as f64) * w as f64 / h as f64).sqrt();
    let vh = vw * h as f64 / w as f64;
    let round = |v: f64| ((v / REF_MULTIPLE).round() * REF_MULTIPLE) as usize;
    (round(vw).max(min), round(vh).max(min))
}

/// The size (width, height) of a reference's vision copy (upstream's `resize_image_dims` in
/// area mode): sides rounded to `factor`, then scaled down (floor) when the area exceeds
/// `max_area` or up (ceil) when under `min_area`.
pub fn vision_ref_size(
    w: usize,
    h: usize,
    factor: usize,
    min_area: usize,
    max_area: usize,
) -> (usize, usize) {
    let f = factor as f64;
    let (wf, hf) = (w as f64, h as f64);
    let mut wb = ((wf / f).round() * f) as usize;
    let mut hb = ((hf / f).round() * f) as usize;
    let area = wb * hb;
    if area > max_area {
        let beta = (hf * wf / max_area as f64).sqrt();
        hb = factor.max(((hf / beta / f).floor() * f) as usize);
        wb = factor.max(((wf / beta / f).floor() * f) as usize);
    } else if area < min_area {
        let beta = (min_area as f64 / (hf * wf)).sqrt();
        hb = ((hf * beta / f).ceil() * f) as usize;
        wb = ((wf * beta / f).ceil() * f) as usize;
    }
    (wb.max(factor), hb.max(factor))
}

/// Upstream's `clip_preprocess` sizing on 8-bit RGB: resize (nearest) so the image covers
/// `tw × th`, then take the centre. Returns interleaved RGB of `tw × th`.
pub fn cover_and_crop(rgb: &HostTensor, tw: usize, th: usize) -> Vec<u8> {
    let [w, h, ..] = rgb.ne;
    let scale = (tw as f32 / w as f32).max(th as f32 / h as f32);
    let (rw, rh) = ((scale * w as f32) as usize, (scale * h as f32) as usize);
    let (rw, rh) = (rw.max(tw), rh.max(th));
    let resized = resize(rgb, rw, rh, Resample::Nearest);
    let (ox, oy) = ((rw - tw) / 2, (rh - th) / 2);
    let mut out = vec![0f32; tw * th * 3];
    for c in 0..3 {
        for y in 0..th {
            for x in 0..tw {
                out[c * tw * th + y * tw + x] = resized.data[c * rw * rh + (y + oy) * rw + x + ox];
            }
        }
    }
    HostTensor {
        ne: [tw, th, 3, 1],
        data: out,
    }
    .to_u8_interleaved()
}

/// The Qwen2.5-VL vision tower with its image-processor settings.
pub(super) struct Vision {
    tower: Loaded<Qwen25VlVision>,
    preprocess: VisionPreprocessConfig,
}

impl Vision {
    /// Loads the tower from the `--llm_vision` file, or the LLM file when that holds it.
    pub(super) fn load(vision: &ComponentStore, opts: LoadOptions) -> Result<Self> {
        let prefix = ComponentId::LlmVision.prefix();
        let src = Qwen25VlVisionSource::new(&vision.store, prefix);
        let hp = qwen25_vl_vision_hparams(&vision.store, prefix);
        let tower = Runner::load("qwen2.5-vl_vision", &src, opts, |wb| {
            let config = Qwen25VlVisionConfig::detect(wb, &hp).map_err(|e| {
                Error::Unsupported(format!(
                    "Qwen Image editing needs the Qwen2.5-VL vision weights (pass --llm_vision \
                     with them, or an LLM file that holds them): {e}"
                ))
            })?;
            log::debug!("qwen2.5-vl vision: {config:?}");
            Ok::<_, Error>(Qwen25VlVision::new(wb, config)?)
        })?;
        Ok(Self {
            tower,
            preprocess: qwen25_vl_preprocess_config(),
        })
    }

    pub(super) fn out_hidden(&self) -> usize {
        self.tower.model.config().out_hidden
    }

    /// The vision embeddings of reference `index` (upstream's sizing, see the module docs).
    fn encode(&self, index: usize, img: &Image) -> Result<VisionEmbeds> {
        let p = &self.preprocess;
        let factor = p.factor();
        let (w, h) = (img.width as usize, img.height as usize);
        let (tw, th) = vision_ref_size(
            w,
            h,
            factor,
            VISION_MIN_SIDE * VISION_MIN_SIDE,
            VISION_MAX_SIDE * VISION_MAX_SIDE,
        );
        log::debug!(
            "reference image {}: vision copy {w}x{h} -> {tw}x{th}",
            index + 1
        );
        let rgb = HostTensor::from_u8_interleaved(w, h, img.channels.count(), 3, &img.data);
        let rgb = cover_and_crop(&rgb, tw, th);
        let (patches, [_, gh, gw]) = p
            .patchify(&rgb, tw, th)
            .map_err(|e| Error::Unsupported(e.to_string()))?;
        let embeds = encode_vision(&self.tower.runner, &self.tower.model, &patches, gh, gw)
            .map_err(|e| Error::Unsupported(e.to_string()))?;
        let m = p.merge_size;
        Ok(VisionEmbeds {
            embeds,
            deepstack: Vec::new(),
            grid_h: gh / m,
            grid_w: gw / m,
        })
    }
}

/// Everything the references contribute to a run, computed once for all its images.
pub struct EditRefs {
    /// Reference latents in transformer space, [w, h, C, 1] each.
    pub latents: Vec<HostTensor>,
    /// Vision-tower outputs per reference.
    pub vision: Vec<VisionEmbeds>,
}

impl EditRefs {
    /// Encodes `refs` for an output of `out_w × out_h`.
    pub(super) fn prepare(
        refs: &[Image],
        (out_w, out_h): (usize, usize),
        args: &RefImageArgs,
        vae: &VaeStage,
        vision: &Vision,
        tiling: Option<&TileSettings>,
    ) -> Result<Self> {
        let m = vae.scale_factor() * 2;
        let mut latents = Vec::with_capacity(refs.len());
        let mut embeds = Vec::with_capacity(refs.len());
        let mut bar = Progress::new("reference images", refs.len());
        for (i, img) in refs.iter().enumerate() {
            let (rw, rh) = (img.width as usize, img.height as usize);
            let x = HostTensor::from_u8_interleaved(rw, rh, img.channels.count(), 3, &img.data);
            let (w, h) = if args.resize_before_vae {
                let area = args.target_area((out_w * out_h) as u64).min(REF_MAX_AREA);
                vae_ref_size(rw, rh, area, m)
            } else {
                ((rw / m).max(1) * m, (rh / m).max(1) * m)
            };
            log::debug!("reference image {}: VAE copy {rw}x{rh} -> {w}x{h}", i + 1);
            let x = resize(&x, w, h, Resample::Nearest);
            latents.push(vae.encode_unit(&x, tiling, "reference image")?);
            embeds.push(vision.encode(i, img)?);
            bar.set(i + 1);
        }
        Ok(Self {
            latents,
            vision: embeds,
        })
    }

    /// The multimodal input of an edit prompt's ids: image-pad rows take the embeddings.
    pub(super) fn mm_input(
        &self,
        ids: Vec<i32>,
        pad_id: i32,
        hidden: usize,
    ) -> Result<Qwen3MmInput> {
        Ok(Qwen3MmInput::from_images(
            ids,
            pad_id,
            &self.vision,
            hidden,
        )?)
    }

    /// Image-pad tokens per reference.
    pub fn pads(&self) -> Vec<usize> {
        self.vision.iter().map(|v| v.grid_h * v.grid_w).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vision_sizes_follow_upstream() {
        // Inside the bounds: only rounded to 28.
        assert_eq!(
            vision_ref_size(420, 392, 28, 384 * 384, 560 * 560),
            (420, 392)
        );
        // Too small: scaled up (ceil).
        let (w, h) = vision_ref_size(64, 32, 28, 384 * 384, 560 * 560);
        assert!(w * h >= 384 * 384 && w % 28 == 0 && h % 28 == 0);
        // Too large: scaled down (floor).
        let (w, h) = vision_ref_size(2000, 1000, 28, 384 * 384, 560 * 560);
        assert!(w * h <= 560 * 560 && w % 28 == 0 && h % 28 == 0);
    }

    #[test]
    fn vae_sizes_keep_the_ratio_at_the_area() {
        assert_eq!(vae_ref_size(420, 392, 64 * 32, 16), (32, 32));
        assert_eq!(vae_ref_size(100, 50, 256 * 256, 16), (352, 192));
    }
}
