//! `--mask`: which pixels inpainting repaints, as upstream sd-cli reads it.
//!
//! The mask image is read as grey (stb's luma: (77·R + 150·G + 29·B) >> 8), resized to the
//! output size like the init image, and thresholded by rounding (white, ≥ 128, repaints). The
//! latent mask is its maximum over each latent pixel's block (a pixel touched by the mask is
//! repainted). Every family blends (`sampling::DenoiseMask`) the denoised latent of each step with the init image's
//! latent outside the latent mask; inpainting UNets also read the mask and the masked image's
//! latent as extra input channels, and widen the blend mask by one latent pixel.

use crate::image_io::{resize_bilinear, Channels, Image};
use crate::tensor::HostTensor;

use super::resample::{dilate3, resize, Resample};

/// A thresholded inpainting mask at image and latent resolution (1 = repaint).
#[derive(Clone, Debug, PartialEq)]
pub struct InpaintMask {
    /// [W, H, 1] in {0, 1}.
    pub pixels: HostTensor,
    /// [W / f, H / f, 1] in {0, 1}: the maximum over each f × f block.
    pub latent: HostTensor,
}

/// stb_image's RGB → grey conversion.
fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((u32::from(r) * 77 + u32::from(g) * 150 + u32::from(b) * 29) >> 8) as u8
}

impl InpaintMask {
    /// The mask of `image` for a `width × height` output whose latent is `factor` times
    /// smaller.
    pub fn from_image(image: &Image, width: usize, height: usize, factor: usize) -> Self {
        let rgb = image.to_rgb();
        let sized = resize_bilinear(&rgb, width as u32, height as u32);
        let grey: Vec<f32> = sized
            .data
            .chunks_exact(Channels::Rgb.count())
            .map(|p| (f32::from(luma(p[0], p[1], p[2])) / 255.0).round())
            .collect();
        Self::from_pixels(
            HostTensor::image(width, height, 1, grey).expect("mask size"),
            factor,
        )
    }

    /// Everything repainted (an inpainting model's mask when none is given).
    pub fn full(width: usize, height: usize, factor: usize) -> Self {
        Self::from_pixels(
            HostTensor::image(width, height, 1, vec![1.0; width * height]).expect("mask size"),
            factor,
        )
    }

    fn from_pixels(pixels: HostTensor, factor: usize) -> Self {
        let f = factor.max(1);
        let latent = resize(
            &pixels,
            pixels.width() / f,
            pixels.height() / f,
            Resample::NearestMax,
        );
        Self { pixels, latent }
    }

    /// The init image with the repainted pixels grey: `(1 − m)·(x − ½) + ½` on [0, 1] RGB.
    pub fn masked_image(&self, image: &HostTensor) -> HostTensor {
        let plane = self.pixels.data.len();
        let mut out = image.clone();
        for (i, v) in out.data.iter_mut().enumerate() {
            let m = self.pixels.data[i % plane];
            *v = (1.0 - m) * (*v - 0.5) + 0.5;
        }
        out
    }

    /// The latent mask widened by one latent pixel (upstream's 3×3 max pool for inpainting
    /// models).
    pub fn dilated_latent(&self) -> HostTensor {
        dilate3(&self.latent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_is_thresholded_and_reduced_by_block_maximum() {
        // 4x2 image, factor 2: only pixel (3, 1) is white.
        let mut data = vec![0u8; 4 * 2 * 3];
        data[(4 + 3) * 3..(4 + 3) * 3 + 3].copy_from_slice(&[255, 255, 255]);
        data[0..3].copy_from_slice(&[127, 127, 127]); // rounds to 0
        let img = Image::new(4, 2, Channels::Rgb, data).unwrap();
        let m = InpaintMask::from_image(&img, 4, 2, 2);
        assert_eq!(m.pixels.data.iter().sum::<f32>(), 1.0);
        assert_eq!(m.latent.data, vec![0.0, 1.0]);
    }
}
