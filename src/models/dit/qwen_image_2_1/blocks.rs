//! One single-stream block of Qwen Image 2.1, run as two token groups (text prefix, target
//! image) that share weights and meet only in attention.
//!
//! Splitting the joint sequence this way expresses the block-causal mask directly: text
//! queries attend causally over the text keys, image queries over all text keys plus every
//! image key (no mask). The text group's K/V are all the image group needs from the prefix,
//! which is what the prefix cache stores.

use crate::dtype::DType;
use crate::ggml::Tensor;
use crate::nn::{self, AttentionMask, LayerNorm, Linear, RmsNorm, RopeLayout};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::config::{FfnLayout, QwenImage21Config, NORM_EPS};

/// Per-group modulation, shared by all blocks: `1 + scale` and `tanh(gate)` for the
/// attention and feed-forward branches, each [D, 1, B] (image) or [D, 1, 1] (text, t = 0).
#[derive(Clone, Copy)]
pub(super) struct Modulation<'g> {
    pub scale1: Tensor<'g>,
    pub gate1: Tensor<'g>,
    pub scale2: Tensor<'g>,
    pub gate2: Tensor<'g>,
}

/// A token group entering a block: its hidden states [D, n, B], modulation and rope tables
/// ([head_dim/2, n] cos and sin).
#[derive(Clone, Copy)]
pub(super) struct Group<'g> {
    pub x: Tensor<'g>,
    pub modulation: Modulation<'g>,
    pub cos: Tensor<'g>,
    pub sin: Tensor<'g>,
}

/// Where the text keys/values of one block come from.
pub(super) enum PrefixKv<'g, 'a> {
    /// Computed from the text group in this graph.
    Computed {
        group: Group<'g>,
        /// [L, L] causal mask for the text queries.
        mask: Tensor<'g>,
        /// Also keep them in the runner's cache: (key name, value name, storage type).
        store: Option<(String, String, DType)>,
        /// The text group's output is needed (not the last block).
        need_text: bool,
        cut_group: &'a str,
    },
    /// Read from the cache: K and V [D, L, B] in f32.
    Cached { k: Tensor<'g>, v: Tensor<'g> },
}

#[derive(Clone, Copy, Debug)]
enum Ffn {
    Split { proj: Linear, gate: Linear },
    Fused { gate_up: Linear },
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    ffn: Ffn,
    ffn_out: Linear,
    heads: usize,
    head_dim: usize,
}

impl Block {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &QwenImage21Config) -> Result<Self, RunnerError> {
        let d = c.hidden_size;
        let attn = wb.pp("attn");
        let mlp = wb.pp("img_mlp");
        let ffn = match c.ffn {
            FfnLayout::Split => Ffn::Split {
                proj: Linear::new(&mlp.pp("proj"), d, c.intermediate_size, false)?,
                gate: Linear::new(&mlp.pp("gate_layer"), d, c.intermediate_size, false)?,
            },
            FfnLayout::Fused => Ffn::Fused {
                gate_up: Linear::new(&mlp.pp("gate_up"), d, 2 * c.intermediate_size, false)?,
            },
        };
        Ok(Self {
            to_q: Linear::new(&attn.pp("to_q"), d, d, false)?,
            to_k: Linear::new(&attn.pp("to_k"), d, d, false)?,
            to_v: Linear::new(&attn.pp("to_v"), d, d, false)?,
            to_out: Linear::new(&attn.pp("to_out").pp(0), d, d, false)?,
            norm_q: RmsNorm::new(&attn.pp("norm_q"), c.head_dim, NORM_EPS)?,
            norm_k: RmsNorm::new(&attn.pp("norm_k"), c.head_dim, NORM_EPS)?,
            ffn,
            ffn_out: Linear::new(&mlp.pp("out"), c.intermediate_size, d, false)?,
            heads: c.heads,
            head_dim: c.head_dim,
        })
    }

    /// Runs the block; returns the text group's output (when computed and needed) and the
    /// image group's output.
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        img: Group<'g>,
        prefix: PrefixKv<'g, '_>,
    ) -> (Option<Tensor<'g>>, Tensor<'g>) {
        let ln = LayerNorm::plain(NORM_EPS);
        let h_img = g.mul(ln.forward(g, img.x), img.modulation.scale1);
        let (q_i, k_i, v_i) = self.qkv(g, h_img, img);

        let (txt_out, k_t, v_t) = match prefix {
            PrefixKv::Cached { k, v } => (None, k, v),
            PrefixKv::Computed {
                group,
                mask,
                store,
                need_text,
                cut_group,
            } => {
                let h_txt = g.mul(ln.forward(g, group.x), group.modulation.scale1);
                let (q_t, k_t, v_t) = self.qkv(g, h_txt, group);
                let out = need_text.then(|| {
                    let mask = AttentionMask(mask);
                    let a = nn::attention(g, q_t, k_t, v_t, self.heads, Some(&mask));
                    self.finish(g, group, a)
                });
                match store {
                    // The text queries use the exact values; the image queries read the
                    // stored ones back, so this step sees the same prefix as the cached
                    // steps, and the copies are made inside this layer.
                    Some((k_name, v_name, ty)) => {
                        let ks = g.cut(cut_group, "k", g.cache_store_as(&k_name, k_t, ty));
                        let vs = g.cut(cut_group, "v", g.cache_store_as(&v_name, v_t, ty));
                        (out, to_f32(g, ks), to_f32(g, vs))
                    }
                    None => (out, k_t, v_t),
                }
            }
        };

        let k = g.concat(k_t, k_i, 1);
        let v = g.concat(v_t, v_i, 1);
        let a = nn::attention(g, q_i, k, v, self.heads, None);
        (txt_out, self.finish(g, img, a))
    }

    /// Q, K (RMS-normed per head, then rotated) and V, each [D, n, B].
    fn qkv<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        h: Tensor<'g>,
        grp: Group<'g>,
    ) -> (Tensor<'g>, Tensor<'g>, Tensor<'g>) {
        let [d, n, b, _] = h.ne();
        let heads = |t: Tensor<'g>| g.reshape(t, [self.head_dim, self.heads, n, b]);
        let rotate = |t: Tensor<'g>| {
            let t = nn::apply_rope(g, t, grp.cos, grp.sin, RopeLayout::Interleaved);
            g.reshape(t, [d, n, b, 1])
        };
        let q = rotate(self.norm_q.forward(g, heads(self.to_q.forward(g, h))));
        let k = rotate(self.norm_k.forward(g, heads(self.to_k.forward(g, h))));
        let v = self.to_v.forward(g, h);
        (q, k, v)
    }

    /// Output projection, gated residuals and the gated SwiGLU branch.
    fn finish<'g>(&self, g: &'g GraphCtx<'g>, grp: Group<'g>, attn: Tensor<'g>) -> Tensor<'g> {
        let m = grp.modulation;
        let x = self.to_out.forward_onto(g, attn, grp.x, Some(m.gate1));
        let h = g.mul(LayerNorm::plain(NORM_EPS).forward(g, x), m.scale2);
        let inner = match self.ffn {
            Ffn::Split { proj, gate } => g.mul(g.silu(gate.forward(g, h)), proj.forward(g, h)),
            // ggml's swiglu: silu(first half) · second half, the fused layout's order.
            Ffn::Fused { gate_up } => g.swiglu(gate_up.forward(g, h)),
        };
        self.ffn_out.forward_onto(g, inner, x, Some(m.gate2))
    }
}

/// Cached K/V back to f32 for attention (a no-op for f32 storage).
pub(super) fn to_f32<'g>(g: &'g GraphCtx<'g>, t: Tensor<'g>) -> Tensor<'g> {
    if t.ty() == DType::F32 {
        t
    } else {
        g.cast(t, DType::F32)
    }
}
