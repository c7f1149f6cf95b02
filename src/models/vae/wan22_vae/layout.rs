//! Where each Wan 2.2 VAE weight lives under the two checkpoint spellings.
//!
//! The block structure is the Qwen Image 2.1 VAE's (one residual block per level, resampler
//! inside it), so the key paths are that VAE's [`Names`]; only the layout enum is this model's.

use crate::models::vae::qwen_image_2_1_vae::layout::Names;
use crate::models::vae::qwen_image_2_1_vae::QwenVaeLayout;

/// Weight naming of a Wan 2.2 VAE checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wan22VaeLayout {
    /// diffusers `AutoencoderKLWan` with `is_residual=True`: `encoder.conv_in`,
    /// `encoder.down_blocks.I.resnets.J.{norm1,conv1,norm2,conv2,conv_shortcut}`,
    /// `encoder.down_blocks.I.downsampler.{resample.1,time_conv}`,
    /// `decoder.up_blocks.I.resnets.J`, `decoder.up_blocks.I.upsampler.{resample.1,time_conv}`,
    /// `mid_block.{resnets.K,attentions.0}`, `norm_out`, `conv_out`, `quant_conv`,
    /// `post_quant_conv`.
    Diffusers,
    /// The original single-file names (`Wan2.2_VAE.pth`, ComfyUI `wan2.2_vae.safetensors`,
    /// stable-diffusion.cpp): `encoder.conv1`,
    /// `encoder.downsamples.I.downsamples.J.residual.{0,2,3,6}` / `shortcut`, the resampler as
    /// `encoder.downsamples.I.downsamples.R` (R = resnets per level), `decoder.upsamples.I.
    /// upsamples.J` with the resampler at J = R + 1, `middle.{0,1,2}`, `head.{0,2}`, top-level
    /// `conv1` / `conv2`.
    Original,
}

impl Wan22VaeLayout {
    /// The same spelling in the Qwen Image 2.1 VAE's terms.
    pub(crate) fn qwen(self) -> QwenVaeLayout {
        match self {
            Wan22VaeLayout::Diffusers => QwenVaeLayout::Diffusers,
            Wan22VaeLayout::Original => QwenVaeLayout::Original,
        }
    }

    /// Key paths for `res_blocks` resnets per encoder level.
    pub(crate) fn names(self, res_blocks: usize) -> Names {
        Names {
            layout: self.qwen(),
            res_blocks,
        }
    }
}
