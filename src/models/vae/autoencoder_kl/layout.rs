//! Where each AutoencoderKL weight lives under the two checkpoint spellings.
//!
//! Levels are numbered by resolution: level 0 is the full-resolution level (fewest channels),
//! level `L-1` the deepest. The encoder walks levels 0 → L-1, the decoder L-1 → 0. diffusers
//! numbers decoder up-blocks in execution order (`up_blocks.0` is the deepest level); the LDM
//! single-file layout numbers them by level (`up.0` is the full-resolution one).

/// Weight naming of an AutoencoderKL checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VaeLayout {
    /// diffusers `AutoencoderKL`: `encoder.down_blocks.N.resnets.M`, `decoder.up_blocks.N`,
    /// `mid_block.attentions.0.to_q` (Linear), `conv_shortcut`, `conv_norm_out`.
    Diffusers,
    /// CompVis/LDM single files: `encoder.down.N.block.M`, `decoder.up.N` (by level),
    /// `mid.attn_1.q` (1×1 conv), `nin_shortcut`, `norm_out`.
    Ldm,
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

/// Key paths for one layout and level count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Names {
    pub layout: VaeLayout,
    pub levels: usize,
}

impl Names {
    /// Resnet `j` of encoder level `level`.
    pub fn down_resnet(&self, level: usize, j: usize) -> String {
        match self.layout {
            VaeLayout::Diffusers => format!("encoder.down_blocks.{level}.resnets.{j}"),
            VaeLayout::Ldm => format!("encoder.down.{level}.block.{j}"),
        }
    }

    /// The stride-2 conv closing encoder level `level`.
    pub fn downsample(&self, level: usize) -> String {
        match self.layout {
            VaeLayout::Diffusers => format!("encoder.down_blocks.{level}.downsamplers.0.conv"),
            VaeLayout::Ldm => format!("encoder.down.{level}.downsample.conv"),
        }
    }

    /// Resnet `j` of decoder level `level` (level 0 = full resolution).
    pub fn up_resnet(&self, level: usize, j: usize) -> String {
        match self.layout {
            VaeLayout::Diffusers => {
                format!("decoder.up_blocks.{}.resnets.{j}", self.levels - 1 - level)
            }
            VaeLayout::Ldm => format!("decoder.up.{level}.block.{j}"),
        }
    }

    /// The conv after the 2× upsampling that closes decoder level `level`.
    pub fn upsample(&self, level: usize) -> String {
        match self.layout {
            VaeLayout::Diffusers => format!(
                "decoder.up_blocks.{}.upsamplers.0.conv",
                self.levels - 1 - level
            ),
            VaeLayout::Ldm => format!("decoder.up.{level}.upsample.conv"),
        }
    }

    /// Mid-block resnet `k` (0 before the attention, 1 after).
    pub fn mid_resnet(&self, part: Part, k: usize) -> String {
        match self.layout {
            VaeLayout::Diffusers => format!("{}.mid_block.resnets.{k}", part.prefix()),
            VaeLayout::Ldm => format!("{}.mid.block_{}", part.prefix(), k + 1),
        }
    }

    /// The mid-block attention.
    pub fn mid_attn(&self, part: Part) -> String {
        match self.layout {
            VaeLayout::Diffusers => format!("{}.mid_block.attentions.0", part.prefix()),
            VaeLayout::Ldm => format!("{}.mid.attn_1", part.prefix()),
        }
    }

    /// Attention leaves: (norm, q, k, v, out).
    pub fn attn_leaves(&self) -> [&'static str; 5] {
        match self.layout {
            VaeLayout::Diffusers => ["group_norm", "to_q", "to_k", "to_v", "to_out.0"],
            VaeLayout::Ldm => ["norm", "q", "k", "v", "proj_out"],
        }
    }

    /// The final group norm of a part.
    pub fn norm_out(&self, part: Part) -> String {
        match self.layout {
            VaeLayout::Diffusers => format!("{}.conv_norm_out", part.prefix()),
            VaeLayout::Ldm => format!("{}.norm_out", part.prefix()),
        }
    }

    /// The 1×1 conv a resnet uses when its width changes.
    pub fn shortcut(&self) -> &'static str {
        match self.layout {
            VaeLayout::Diffusers => "conv_shortcut",
            VaeLayout::Ldm => "nin_shortcut",
        }
    }

    pub fn conv_in(&self, part: Part) -> String {
        format!("{}.conv_in", part.prefix())
    }

    pub fn conv_out(&self, part: Part) -> String {
        format!("{}.conv_out", part.prefix())
    }
}
