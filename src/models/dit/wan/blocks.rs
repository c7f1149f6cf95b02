//! One Wan transformer block: rope self-attention, cross-attention to the text (and, for
//! I2V, separately to the image tokens, the two results summed), a tanh-GELU feed-forward;
//! self-attention and feed-forward are modulated by six rows of `table + time projection`.

use crate::ggml::Tensor;
use crate::nn::{self, LayerNorm, Linear, RmsNorm, RopeLayout};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::super::adaln;
use super::config::{WanConfig, NORM_EPS};
use super::names::AttnNames;

/// f32 bytes.
const ES: usize = 4;

/// Rope tables of the patch tokens: cos / sin [head_dim/2, 1, N, 1].
#[derive(Clone, Copy)]
pub(super) struct Rope<'g> {
    pub cos: Tensor<'g>,
    pub sin: Tensor<'g>,
}

/// What every block reads besides its input.
#[derive(Clone, Copy)]
pub(super) struct BlockInputs<'g> {
    /// The time projection [D, 6, F]: one column of six rows per timestep group (F = 1, or
    /// one per patch frame with per-frame timesteps).
    pub time_proj: Tensor<'g>,
    pub rope: Rope<'g>,
    /// Embedded text [D, L].
    pub text: Tensor<'g>,
    /// Embedded image tokens [D, n] (I2V).
    pub image: Option<Tensor<'g>>,
}

/// `y` with its tokens grouped per timestep [D, N/F, F], so that [D, 1, F] rows broadcast.
fn grouped<'g>(g: &'g GraphCtx<'g>, y: Tensor<'g>, f: usize) -> Tensor<'g> {
    let [d, n, ..] = y.ne();
    g.reshape(y, [d, n / f, f, 1])
}

/// `LN(x)·(1 + scale) + shift` for x [D, N] and rows [D, 1, F] (one op on the CPU: the norm
/// is per token, so the tokens are grouped per timestep first).
pub(super) fn modulate<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    shift: Tensor<'g>,
    scale: Tensor<'g>,
) -> Tensor<'g> {
    let f = shift.ne()[2];
    let y = adaln::modulate(g, grouped(g, x, f), shift, scale, NORM_EPS);
    g.reshape(y, x.ne())
}

/// `x + out(h)·gate` for x [D, N], h [in, N] and gate [D, 1, F]: the output projection onto
/// the residual in one op on the CPU.
fn gated_linear<'g>(
    g: &'g GraphCtx<'g>,
    out: &Linear,
    h: Tensor<'g>,
    x: Tensor<'g>,
    gate: Tensor<'g>,
) -> Tensor<'g> {
    let f = gate.ne()[2];
    let y = out.forward_onto(g, grouped(g, h, f), grouped(g, x, f), Some(gate));
    g.reshape(y, x.ne())
}

/// Row `k` of a [D, R, F] tensor as a contiguous [D, 1, F].
pub(super) fn row<'g>(g: &'g GraphCtx<'g>, t: Tensor<'g>, k: usize) -> Tensor<'g> {
    let [d, r, f, _] = t.ne();
    let v = g.view(
        t,
        [d, 1, f, 1],
        [d * ES, d * r * ES, d * r * f * ES],
        k * d * ES,
    );
    g.cont(v)
}

#[derive(Clone, Copy, Debug)]
struct ImageKv {
    k: Linear,
    v: Linear,
    norm_k: Option<RmsNorm>,
}

#[derive(Clone, Copy, Debug)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// RMS norms across all heads (`rms_norm_across_heads`).
    norm_q: Option<RmsNorm>,
    norm_k: Option<RmsNorm>,
    image: Option<ImageKv>,
}

impl Attention {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        n: &AttnNames,
        c: &WanConfig,
        image: bool,
    ) -> Result<Self, RunnerError> {
        let d = c.dim;
        let lin = |name: &str| Linear::new(&wb.pp(name), d, d, true);
        let norm = |name: &str| {
            c.qk_norm
                .then(|| RmsNorm::new(&wb.pp(name), d, NORM_EPS))
                .transpose()
        };
        let image = if image {
            Some(ImageKv {
                k: lin(n.k_img)?,
                v: lin(n.v_img)?,
                norm_k: norm(n.norm_k_img)?,
            })
        } else {
            None
        };
        Ok(Self {
            q: lin(n.q)?,
            k: lin(n.k)?,
            v: lin(n.v)?,
            o: lin(n.o)?,
            norm_q: norm(n.norm_q)?,
            norm_k: norm(n.norm_k)?,
            image,
        })
    }

    fn project<'g>(
        g: &'g GraphCtx<'g>,
        lin: &Linear,
        norm: Option<&RmsNorm>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let y = lin.forward(g, x);
        match norm {
            Some(n) => n.forward(g, y),
            None => y,
        }
    }

    /// The heads' output, before the output projection (which the block runs onto its
    /// residual).
    fn self_attention<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        h: Tensor<'g>,
        rope: Rope<'g>,
        c: &WanConfig,
    ) -> Tensor<'g> {
        let [d, n, ..] = h.ne();
        let rotate = |t: Tensor<'g>| {
            let t = g.reshape(t, [c.head_dim, c.heads, n, 1]);
            let t = nn::apply_rope(g, t, rope.cos, rope.sin, RopeLayout::Interleaved);
            g.reshape(t, [d, n, 1, 1])
        };
        let q = rotate(Self::project(g, &self.q, self.norm_q.as_ref(), h));
        let k = rotate(Self::project(g, &self.k, self.norm_k.as_ref(), h));
        let v = self.v.forward(g, h);
        nn::attention(g, q, k, v, c.heads, None)
    }

    /// The heads' output (text, plus image for I2V), before the output projection.
    fn cross_attention<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        h: Tensor<'g>,
        text: Tensor<'g>,
        image: Option<Tensor<'g>>,
        heads: usize,
    ) -> Tensor<'g> {
        let q = Self::project(g, &self.q, self.norm_q.as_ref(), h);
        let k = Self::project(g, &self.k, self.norm_k.as_ref(), text);
        let mut out = nn::attention(g, q, k, self.v.forward(g, text), heads, None);
        if let (Some(kv), Some(img)) = (&self.image, image) {
            let k = Self::project(g, &kv.k, kv.norm_k.as_ref(), img);
            let v = kv.v.forward(g, img);
            out = g.add(out, nn::attention(g, q, k, v, heads, None));
        }
        out
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    self_attn: Attention,
    cross_attn: Attention,
    cross_norm: Option<LayerNorm>,
    ffn_in: Linear,
    ffn_out: Linear,
    /// [1, 6, D] (ggml [D, 6]): shift, scale, gate of self-attention, then of the FFN.
    table: Param,
}

impl Block {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &WanConfig) -> Result<Self, RunnerError> {
        let n = c.layout.names();
        let d = c.dim;
        let cross_norm = c
            .cross_attn_norm
            .then(|| LayerNorm::new(&wb.pp(n.cross_norm), d, NORM_EPS, true))
            .transpose()?;
        Ok(Self {
            self_attn: Attention::new(&wb.pp(n.self_attn), &n.attn, c, false)?,
            cross_attn: Attention::new(&wb.pp(n.cross_attn), &n.attn, c, c.image.is_some())?,
            cross_norm,
            ffn_in: Linear::new(&wb.pp(n.ffn[0]), d, c.ffn_dim, true)?,
            ffn_out: Linear::new(&wb.pp(n.ffn[1]), c.ffn_dim, d, true)?,
            table: wb.get(n.table, [d, 6, 1, 1], Storage::F32)?,
        })
    }

    /// Runs the block on the patch tokens `x` [D, N].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        inputs: &BlockInputs<'g>,
        c: &WanConfig,
    ) -> Tensor<'g> {
        let e = g.add(inputs.time_proj, g.param(self.table));
        let m: Vec<Tensor<'g>> = (0..6).map(|k| row(g, e, k)).collect();

        let h = modulate(g, x, m[0], m[1]);
        let a = self.self_attn.self_attention(g, h, inputs.rope, c);
        let x = gated_linear(g, &self.self_attn.o, a, x, m[2]);

        let h = match &self.cross_norm {
            Some(norm) => norm.forward(g, x),
            None => x,
        };
        let a = self
            .cross_attn
            .cross_attention(g, h, inputs.text, inputs.image, c.heads);
        let x = self.cross_attn.o.forward_onto(g, a, x, None);

        let h = modulate(g, x, m[3], m[4]);
        let h = self.ffn_in.forward_gelu_tanh(g, h);
        gated_linear(g, &self.ffn_out, h, x, m[5])
    }
}
