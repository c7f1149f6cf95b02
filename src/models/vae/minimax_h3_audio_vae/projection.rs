//! `pre_block` (diffusers `MiniMaxH3AudioAttnProjection`): narrows the encoder trunk from
//! `latent_dim` to `latent_channels` per frame, over tokens `[latent_dim, T, N]`:
//!
//! `h = proj(norm3(x)) + attn(norm1(x))`, then `h + mlp(norm2(h))`, where `attn` is causal
//! self-attention with a bias-less fused `qkv` (query and value biases stored apart, the key
//! bias a zero buffer), whose heads are averaged instead of concatenated and whose head
//! width is adaptively average-pooled to `latent_channels` before its own `proj`; `mlp` is a
//! GeGLU (`gelu_tanh(w0 x) · w1 x`, then `w2`). Norms are `nn.LayerNorm` (ε 1e-5).

use super::config::{MiniMaxH3AudioVaeConfig, ORIGIN};
use crate::ggml::Tensor;
use crate::nn::{attention, gelu_tanh, AttentionMask, LayerNorm, Linear};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

/// `nn.LayerNorm`'s default ε.
const LAYER_NORM_EPS: f32 = 1e-5;

/// The matrix `[in, out]` (ggml order) that averages `heads` heads of `in / heads` values and
/// then pools that width to `out` as `F.adaptive_avg_pool1d` does (window j spans
/// `⌊j·L/out⌋ .. ⌈(j+1)·L/out⌉`).
pub(super) fn head_pool_matrix(input: usize, heads: usize, out: usize) -> Vec<f32> {
    let len = input / heads;
    let mut m = vec![0.0f32; input * out];
    for j in 0..out {
        let start = j * len / out;
        let end = ((j + 1) * len).div_ceil(out);
        let w = 1.0 / (heads * (end - start)) as f32;
        for h in 0..heads {
            for d in start..end {
                m[j * input + h * len + d] = w;
            }
        }
    }
    m
}

#[derive(Clone, Debug)]
struct CausalAttention {
    qkv: Linear,
    q_bias: Param,
    k_bias: Option<Param>,
    v_bias: Param,
    proj: Linear,
}

#[derive(Clone, Debug)]
struct GeGluMlp {
    norm: LayerNorm,
    w0: Linear,
    w1: Linear,
    w2: Linear,
}

#[derive(Clone, Debug)]
pub(super) struct Projection {
    norm1: LayerNorm,
    attn: CausalAttention,
    proj: Linear,
    norm3: LayerNorm,
    norm2: LayerNorm,
    mlp: GeGluMlp,
    width: usize,
    channels: usize,
    heads: usize,
}

impl Projection {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &MiniMaxH3AudioVaeConfig,
    ) -> Result<Self, RunnerError> {
        let wb = wb.pp("pre_block");
        let (width, channels) = (c.latent_dim, c.latent_channels);
        let a = wb.pp("attn");
        let vec = |name: &str| a.get(name, [width, 1, 1, 1], Storage::F32);
        let attn = CausalAttention {
            qkv: Linear::new(&a.pp("qkv"), width, 3 * width, false)?,
            q_bias: vec("q_bias")?,
            k_bias: a.maybe("zero_k_bias", [width, 1, 1, 1], Storage::F32)?,
            v_bias: vec("v_bias")?,
            proj: Linear::new(&a.pp("proj"), channels, channels, true)?,
        };
        let m = wb.pp("mlp");
        let hidden = m.require_ne("w0.weight", ORIGIN)?[1];
        let mlp = GeGluMlp {
            norm: LayerNorm::new(&m.pp("norm"), channels, LAYER_NORM_EPS, true)?,
            w0: Linear::new(&m.pp("w0"), channels, hidden, true)?,
            w1: Linear::new(&m.pp("w1"), channels, hidden, true)?,
            w2: Linear::new(&m.pp("w2"), hidden, channels, true)?,
        };
        Ok(Self {
            norm1: LayerNorm::new(&wb.pp("norm1"), width, LAYER_NORM_EPS, true)?,
            attn,
            proj: Linear::new(&wb.pp("proj"), width, channels, true)?,
            norm3: LayerNorm::new(&wb.pp("norm3"), width, LAYER_NORM_EPS, true)?,
            norm2: LayerNorm::new(&wb.pp("norm2"), channels, LAYER_NORM_EPS, true)?,
            mlp,
            width,
            channels,
            heads: c.num_heads,
        })
    }

    /// x: `[latent_dim, T, N]` → `[latent_channels, T, N]`.
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let h = g.add(
            self.proj.forward(g, self.norm3.forward(g, x)),
            self.attention(g, self.norm1.forward(g, x)),
        );
        let m = &self.mlp;
        let y = m.norm.forward(g, self.norm2.forward(g, h));
        let y = m.w2.forward(
            g,
            g.mul(gelu_tanh(g, m.w0.forward(g, y)), m.w1.forward(g, y)),
        );
        g.add(h, y)
    }

    fn attention<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let a = &self.attn;
        let w = self.width;
        let [_, t, n, _] = x.ne();
        let qkv = a.qkv.forward(g, x);
        let nb = qkv.nb();
        let part = |i: usize, bias: Option<Param>| {
            let v = g.cont(g.view(qkv, [w, t, n, 1], [nb[1], nb[2], nb[3]], i * w * nb[0]));
            match bias {
                Some(b) => g.add(v, g.param(b)),
                None => v,
            }
        };
        let (q, k, v) = (
            part(0, Some(a.q_bias)),
            part(1, a.k_bias),
            part(2, Some(a.v_bias)),
        );
        let mask: Vec<f32> = (0..t)
            .flat_map(|qi| (0..t).map(move |ki| if ki <= qi { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let mask = AttentionMask(g.input_f32("minimax_h3_audio.causal_mask", [t, t, 1, 1], mask));
        let o = attention(g, q, k, v, self.heads, Some(&mask));
        let pool = head_pool_matrix(w, self.heads, self.channels);
        let pool = g.input_f32("minimax_h3_audio.head_pool", [w, self.channels, 1, 1], pool);
        a.proj.forward(g, g.mul_mat(pool, g.cont(o)))
    }
}

#[cfg(test)]
mod tests {
    use super::head_pool_matrix;

    #[test]
    fn pool_matrix_rows_average_heads_and_windows() {
        // 2 heads of 3 values pooled to 2: windows [0, 2) and [1, 3).
        let m = head_pool_matrix(6, 2, 2);
        let q = 0.25;
        assert_eq!(&m[..6], &[q, q, 0.0, q, q, 0.0]);
        assert_eq!(&m[6..], &[0.0, q, q, 0.0, q, q]);
        // Even split: 8 values, one head, to 4 → pairs.
        let m = head_pool_matrix(8, 1, 4);
        assert_eq!(&m[8..16], &[0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0]);
    }
}
