//! The image → pixel tensor step of the CLIP vision tower as stable-diffusion.cpp does it
//! (`clip_preprocess` in `src/core/util.cpp`).
//!
//! The RGB image ([W, H, ≥3, 1], values in [0, 1]) is scaled so that it covers the square
//! target, `scale = max(S/W, S/H)` in f32, each side becoming `trunc(scale · side)`; resized
//! with upstream's tensor `interpolate` in its default `nearest` mode (input pixel
//! `⌊o · in / out⌋`, [`Resample::Nearest`]); centre-cropped at offsets
//! `⌊(side − S) / 2⌋`; clamped to [0, 1]; normalised with OpenAI CLIP's mean and std.
//!
//! Differences from transformers' `CLIPImageProcessor` (what diffusers' Wan I2V pipeline
//! uses): that one resizes the shortest edge to S with a bicubic filter on
//! 8-bit pixels (PIL, antialiased when shrinking) and the long edge to `int(S · long / short)`
//! (f64), then centre-crops at `(side − S) // 2` and rescales the 8-bit crop by 1/255 — so the
//! pixels differ (nearest vs bicubic) while the framing agrees up to one pixel. Upstream being
//! the spec, this follows upstream.
//!
//! One guard upstream lacks: where f32 rounding leaves the short side one pixel short of S
//! (`trunc(f32(S/W) · W) = S − 1`, e.g. S = 224 and W = 23, 97 or 135; never for the usual
//! video sizes 480…1920), upstream's crop reads one row or column past the resized image; here
//! that side is taken as S.

use crate::models::te::qwen25_vl_vision::{CLIP_IMAGE_MEAN, CLIP_IMAGE_STD};
use crate::pipeline::resample::{resize, Resample};
use crate::runner::RunnerError;
use crate::tensor::HostTensor;

const ORIGIN: &str = "the CLIP vision input image";

/// The resized size of a `width × height` image covering a `size × size` square, as upstream
/// computes it (f32 arithmetic, truncated), never below `size`.
pub fn clip_vision_resize_size(width: usize, height: usize, size: usize) -> (usize, usize) {
    let scale = (size as f32 / width as f32).max(size as f32 / height as f32);
    let side = |v: usize| ((scale * v as f32) as usize).max(size);
    (side(width), side(height))
}

/// Upstream's CLIP image preprocessing (see the module docs): `image` [W, H, C ≥ 3, 1] in
/// [0, 1] (the first three channels are RGB; an alpha channel is ignored) → normalised pixels
/// [size, size, 3, 1], the input of [`encode`](super::encode) for a tower whose
/// `image_size` is `size`.
pub fn clip_vision_preprocess(image: &HostTensor, size: usize) -> Result<HostTensor, RunnerError> {
    let bad = |reason: String| RunnerError::BadData {
        key: "image".into(),
        origin: ORIGIN.into(),
        reason,
    };
    let [width, height, channels, batch] = image.ne;
    if !image.is_consistent() {
        return Err(bad(format!(
            "{} values do not fill the shape {:?}",
            image.data.len(),
            image.ne
        )));
    }
    if width == 0 || height == 0 {
        return Err(bad(format!("the image is empty ({width}x{height})")));
    }
    if channels < 3 || batch != 1 {
        return Err(bad(format!(
            "shape {:?} is not one RGB image [W, H, 3 or 4, 1]",
            image.ne
        )));
    }
    if size == 0 {
        return Err(bad("the target size is 0".into()));
    }
    let plane = width * height;
    let rgb = HostTensor {
        ne: [width, height, 3, 1],
        data: image.data[..3 * plane].to_vec(),
    };
    let (rw, rh) = clip_vision_resize_size(width, height, size);
    let resized = resize(&rgb, rw, rh, Resample::Nearest);
    let (x0, y0) = ((rw - size) / 2, (rh - size) / 2);
    let mut out = Vec::with_capacity(3 * size * size);
    for c in 0..3 {
        let (mean, std) = (CLIP_IMAGE_MEAN[c], CLIP_IMAGE_STD[c]);
        for y in 0..size {
            let row = (c * rh + y + y0) * rw + x0;
            out.extend(
                resized.data[row..row + size]
                    .iter()
                    .map(|&v| (v.clamp(0.0, 1.0) - mean) / std),
            );
        }
    }
    Ok(HostTensor {
        ne: [size, size, 3, 1],
        data: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_covers_the_square() {
        assert_eq!(clip_vision_resize_size(224, 224, 224), (224, 224));
        assert_eq!(clip_vision_resize_size(832, 480, 224), (388, 224));
        assert_eq!(clip_vision_resize_size(480, 832, 224), (224, 388));
        assert_eq!(clip_vision_resize_size(7, 5, 32), (44, 32));
        for w in 1..300 {
            for h in [1, 3, 37, 224, 299] {
                let (rw, rh) = clip_vision_resize_size(w, h, 224);
                assert!(
                    rw >= 224 && rh >= 224 && (rw == 224 || rh == 224),
                    "{w}x{h}"
                );
            }
        }
    }

    #[test]
    fn constant_image_normalises_to_constants() {
        let img = HostTensor::image(9, 6, 4, vec![0.5; 9 * 6 * 4]).unwrap();
        let px = clip_vision_preprocess(&img, 4).unwrap();
        assert_eq!(px.ne, [4, 4, 3, 1]);
        for c in 0..3 {
            let want = (0.5 - CLIP_IMAGE_MEAN[c]) / CLIP_IMAGE_STD[c];
            assert!(px.data[c * 16..(c + 1) * 16].iter().all(|&v| v == want));
        }
    }

    #[test]
    fn bad_images_are_errors() {
        let gray = HostTensor::image(4, 4, 1, vec![0.0; 16]).unwrap();
        assert!(clip_vision_preprocess(&gray, 4).is_err());
        let empty = HostTensor::image(0, 4, 3, vec![]).unwrap();
        assert!(clip_vision_preprocess(&empty, 4).is_err());
        let short = HostTensor {
            ne: [4, 4, 3, 1],
            data: vec![0.0; 47],
        };
        assert!(clip_vision_preprocess(&short, 4).is_err());
        let ok = HostTensor::image(4, 4, 3, vec![0.0; 48]).unwrap();
        assert!(clip_vision_preprocess(&ok, 0).is_err());
    }
}
