//! SD3 / SD3.5 MMDiT sizes and checkpoint layout, detected from the weights.

use crate::runner::{RunnerError, WeightBuilder};

/// Sinusoidal features of the timestep embedder.
pub const TIME_FREQ_DIM: usize = 256;
/// Epsilon of the layer norms and the q/k RMS norms.
pub const NORM_EPS: f32 = 1e-6;

/// How a checkpoint names the transformer's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sd3Layout {
    /// Stability's single files (`sd3.5_large.safetensors`): `joint_blocks.N.{x_block,
    /// context_block}` with fused `attn.qkv`; adaptive norms as (shift, scale).
    Sai,
    /// diffusers `SD3Transformer2DModel`: split projections; AdaLayerNormContinuous as
    /// (scale, shift).
    Diffusers,
}

/// Sizes of an SD3 / SD3.5 MMDiT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sd3Config {
    pub layout: Sd3Layout,
    pub patch_size: usize,
    /// Latent channels in and out.
    pub in_channels: usize,
    pub out_channels: usize,
    pub hidden_size: usize,
    pub head_dim: usize,
    pub heads: usize,
    pub mlp_hidden: usize,
    pub depth: usize,
    /// Text states width (`context_embedder` input).
    pub context_dim: usize,
    /// Pooled text width (`y_embedder` input).
    pub pooled_dim: usize,
    /// Side of the stored position-embedding grid (`pos_embed` = side² rows).
    pub pos_embed_max: usize,
    /// SD3.5: RMS norms on q and k.
    pub qk_norm: bool,
    /// SD3.5 medium (MMDiT-X): blocks `0..dual_blocks` add a second self-attention on the image.
    pub dual_blocks: usize,
}

impl Sd3Config {
    /// Whether `wb` holds an SD3 MMDiT (either layout).
    pub fn recognise(wb: &WeightBuilder<'_, '_>) -> Option<Sd3Layout> {
        if wb.contains("joint_blocks.0.x_block.attn.qkv.weight") {
            Some(Sd3Layout::Sai)
        } else if wb.contains("transformer_blocks.0.attn.add_q_proj.weight")
            && wb.contains("pos_embed.proj.weight")
        {
            Some(Sd3Layout::Diffusers)
        } else {
            None
        }
    }

    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let origin = "SD3 MMDiT weights";
        let layout = Self::recognise(wb).ok_or_else(|| RunnerError::BadData {
            key: wb.key("joint_blocks.0.x_block.attn.qkv.weight"),
            origin: origin.into(),
            reason: "neither SD3 (joint_blocks.*) nor diffusers (transformer_blocks.*) names"
                .into(),
        })?;
        let need = |name: &str| wb.require_ne(name, origin);
        let sai = layout == Sd3Layout::Sai;
        let pick = |s: &'static str, d: &'static str| if sai { s } else { d };
        let conv = need(pick("x_embedder.proj.weight", "pos_embed.proj.weight"))?;
        let (patch_size, in_channels, hidden_size) = (conv[0], conv[2], conv[3]);
        let pos = need(pick("pos_embed", "pos_embed.pos_embed"))?;
        let pos_embed_max = (pos[1] as f64).sqrt().round() as usize;
        let final_out = need(pick("final_layer.linear.weight", "proj_out.weight"))?[1];
        let out_channels = final_out / (patch_size * patch_size).max(1);
        let context_dim = need("context_embedder.weight")?[0];
        let pooled_dim = need(pick(
            "y_embedder.mlp.0.weight",
            "time_text_embed.text_embedder.linear_1.weight",
        ))?[0];
        let mlp_hidden = need(pick(
            "joint_blocks.0.x_block.mlp.fc1.weight",
            "transformer_blocks.0.ff.net.0.proj.weight",
        ))?[1];
        let (qk_name, block) = if sai {
            ("joint_blocks.0.x_block.attn.ln_q.weight", "joint_blocks")
        } else {
            (
                "transformer_blocks.0.attn.norm_q.weight",
                "transformer_blocks",
            )
        };
        let qk = wb.source_ne(qk_name);
        let depth = (0..)
            .take_while(|i| {
                wb.contains(&format!(
                    "{block}.{i}.{}",
                    pick("x_block.attn.qkv.weight", "attn.to_q.weight")
                ))
            })
            .count();
        let dual_blocks = (0..depth)
            .take_while(|i| {
                wb.contains(&format!(
                    "{block}.{i}.{}",
                    pick("x_block.attn2.qkv.weight", "attn2.to_q.weight")
                ))
            })
            .count();
        // Heads: the q/k norms name the head size; without them, Stability's rule of one head
        // per block (MMDiT's `num_heads = depth`; 64-wide in every released model).
        let head_dim = qk.map_or(hidden_size / depth.max(1), |ne| ne[0]);
        if head_dim == 0 || !hidden_size.is_multiple_of(head_dim) || patch_size == 0 {
            return Err(RunnerError::BadData {
                key: wb.key(qk_name),
                origin: origin.into(),
                reason: format!(
                    "head size {head_dim} does not divide the hidden size {hidden_size}"
                ),
            });
        }
        Ok(Self {
            layout,
            patch_size,
            in_channels,
            out_channels,
            hidden_size,
            head_dim,
            heads: hidden_size / head_dim,
            mlp_hidden,
            depth,
            context_dim,
            pooled_dim,
            pos_embed_max,
            qk_norm: qk.is_some(),
            dual_blocks,
        })
    }

    /// The same sizes with an explicit head size (a diffusers `attention_head_dim`).
    pub fn with_head_dim(mut self, head_dim: usize) -> Result<Self, RunnerError> {
        if head_dim == 0 || !self.hidden_size.is_multiple_of(head_dim) {
            return Err(RunnerError::Internal(format!(
                "head size {head_dim} does not divide the hidden size {}",
                self.hidden_size
            )));
        }
        self.head_dim = head_dim;
        self.heads = self.hidden_size / head_dim;
        Ok(self)
    }
}
