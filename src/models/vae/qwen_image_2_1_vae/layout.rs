//! Where each Qwen Image 2.1 VAE weight lives under the two checkpoint spellings.
//!
//! Blocks are numbered in execution order in both layouts: encoder block 0 works at full
//! resolution, decoder block 0 right after the middle block (deepest level).

/// Weight naming of a Qwen Image 2.1 VAE checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QwenVaeLayout {
    /// diffusers `AutoencoderKLQwenImage21`: `encoder.down_blocks.N.resnets.M.{norm1,conv1,..}`,
    /// `downsampler.resample.1`, `mid_block.attentions.0`, `norm_out`, `conv_out`,
    /// `quant_conv`, `post_quant_conv`.
    Diffusers,
    /// The original (Wan 2.2 style) single-file names used by `qwen_image_2.1_vae*.safetensors`
    /// and stable-diffusion.cpp: `encoder.downsamples.N.downsamples.M.residual.{0,2,3,6}`,
    /// `shortcut`, `middle.{0,1,2}`, `head.{0,2}`, top-level `conv1` / `conv2`.
    Original,
}

/// Which half of the autoencoder a key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Encoder,
    Decoder,
}

impl Part {
    fn prefix(self) -> &'static str {
        match self {
            Part::Encoder => "encoder",
            Part::Decoder => "decoder",
        }
    }
}

/// Leaf names inside a residual block: (norm1, conv1, norm2, conv2, shortcut).
pub(crate) struct ResnetLeaves {
    pub norm1: &'static str,
    pub conv1: &'static str,
    pub norm2: &'static str,
    pub conv2: &'static str,
    pub shortcut: &'static str,
}

/// Key paths for one layout and resnet count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Names {
    pub layout: QwenVaeLayout,
    /// Resnets per encoder block (decoder blocks have one more).
    pub res_blocks: usize,
}

impl Names {
    pub fn conv_in(&self, part: Part) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("{}.conv_in", part.prefix()),
            QwenVaeLayout::Original => format!("{}.conv1", part.prefix()),
        }
    }

    pub fn norm_out(&self, part: Part) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("{}.norm_out", part.prefix()),
            QwenVaeLayout::Original => format!("{}.head.0", part.prefix()),
        }
    }

    pub fn conv_out(&self, part: Part) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("{}.conv_out", part.prefix()),
            QwenVaeLayout::Original => format!("{}.head.2", part.prefix()),
        }
    }

    /// The 1×1 conv after the encoder.
    pub fn quant_conv(&self) -> &'static str {
        match self.layout {
            QwenVaeLayout::Diffusers => "quant_conv",
            QwenVaeLayout::Original => "conv1",
        }
    }

    /// The 1×1 conv before the decoder.
    pub fn post_quant_conv(&self) -> &'static str {
        match self.layout {
            QwenVaeLayout::Diffusers => "post_quant_conv",
            QwenVaeLayout::Original => "conv2",
        }
    }

    /// Mid-block resnet `k` (0 before the attention, 1 after).
    pub fn mid_resnet(&self, part: Part, k: usize) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("{}.mid_block.resnets.{k}", part.prefix()),
            QwenVaeLayout::Original => format!("{}.middle.{}", part.prefix(), 2 * k),
        }
    }

    pub fn mid_attn(&self, part: Part) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("{}.mid_block.attentions.0", part.prefix()),
            QwenVaeLayout::Original => format!("{}.middle.1", part.prefix()),
        }
    }

    /// Resnet `j` of encoder block `i`.
    pub fn down_resnet(&self, i: usize, j: usize) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("encoder.down_blocks.{i}.resnets.{j}"),
            QwenVaeLayout::Original => format!("encoder.downsamples.{i}.downsamples.{j}"),
        }
    }

    /// The resampler closing encoder block `i` (holds `resample.1` and maybe `time_conv`).
    pub fn downsampler(&self, i: usize) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("encoder.down_blocks.{i}.downsampler"),
            QwenVaeLayout::Original => {
                format!("encoder.downsamples.{i}.downsamples.{}", self.res_blocks)
            }
        }
    }

    /// Resnet `j` of decoder block `i`.
    pub fn up_resnet(&self, i: usize, j: usize) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("decoder.up_blocks.{i}.resnets.{j}"),
            QwenVaeLayout::Original => format!("decoder.upsamples.{i}.upsamples.{j}"),
        }
    }

    /// The resampler closing decoder block `i`.
    pub fn upsampler(&self, i: usize) -> String {
        match self.layout {
            QwenVaeLayout::Diffusers => format!("decoder.up_blocks.{i}.upsampler"),
            QwenVaeLayout::Original => {
                format!("decoder.upsamples.{i}.upsamples.{}", self.res_blocks + 1)
            }
        }
    }

    pub fn resnet_leaves(&self) -> ResnetLeaves {
        match self.layout {
            QwenVaeLayout::Diffusers => ResnetLeaves {
                norm1: "norm1",
                conv1: "conv1",
                norm2: "norm2",
                conv2: "conv2",
                shortcut: "conv_shortcut",
            },
            QwenVaeLayout::Original => ResnetLeaves {
                norm1: "residual.0",
                conv1: "residual.2",
                norm2: "residual.3",
                conv2: "residual.6",
                shortcut: "shortcut",
            },
        }
    }
}
