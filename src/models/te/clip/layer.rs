//! One CLIP encoder layer (transformers `CLIPEncoderLayer`): the text and vision towers share it,
//! differing only in the attention mask (causal for text, none for vision).

use crate::ggml::Tensor;
use crate::nn::{self, AttentionMask, LayerNorm, Linear};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::config::ClipActivation;

/// Pre-norm: `x += out_proj(attn(q, k, v of LN1(x)))`, `x += fc2(act(fc1(LN2(x))))`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EncoderLayer {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl EncoderLayer {
    /// Declares the weights under transformers names relative to `wb` (`encoder.layers.N`).
    pub(crate) fn new(
        wb: &WeightBuilder<'_, '_>,
        hidden: usize,
        intermediate: usize,
        eps: f32,
    ) -> Result<Self, RunnerError> {
        let (d, ff) = (hidden, intermediate);
        let attn = wb.pp("self_attn");
        let mlp = wb.pp("mlp");
        Ok(Self {
            ln1: LayerNorm::new(&wb.pp("layer_norm1"), d, eps, true)?,
            q: Linear::new(&attn.pp("q_proj"), d, d, true)?,
            k: Linear::new(&attn.pp("k_proj"), d, d, true)?,
            v: Linear::new(&attn.pp("v_proj"), d, d, true)?,
            out: Linear::new(&attn.pp("out_proj"), d, d, true)?,
            ln2: LayerNorm::new(&wb.pp("layer_norm2"), d, eps, true)?,
            fc1: Linear::new(&mlp.pp("fc1"), d, ff, true)?,
            fc2: Linear::new(&mlp.pp("fc2"), ff, d, true)?,
        })
    }

    /// x: [hidden, n] → [hidden, n]; `mask` `None` attends to every token.
    pub(crate) fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        heads: usize,
        act: ClipActivation,
        mask: Option<&AttentionMask<'g>>,
    ) -> Tensor<'g> {
        let h = self.ln1.forward(g, x);
        let (q, k, v) = (
            self.q.forward(g, h),
            self.k.forward(g, h),
            self.v.forward(g, h),
        );
        let attn = nn::attention(g, q, k, v, heads, mask);
        let x = g.add(x, self.out.forward(g, attn));

        let h = self.fc1.forward(g, self.ln2.forward(g, x));
        let h = match act {
            ClipActivation::QuickGelu => nn::quick_gelu(g, h),
            ClipActivation::Gelu => g.gelu_erf(h),
        };
        g.add(x, self.fc2.forward(g, h))
    }
}
