//! The UNet's spatial transformer: GroupNorm → projection into tokens → blocks of
//! self-attention, cross-attention to the text context and a GEGLU feed-forward → projection
//! back → residual. Same tensor names in both layouts.

use crate::ggml::Tensor;
use crate::nn::{self, Conv2d, GroupNorm, LayerNorm, Linear};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::config::AttentionConfig;

/// Epsilon of the transformer's input GroupNorm (LDM's `Normalize`, diffusers and upstream).
const INPUT_NORM_EPS: f32 = 1e-6;
/// Epsilon of the blocks' LayerNorms.
const LAYER_NORM_EPS: f32 = 1e-5;

/// Multi-head attention without q/k/v biases and with a biased output projection.
#[derive(Clone, Copy, Debug)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    heads: usize,
}

impl Attention {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        dim: usize,
        kv_dim: usize,
        heads: usize,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            q: Linear::new(&wb.pp("to_q"), dim, dim, false)?,
            k: Linear::new(&wb.pp("to_k"), kv_dim, dim, false)?,
            v: Linear::new(&wb.pp("to_v"), kv_dim, dim, false)?,
            out: Linear::new(&wb.pp("to_out.0"), dim, dim, true)?,
            heads,
        })
    }

    /// x: [D, T, B] queries; kv: [D_kv, n, B] keys and values.
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, kv: Tensor<'g>) -> Tensor<'g> {
        let q = self.q.forward(g, x);
        let k = self.k.forward(g, kv);
        let v = self.v.forward(g, kv);
        self.out
            .forward(g, nn::attention(g, q, k, v, self.heads, None))
    }
}

/// `LayerNorm → self-attention`, `LayerNorm → cross-attention`, `LayerNorm → GEGLU FF`, each
/// with a residual connection.
#[derive(Clone, Copy, Debug)]
struct TransformerBlock {
    norm1: LayerNorm,
    attn1: Attention,
    norm2: LayerNorm,
    attn2: Attention,
    norm3: LayerNorm,
    ff_in: Linear,
    ff_out: Linear,
}

impl TransformerBlock {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        dim: usize,
        context_dim: usize,
        heads: usize,
    ) -> Result<Self, RunnerError> {
        // The feed-forward's inner width, from its output projection (4 × dim in released models).
        let ff = wb
            .source_ne("ff.net.2.weight")
            .ok_or_else(|| RunnerError::MissingTensor {
                key: wb.key("ff.net.2.weight"),
                origin: "UNet weights".into(),
            })?[0];
        Ok(Self {
            norm1: LayerNorm::new(&wb.pp("norm1"), dim, LAYER_NORM_EPS, true)?,
            attn1: Attention::new(&wb.pp("attn1"), dim, dim, heads)?,
            norm2: LayerNorm::new(&wb.pp("norm2"), dim, LAYER_NORM_EPS, true)?,
            attn2: Attention::new(&wb.pp("attn2"), dim, context_dim, heads)?,
            norm3: LayerNorm::new(&wb.pp("norm3"), dim, LAYER_NORM_EPS, true)?,
            ff_in: Linear::new(&wb.pp("ff.net.0.proj"), dim, 2 * ff, true)?,
            ff_out: Linear::new(&wb.pp("ff.net.2"), ff, dim, true)?,
        })
    }

    /// x: [D, T, B]; context: [D_ctx, n, B].
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, context: Tensor<'g>) -> Tensor<'g> {
        let h = self.norm1.forward(g, x);
        let x = g.add(x, self.attn1.forward(g, h, h));
        let h = self.norm2.forward(g, x);
        let x = g.add(x, self.attn2.forward(g, h, context));
        let h = self.norm3.forward(g, x);
        let h = nn::geglu(g, self.ff_in.forward(g, h));
        g.add(x, self.ff_out.forward(g, h))
    }
}

/// The projections into and out of the token space: 1×1 convs (SD1) or linears (SD2/SDXL).
#[derive(Clone, Copy, Debug)]
enum Projection {
    Conv(Conv2d),
    Linear(Linear),
}

impl Projection {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        linear: bool,
        d_in: usize,
        d_out: usize,
    ) -> Result<Self, RunnerError> {
        Ok(if linear {
            Projection::Linear(Linear::new(wb, d_in, d_out, true)?)
        } else {
            Projection::Conv(Conv2d::new_matrix(wb, d_in, d_out, 1, 1, 0, true)?)
        })
    }
}

/// [W, H, C, B] → [C, W·H, B]: tokens row-major over (h, w), as PyTorch flattens H×W.
fn to_tokens<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
    let [w, h, c, b] = x.ne();
    g.cont_reshape(g.permute(x, [1, 2, 0, 3]), [c, w * h, b, 1])
}

/// [C, W·H, B] → [W, H, C, B].
fn to_image<'g>(g: &'g GraphCtx<'g>, t: Tensor<'g>, w: usize, h: usize) -> Tensor<'g> {
    let [c, _, b, _] = t.ne();
    g.cont(g.permute(g.reshape(t, [c, w, h, b]), [2, 0, 1, 3]))
}

/// One spatial transformer (LDM `SpatialTransformer`, diffusers `Transformer2DModel`).
#[derive(Clone, Debug)]
pub(crate) struct SpatialTransformer {
    norm: GroupNorm,
    proj_in: Projection,
    blocks: Vec<TransformerBlock>,
    proj_out: Projection,
}

impl SpatialTransformer {
    /// A transformer over `channels`-wide images, as `config` describes it.
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        config: &AttentionConfig,
        channels: usize,
        context_dim: usize,
        linear: bool,
        groups: usize,
    ) -> Result<Self, RunnerError> {
        if groups == 0 || !channels.is_multiple_of(groups) {
            return Err(wb.bad_data(
                "norm.weight",
                "UNet config",
                format!("{channels} channels do not split into {groups} norm groups"),
            ));
        }
        let inner = config.inner_dim;
        let blocks = (0..config.depth)
            .map(|k| {
                TransformerBlock::new(
                    &wb.pp("transformer_blocks").pp(k),
                    inner,
                    context_dim,
                    config.heads,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            norm: GroupNorm::new(&wb.pp("norm"), groups, channels, INPUT_NORM_EPS)?,
            proj_in: Projection::new(&wb.pp("proj_in"), linear, channels, inner)?,
            blocks,
            proj_out: Projection::new(&wb.pp("proj_out"), linear, inner, channels)?,
        })
    }

    /// x: [W, H, C, B]; context: [D_ctx, n, B] → [W, H, C, B].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        context: Tensor<'g>,
    ) -> Tensor<'g> {
        let [w, h, _, _] = x.ne();
        let n = self.norm.forward(g, x);
        let mut t = match &self.proj_in {
            Projection::Conv(conv) => to_tokens(g, conv.forward(g, n)),
            Projection::Linear(lin) => lin.forward(g, to_tokens(g, n)),
        };
        for block in &self.blocks {
            t = block.forward(g, t, context);
        }
        let y = match &self.proj_out {
            Projection::Conv(conv) => conv.forward(g, to_image(g, t, w, h)),
            Projection::Linear(lin) => to_image(g, lin.forward(g, t), w, h),
        };
        g.add(y, x)
    }
}
