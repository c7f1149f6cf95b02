//! One Z-Image transformer block: self-attention (q/k RMS norms, 3-axis rope) and a SwiGLU
//! feed-forward, each sandwiched between two RMS norms; the noise refiner and the main layers
//! modulate both with `1 + scale` and tanh gates from the timestep, the context refiner does
//! not modulate.

use crate::ggml::Tensor;
use crate::nn::{self, Linear, RmsNorm, RopeLayout};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::super::adaln::{mod_rows, rows};
use super::config::{ZImageConfig, ZImageLayout, NORM_EPS, QK_NORM_EPS};

/// Rope tables of one token sequence: cos / sin [head_dim/2, 1, n, 1].
#[derive(Clone, Copy)]
pub struct Rope<'g> {
    pub cos: Tensor<'g>,
    pub sin: Tensor<'g>,
}

#[derive(Clone, Copy, Debug)]
enum Qkv {
    Fused(Linear),
    Split(Linear, Linear, Linear),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    qkv: Qkv,
    out: Linear,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    w1: Linear,
    w2: Linear,
    w3: Linear,
    attention_norm1: RmsNorm,
    attention_norm2: RmsNorm,
    ffn_norm1: RmsNorm,
    ffn_norm2: RmsNorm,
    /// adaLN_modulation.0: timestep embedding → [scale_msa, gate_msa, scale_mlp, gate_mlp].
    modulation: Option<Linear>,
}

impl Block {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &ZImageConfig,
        modulated: bool,
    ) -> Result<Self, RunnerError> {
        let d = c.dim;
        let plain = |w: WeightBuilder<'_, '_>, i, o| Linear::new(&w, i, o, false);
        let a = wb.pp("attention");
        let original = c.layout == ZImageLayout::Original;
        let qkv = if original {
            Qkv::Fused(plain(a.pp("qkv"), d, 3 * d)?)
        } else {
            Qkv::Split(
                plain(a.pp("to_q"), d, d)?,
                plain(a.pp("to_k"), d, d)?,
                plain(a.pp("to_v"), d, d)?,
            )
        };
        let (out, qn, kn) = if original {
            (a.pp("out"), a.pp("q_norm"), a.pp("k_norm"))
        } else {
            (a.pp("to_out").pp(0), a.pp("norm_q"), a.pp("norm_k"))
        };
        let ff = wb.pp("feed_forward");
        let norm = |name: &str| RmsNorm::new(&wb.pp(name), d, NORM_EPS);
        Ok(Self {
            qkv,
            out: plain(out, d, d)?,
            norm_q: RmsNorm::new(&qn, c.head_dim, QK_NORM_EPS)?,
            norm_k: RmsNorm::new(&kn, c.head_dim, QK_NORM_EPS)?,
            w1: plain(ff.pp("w1"), d, c.ffn_hidden)?,
            w2: plain(ff.pp("w2"), c.ffn_hidden, d)?,
            w3: plain(ff.pp("w3"), d, c.ffn_hidden)?,
            attention_norm1: norm("attention_norm1")?,
            attention_norm2: norm("attention_norm2")?,
            ffn_norm1: norm("ffn_norm1")?,
            ffn_norm2: norm("ffn_norm2")?,
            modulation: if modulated {
                Some(Linear::new(
                    &wb.pp("adaLN_modulation").pp(0),
                    c.adaln_dim,
                    4 * d,
                    true,
                )?)
            } else {
                None
            },
        })
    }

    fn attention<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        h: Tensor<'g>,
        rope: Rope<'g>,
        c: &ZImageConfig,
    ) -> Tensor<'g> {
        let [d, n, b, _] = h.ne();
        let [q, k, v] = match self.qkv {
            Qkv::Fused(l) => {
                let t = g.cont(l.forward(g, h));
                [rows(g, t, 0, d), rows(g, t, d, d), rows(g, t, 2 * d, d)]
            }
            Qkv::Split(q, k, v) => [q.forward(g, h), k.forward(g, h), v.forward(g, h)],
        };
        let heads = |t: Tensor<'g>| g.reshape(t, [c.head_dim, c.heads, n, b]);
        let flat = |t: Tensor<'g>| g.reshape(t, [d, n, b, 1]);
        let rotate = |t: Tensor<'g>, norm: &RmsNorm| {
            let t = norm.forward(g, heads(t));
            flat(nn::apply_rope(
                g,
                t,
                rope.cos,
                rope.sin,
                RopeLayout::Interleaved,
            ))
        };
        let q = rotate(q, &self.norm_q);
        let k = rotate(k, &self.norm_k);
        self.out
            .forward(g, nn::attention(g, q, k, v, c.heads, None))
    }

    fn ffn<'g>(&self, g: &'g GraphCtx<'g>, h: Tensor<'g>) -> Tensor<'g> {
        let gate = g.silu(self.w1.forward(g, h));
        self.w2.forward(g, g.mul(gate, self.w3.forward(g, h)))
    }

    /// Runs the block on `x` [D, n, B]; `adaln` [adaln_dim, B] is the timestep embedding
    /// (ignored by unmodulated blocks).
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        adaln: Tensor<'g>,
        rope: Rope<'g>,
        c: &ZImageConfig,
    ) -> Tensor<'g> {
        let Some(m) = self.modulation else {
            let a = self.attention(g, self.attention_norm1.forward(g, x), rope, c);
            let x = g.add(x, self.attention_norm2.forward(g, a));
            let f = self.ffn(g, self.ffn_norm1.forward(g, x));
            return g.add(x, self.ffn_norm2.forward(g, f));
        };
        let r = mod_rows(g, m.forward(g, adaln), c.dim, 4);
        let scale = |t: Tensor<'g>| g.scale_bias(t, 1.0, 1.0);
        let (scale_msa, gate_msa, scale_mlp, gate_mlp) =
            (scale(r[0]), g.tanh(r[1]), scale(r[2]), g.tanh(r[3]));
        let h = g.mul(self.attention_norm1.forward(g, x), scale_msa);
        let a = self.attention(g, h, rope, c);
        let x = g.add(x, g.mul(self.attention_norm2.forward(g, a), gate_msa));
        let h = g.mul(self.ffn_norm1.forward(g, x), scale_mlp);
        let f = self.ffn(g, h);
        g.add(x, g.mul(self.ffn_norm2.forward(g, f), gate_mlp))
    }
}
