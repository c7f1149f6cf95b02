//! Reference images for Qwen Image 2.1 editing: size, resize, and the two copies the model
//! reads (diffusers `QwenImage21Pipeline.__call__` with `image=`).
//!
//! One resize feeds both paths: each reference keeps its aspect ratio at the target area
//! (`round(√(area·ratio) / 32)·32` wide, `round(width / ratio / 32)·32` high) with Pillow's
//! Lanczos filter on RGBA. The VAE reads all four channels in [−1, 1]; the vision encoder
//! reads the RGB copy with the alpha composited over white (Pillow `paste` rounding).

use crate::error::{Error, Result};
use crate::image_io::{resize_pil, Channels, Image, PilFilter};

/// Reference sizes are multiples of this (one vision merge window = 2×2 latent tokens).
pub const REF_MULTIPLE: usize = 32;

/// A reference image prepared for both encoders.
pub struct PreparedRef {
    pub width: usize,
    pub height: usize,
    /// RGBA planar [W, H, 4] in [−1, 1] for the VAE encoder.
    pub vae_input: Vec<f32>,
    /// RGB interleaved u8, alpha composited over white, for the vision encoder.
    pub vision_rgb: Vec<u8>,
}

/// diffusers `calculate_dimensions`: the size of `target_area` pixels at `ratio` = w / h,
/// each side rounded to a multiple of 32.
pub fn calculate_dimensions(target_area: f64, ratio: f64) -> (usize, usize) {
    let width = (target_area * ratio).sqrt();
    let height = width / ratio;
    // Python's `round` rounds ties to even.
    let round = |v: f64| ((v / REF_MULTIPLE as f64).round_ties_even() as usize) * REF_MULTIPLE;
    (round(width), round(height))
}

/// The size reference `index` (0-based) is encoded at: `target_area` at its own aspect
/// ratio, or with `auto_resize` off its own size (which must then be a multiple of 32).
pub fn reference_size(
    index: usize,
    img: &Image,
    target_area: usize,
    auto_resize: bool,
) -> Result<(usize, usize)> {
    let (w, h) = (img.width as usize, img.height as usize);
    let (rw, rh) = if auto_resize {
        calculate_dimensions(target_area as f64, w as f64 / h as f64)
    } else {
        (w, h)
    };
    if rw == 0 || rh == 0 || rw % REF_MULTIPLE != 0 || rh % REF_MULTIPLE != 0 {
        return Err(Error::Flag {
            flag: "-r/--ref-image".into(),
            reason: if auto_resize {
                format!(
                    "reference image {} ({w}x{h}) is too small or too elongated for a \
                     {target_area}-pixel target: it would become {rw}x{rh}",
                    index + 1
                )
            } else {
                format!(
                    "reference image {} is {w}x{h}; with --disable-auto-resize-ref-image both \
                     sides must be multiples of {REF_MULTIPLE}",
                    index + 1
                )
            },
        });
    }
    Ok((rw, rh))
}

/// Resizes `img` to `width × height` and makes the VAE and vision copies.
pub fn prepare_reference(img: &Image, width: usize, height: usize) -> Result<PreparedRef> {
    let rgba = to_rgba(img);
    let resized = resize_pil(&rgba, width as u32, height as u32, PilFilter::Lanczos)?;
    let n = width * height;
    let mut vae_input = vec![0.0f32; 4 * n];
    let mut vision_rgb = Vec::with_capacity(3 * n);
    for (i, px) in resized.data.chunks_exact(4).enumerate() {
        for c in 0..4 {
            vae_input[c * n + i] = f32::from(px[c]) / 255.0 * 2.0 - 1.0;
        }
        let a = u32::from(px[3]);
        for &c in &px[..3] {
            vision_rgb.push(over_white(u32::from(c), a));
        }
    }
    Ok(PreparedRef {
        width,
        height,
        vae_input,
        vision_rgb,
    })
}

/// Pillow's `paste(img, mask=alpha)` onto white: `(255·(255 − a) + c·a) / 255` rounded
/// with its integer divide-by-255.
fn over_white(c: u32, a: u32) -> u8 {
    let t = 255 * (255 - a) + c * a + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// RGB gains an opaque alpha channel (Pillow `convert("RGBA")`).
fn to_rgba(img: &Image) -> Image {
    match img.channels {
        Channels::Rgba => img.clone(),
        Channels::Rgb => {
            let data = img
                .data
                .chunks_exact(3)
                .flat_map(|p| [p[0], p[1], p[2], 255])
                .collect();
            Image {
                width: img.width,
                height: img.height,
                channels: Channels::Rgba,
                data,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_follow_diffusers() {
        // calculate_dimensions(1024*1024, 1.0) = (1024, 1024); 3:2 → 1248x832.
        assert_eq!(calculate_dimensions(1024.0 * 1024.0, 1.0), (1024, 1024));
        assert_eq!(calculate_dimensions(1024.0 * 1024.0, 1.5), (1248, 832));
        assert_eq!(calculate_dimensions(64.0 * 64.0, 96.0 / 64.0), (64, 64));
    }

    #[test]
    fn compositing_matches_pillow_rounding() {
        assert_eq!(over_white(0, 255), 0);
        assert_eq!(over_white(0, 0), 255);
        assert_eq!(over_white(200, 128), 227);
    }
}
