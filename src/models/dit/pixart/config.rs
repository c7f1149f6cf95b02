//! PixArt configuration, detected from weight names and shapes, and the per-layout tensor names.

use crate::runner::{RunnerError, WeightBuilder};

/// Channels of the sinusoidal timestep / micro-condition features.
pub const FREQ_DIM: usize = 256;

/// Attention head size of every released PixArt-α/Σ model (hidden 1152 = 16 heads × 72).
pub const HEAD_DIM: usize = 72;

/// Which naming scheme the checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixArtLayout {
    /// diffusers `PixArtTransformer2DModel` (`transformer_blocks.N.attn1.to_q`, ...).
    Diffusers,
    /// The original PixArt repository (`blocks.N.attn.qkv` fused, `cross_attn.kv_linear`, ...).
    Original,
}

/// Tensor-name prefixes of one layout, relative to the model root.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Names {
    pub patch: &'static str,
    pub t_embedder: &'static str,
    pub resolution_embedder: &'static str,
    pub aspect_ratio_embedder: &'static str,
    /// First and second linear of every two-layer MLP embedder (timestep, sizes).
    pub mlp: [&'static str; 2],
    pub t_block: &'static str,
    pub caption: &'static str,
    pub caption_fc: [&'static str; 2],
    pub blocks: &'static str,
    pub final_table: &'static str,
    pub proj_out: &'static str,
    pub attn_out: &'static str,
    pub cross_q: &'static str,
    pub cross_out: &'static str,
    pub ff: [&'static str; 2],
}

const DIFFUSERS: Names = Names {
    patch: "pos_embed.proj",
    t_embedder: "adaln_single.emb.timestep_embedder",
    resolution_embedder: "adaln_single.emb.resolution_embedder",
    aspect_ratio_embedder: "adaln_single.emb.aspect_ratio_embedder",
    mlp: ["linear_1", "linear_2"],
    t_block: "adaln_single.linear",
    caption: "caption_projection",
    caption_fc: ["linear_1", "linear_2"],
    blocks: "transformer_blocks",
    final_table: "scale_shift_table",
    proj_out: "proj_out",
    attn_out: "attn1.to_out.0",
    cross_q: "attn2.to_q",
    cross_out: "attn2.to_out.0",
    ff: ["ff.net.0.proj", "ff.net.2"],
};

const ORIGINAL: Names = Names {
    patch: "x_embedder.proj",
    t_embedder: "t_embedder",
    resolution_embedder: "csize_embedder",
    aspect_ratio_embedder: "ar_embedder",
    mlp: ["mlp.0", "mlp.2"],
    t_block: "t_block.1",
    caption: "y_embedder.y_proj",
    caption_fc: ["fc1", "fc2"],
    blocks: "blocks",
    final_table: "final_layer.scale_shift_table",
    proj_out: "final_layer.linear",
    attn_out: "attn.proj",
    cross_q: "cross_attn.q_linear",
    cross_out: "cross_attn.proj",
    ff: ["mlp.fc1", "mlp.fc2"],
};

impl PixArtLayout {
    pub(crate) fn names(self) -> &'static Names {
        match self {
            PixArtLayout::Diffusers => &DIFFUSERS,
            PixArtLayout::Original => &ORIGINAL,
        }
    }
}

/// Sizes of a PixArt transformer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PixArtConfig {
    pub layout: PixArtLayout,
    /// Latent channels in (4).
    pub in_channels: usize,
    /// Channels out: 8 with learned sigma (noise prediction in 0..4, variance in 4..8).
    pub out_channels: usize,
    /// Inner (hidden) size, heads × head size (1152).
    pub hidden_size: usize,
    pub heads: usize,
    pub patch_size: usize,
    /// Text-encoder feature size (T5-XXL: 4096).
    pub caption_channels: usize,
    /// Feed-forward inner size (4 × hidden).
    pub ffn_dim: usize,
    pub layers: usize,
    /// α-1024-MS resolution / aspect-ratio embedders present.
    pub micro_conditions: bool,
}

fn missing(key: String, what: &str) -> RunnerError {
    RunnerError::MissingTensor {
        key,
        origin: format!("PixArt weights ({what})"),
    }
}

fn bad(key: String, reason: String) -> RunnerError {
    RunnerError::BadData {
        key,
        origin: "PixArt weights".into(),
        reason,
    }
}

impl PixArtConfig {
    /// Detects the layout and sizes from `wb`'s tensors, with the released models' head size 72.
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        Self::detect_with_head_dim(wb, HEAD_DIM)
    }

    /// As [`PixArtConfig::detect`] with another attention head size (the head count is not
    /// recorded in the weights: heads = hidden / head_dim).
    pub fn detect_with_head_dim(
        wb: &WeightBuilder<'_, '_>,
        head_dim: usize,
    ) -> Result<Self, RunnerError> {
        let layout = if wb.contains(&format!("{}.weight", ORIGINAL.patch)) {
            PixArtLayout::Original
        } else if wb.contains(&format!("{}.weight", DIFFUSERS.patch)) {
            PixArtLayout::Diffusers
        } else {
            return Err(missing(
                wb.key(&format!("{}.weight", DIFFUSERS.patch)),
                "neither the diffusers nor the original patch embedding",
            ));
        };
        let n = layout.names();
        let shape = |name: String| {
            wb.source_ne(&name)
                .ok_or_else(|| missing(wb.key(&name), "config detection"))
        };
        // Conv kernel [p, p, in, hidden] (ggml order).
        let patch_key = format!("{}.weight", n.patch);
        let [p, p1, in_channels, hidden_size] = shape(patch_key.clone())?;
        if p != p1 || p == 0 || in_channels == 0 || hidden_size == 0 {
            return Err(bad(
                wb.key(&patch_key),
                format!("patch kernel {p}x{p1} over {in_channels} channels is not a PixArt patch embedding"),
            ));
        }
        if head_dim == 0 || hidden_size % head_dim != 0 {
            return Err(bad(
                wb.key(&patch_key),
                format!("hidden size {hidden_size} is not a multiple of the head size {head_dim}"),
            ));
        }
        let proj_key = format!("{}.weight", n.proj_out);
        let proj_out = shape(proj_key.clone())?[1];
        if proj_out % (p * p) != 0 {
            return Err(bad(
                wb.key(&proj_key),
                format!("{proj_out} outputs do not split into {p}x{p} patches"),
            ));
        }
        let caption_channels = shape(format!("{}.{}.weight", n.caption, n.caption_fc[0]))?[0];
        let mut layers = 0;
        while wb.contains(&format!("{}.{layers}.scale_shift_table", n.blocks)) {
            layers += 1;
        }
        if layers == 0 {
            return Err(missing(
                wb.key(&format!("{}.0.scale_shift_table", n.blocks)),
                "no transformer blocks",
            ));
        }
        let ffn_dim = shape(format!("{}.0.{}.weight", n.blocks, n.ff[0]))?[1];
        let micro_key = format!("{}.{}.weight", n.resolution_embedder, n.mlp[0]);
        let micro_conditions = wb.contains(&micro_key);
        if micro_conditions && hidden_size % 3 != 0 {
            return Err(bad(
                wb.key(&micro_key),
                format!("micro-conditions need a hidden size divisible by 3, got {hidden_size}"),
            ));
        }
        let config = Self {
            layout,
            in_channels,
            out_channels: proj_out / (p * p),
            hidden_size,
            heads: hidden_size / head_dim,
            patch_size: p,
            caption_channels,
            ffn_dim,
            layers,
            micro_conditions,
        };
        log::debug!("pixart: {config:?}");
        Ok(config)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.heads
    }

    /// The model also predicts its variance (out = 2 × in channels); callers keep the first
    /// `in_channels` (the noise prediction).
    pub fn learned_sigma(&self) -> bool {
        self.out_channels == 2 * self.in_channels
    }
}

/// How the 2-D sin-cos position embedding maps patch indices to positions:
/// `pos = index · base_size / grid_len / interpolation_scale` per axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PosEmbedParams {
    pub base_size: f32,
    pub interpolation_scale: f32,
}

impl Default for PosEmbedParams {
    /// Upstream sd-cli's defaults (`pixart_pos_embed_base_size=64`,
    /// `pixart_interpolation_scale=2`): PixArt-Σ / α at 1024 px.
    fn default() -> Self {
        Self {
            base_size: 64.0,
            interpolation_scale: 2.0,
        }
    }
}

impl PosEmbedParams {
    /// diffusers' values for a model trained at `sample_size` latent pixels:
    /// base = sample_size / patch, scale = max(sample_size / 64, 1) (integer division).
    pub fn for_sample_size(sample_size: usize, patch_size: usize) -> Self {
        Self {
            base_size: (sample_size / patch_size.max(1)) as f32,
            interpolation_scale: (sample_size / 64).max(1) as f32,
        }
    }
}
