//! Where each MiniMax-H3 video VAE weight lives under the two checkpoint spellings.
//!
//! The 1×1 quant convs, the encoder's `conv_in` / `norm_out` / `conv_out` and the decoder's
//! `register_tokens`, norms, block scales, `norm_out` and `proj_out` are spelled alike. What
//! differs (diffusers `scripts/convert_minimax_h3_to_diffusers.py`, `convert_video_vae_key`):
//! the encoder levels, the decoder's input projection, and the attention and feed-forward
//! projections, which the original file stores fused (see [`QkvLayout`], [`SwiGluLayout`]).
//! Mapping one layout onto the other happens as the weights are declared: each layout asks for
//! its own keys, and the graph reads the fused tensors through views.

/// Weight naming of a MiniMax-H3 video VAE checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MiniMaxH3VaeLayout {
    /// diffusers `AutoencoderKLMiniMaxH3`: `encoder.down_blocks.I.resnets.J`,
    /// `encoder.down_blocks.I.downsamplers.0.conv`, `conv_shortcut`, `decoder.proj_in`,
    /// `attn.to_q` / `to_k` / `to_v` / `to_out.0`, `ff.net.0.proj` (`[up; gate]`), `ff.net.2`.
    Diffusers,
    /// The original MiniMax-H3 names (the Comfy-Org single file, stable-diffusion.cpp):
    /// `encoder.down.I.block.J`, `encoder.down.I.downsample.conv`, `nin_shortcut`,
    /// `decoder.x_embedder`, a per-head fused `attn.to_qkv`, `attn.to_out`, `ff.w1`
    /// (`[gate; up]`), `ff.w2`, and an unused `decoder.mask_token`.
    Original,
}

/// How the attention input projections are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QkvLayout {
    /// Three separate projections.
    Split,
    /// One projection whose output rows go head by head, each head's q, k, v in turn.
    FusedPerHead,
}

/// Which half of the fused SwiGLU input projection is the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SwiGluLayout {
    /// `[up; gate]` (diffusers `SwiGLU`).
    UpGate,
    /// `[gate; up]` (the original `w1`).
    GateUp,
}

impl MiniMaxH3VaeLayout {
    /// The layout whose names `has` finds, if either.
    pub(crate) fn detect(has: impl Fn(&str) -> bool) -> Option<Self> {
        let diffusers =
            has("decoder.proj_in.weight") || has("encoder.down_blocks.0.resnets.0.conv1.weight");
        let original =
            has("decoder.x_embedder.weight") || has("encoder.down.0.block.0.conv1.weight");
        if diffusers {
            Some(Self::Diffusers)
        } else if original {
            Some(Self::Original)
        } else {
            None
        }
    }

    /// Encoder level `i`.
    pub(crate) fn level(self, i: usize) -> String {
        match self {
            Self::Diffusers => format!("encoder.down_blocks.{i}"),
            Self::Original => format!("encoder.down.{i}"),
        }
    }

    /// Resnet `j` of encoder level `i`.
    pub(crate) fn resnet(self, i: usize, j: usize) -> String {
        match self {
            Self::Diffusers => format!("{}.resnets.{j}", self.level(i)),
            Self::Original => format!("{}.block.{j}", self.level(i)),
        }
    }

    /// The 1×1×1 conv of a resnet that changes the width.
    pub(crate) fn shortcut(self) -> &'static str {
        match self {
            Self::Diffusers => "conv_shortcut",
            Self::Original => "nin_shortcut",
        }
    }

    /// The strided conv closing encoder level `i`.
    pub(crate) fn downsampler(self, i: usize) -> String {
        match self {
            Self::Diffusers => format!("{}.downsamplers.0.conv", self.level(i)),
            Self::Original => format!("{}.downsample.conv", self.level(i)),
        }
    }

    /// The decoder's latent → token projection.
    pub(crate) fn proj_in(self) -> &'static str {
        match self {
            Self::Diffusers => "decoder.proj_in",
            Self::Original => "decoder.x_embedder",
        }
    }

    /// Decoder block `i`.
    pub(crate) fn block(self, i: usize) -> String {
        format!("decoder.transformer_blocks.{i}")
    }

    pub(crate) fn qkv(self) -> QkvLayout {
        match self {
            Self::Diffusers => QkvLayout::Split,
            Self::Original => QkvLayout::FusedPerHead,
        }
    }

    /// The attention output projection, under a block.
    pub(crate) fn attn_out(self) -> &'static str {
        match self {
            Self::Diffusers => "attn.to_out.0",
            Self::Original => "attn.to_out",
        }
    }

    /// The fused SwiGLU input projection and the output projection, under a block.
    pub(crate) fn ff(self) -> (&'static str, &'static str, SwiGluLayout) {
        match self {
            Self::Diffusers => ("ff.net.0.proj", "ff.net.2", SwiGluLayout::UpGate),
            Self::Original => ("ff.w1", "ff.w2", SwiGluLayout::GateUp),
        }
    }
}
