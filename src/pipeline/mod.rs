//! Orchestration per model family: condition → sample → decode. No ggml calls here; models
//! run through their runners.

mod memo;
pub mod pixart;
pub mod qwen_image_2_1;
mod vae_decode;

pub use vae_decode::{decode_latents_kl, encode_image_kl};

/// Checks that an image size is a non-zero multiple of the model's size `multiple`.
pub(crate) fn check_size(width: usize, height: usize, multiple: usize) -> crate::error::Result<()> {
    if width == 0
        || height == 0
        || !width.is_multiple_of(multiple)
        || !height.is_multiple_of(multiple)
    {
        return Err(crate::error::Error::Flag {
            flag: "-W/-H".into(),
            reason: format!("{width}x{height} is not a multiple of {multiple} for this model"),
        });
    }
    Ok(())
}

/// A decoded image in [0, 1], planar [W, H, C] (ggml order: x fastest, then y, then channel).
#[derive(Clone, Debug)]
pub struct FloatImage {
    pub width: usize,
    pub height: usize,
    pub channels: usize,
    pub data: Vec<f32>,
}

impl FloatImage {
    /// Planar floats in [0, 1] from interleaved 8-bit pixels, keeping the first `channels`.
    pub fn from_u8_interleaved(
        width: usize,
        height: usize,
        src_channels: usize,
        channels: usize,
        data: &[u8],
    ) -> Self {
        let mut out = vec![0f32; width * height * channels];
        for ch in 0..channels {
            for y in 0..height {
                for x in 0..width {
                    out[ch * width * height + y * width + x] =
                        data[(y * width + x) * src_channels + ch] as f32 / 255.0;
                }
            }
        }
        Self {
            width,
            height,
            channels,
            data: out,
        }
    }

    /// Interleaved 8-bit pixels (RGB or RGBA), rounding as PIL's `numpy_to_pil` does.
    pub fn to_u8_interleaved(&self) -> Vec<u8> {
        let (w, h, c) = (self.width, self.height, self.channels);
        let mut out = vec![0u8; w * h * c];
        for ch in 0..c {
            for y in 0..h {
                for x in 0..w {
                    let v = self.data[ch * w * h + y * w + x].clamp(0.0, 1.0);
                    out[(y * w + x) * c + ch] = (v * 255.0).round() as u8;
                }
            }
        }
        out
    }
}

/// Per-stage wall-clock seconds, for `-v`.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    pub load: f64,
    pub condition: f64,
    pub sample: f64,
    pub decode: f64,
}

/// The tail of the schedule img2img samples along (upstream sd-cli's rule): with `strength`
/// s over n steps, t = min(floor(s·n), n − 1) and sampling runs the last t + 1 steps; s = 1 is
/// the whole schedule, s = 0 still runs the final step.
pub fn img2img_sigmas(sigmas: &[f32], strength: f32) -> Vec<f32> {
    let steps = sigmas.len().saturating_sub(1);
    if steps == 0 {
        return sigmas.to_vec();
    }
    let t_enc = ((strength.clamp(0.0, 1.0) * steps as f32) as usize).min(steps - 1);
    sigmas[steps - t_enc - 1..].to_vec()
}
