//! Where each Wan 2.1 VAE weight lives under the two checkpoint spellings.
//!
//! Resnet leaves, the middle block, the heads and the 1×1 quant convs are spelled as in the
//! Qwen Image 2.1 VAE (whose [`Names`] this reuses); only the block lists differ. The encoder
//! is one flat list in both layouts: per level `res_blocks` resnets, then the downsampler
//! (all but the last level). The decoder is flat in the original layout (`res_blocks + 1`
//! resnets, then the upsampler) and nested per level in diffusers'.

use crate::models::vae::qwen_image_2_1_vae::layout::Names;
use crate::models::vae::qwen_image_2_1_vae::QwenVaeLayout;

/// Weight naming of a Wan 2.1 VAE checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WanVaeLayout {
    /// diffusers `AutoencoderKLQwenImage`: `encoder.conv_in`, flat
    /// `encoder.down_blocks.K.{norm1,conv1,norm2,conv2,conv_shortcut,resample.1}`,
    /// `decoder.up_blocks.N.resnets.M`, `decoder.up_blocks.N.upsamplers.0.resample.1`,
    /// `mid_block`, `norm_out`, `conv_out`, `quant_conv`, `post_quant_conv`.
    Diffusers,
    /// The original Wan 2.1 single-file names (`Wan2.1_VAE.safetensors`,
    /// `qwen_image_vae.safetensors`, stable-diffusion.cpp and its GGUF files): `encoder.conv1`,
    /// flat `encoder.downsamples.K.residual.{0,2,3,6}` / `shortcut` / `resample.1`,
    /// `middle.{0,1,2}`, `head.{0,2}`, flat `decoder.upsamples.K`, top-level `conv1` / `conv2`.
    Original,
}

/// Key paths for one layout and resnet count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WanNames {
    pub layout: WanVaeLayout,
    /// Resnets per encoder block (decoder blocks have one more).
    pub res_blocks: usize,
}

impl WanNames {
    /// The names shared with the Qwen Image 2.1 VAE (leaves, middle, heads, quant convs).
    pub fn shared(&self) -> Names {
        Names {
            layout: match self.layout {
                WanVaeLayout::Diffusers => QwenVaeLayout::Diffusers,
                WanVaeLayout::Original => QwenVaeLayout::Original,
            },
            res_blocks: self.res_blocks,
        }
    }

    /// Entry `k` of the flat encoder list.
    pub fn down_entry(&self, k: usize) -> String {
        match self.layout {
            WanVaeLayout::Diffusers => format!("encoder.down_blocks.{k}"),
            WanVaeLayout::Original => format!("encoder.downsamples.{k}"),
        }
    }

    /// Resnet `j` of encoder level `i`.
    pub fn down_resnet(&self, i: usize, j: usize) -> String {
        self.down_entry(i * (self.res_blocks + 1) + j)
    }

    /// The downsampler closing encoder level `i` (holds `resample.1`).
    pub fn downsampler(&self, i: usize) -> String {
        self.down_entry(i * (self.res_blocks + 1) + self.res_blocks)
    }

    /// Entry `k` of the flat original decoder list.
    pub fn original_up_entry(k: usize) -> String {
        format!("decoder.upsamples.{k}")
    }

    /// Resnet `j` of decoder level `i`.
    pub fn up_resnet(&self, i: usize, j: usize) -> String {
        match self.layout {
            WanVaeLayout::Diffusers => format!("decoder.up_blocks.{i}.resnets.{j}"),
            WanVaeLayout::Original => Self::original_up_entry(i * (self.res_blocks + 2) + j),
        }
    }

    /// The upsampler closing decoder level `i` (holds `resample.1`).
    pub fn upsampler(&self, i: usize) -> String {
        match self.layout {
            WanVaeLayout::Diffusers => format!("decoder.up_blocks.{i}.upsamplers.0"),
            WanVaeLayout::Original => {
                Self::original_up_entry(i * (self.res_blocks + 2) + self.res_blocks + 1)
            }
        }
    }
}
