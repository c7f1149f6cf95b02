//! FLUX.1's double-stream blocks (image and text each with their own weights, joint
//! attention) and single-stream blocks (one stream, attention and MLP in parallel), in either
//! checkpoint layout. Qwen Image's dual-stream block is the same computation under other
//! names ([`StreamNames`], [`DoubleBlock::split`]).

use crate::ggml::Tensor;
use crate::nn::{self, Linear, RmsNorm, RopeLayout};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::super::adaln::{columns, mod_rows, modulate, rows};

use super::config::{FluxConfig, FluxLayout, NORM_EPS};

/// Rope tables of the joint sequence [text…, image…], each [head_dim/2, n].
#[derive(Clone, Copy)]
pub(crate) struct Rope<'g> {
    pub cos: Tensor<'g>,
    pub sin: Tensor<'g>,
}

/// Q, K and V projections: one fused linear (BFL) or three.
#[derive(Clone, Copy, Debug)]
enum Qkv {
    Fused(Linear),
    Split(Linear, Linear, Linear),
}

impl Qkv {
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, h: Tensor<'g>, d: usize) -> [Tensor<'g>; 3] {
        match self {
            Qkv::Fused(l) => {
                let t = g.cont(l.forward(g, h));
                [rows(g, t, 0, d), rows(g, t, d, d), rows(g, t, 2 * d, d)]
            }
            Qkv::Split(q, k, v) => [q.forward(g, h), k.forward(g, h), v.forward(g, h)],
        }
    }
}

/// One stream's half of a double block.
#[derive(Clone, Copy, Debug)]
struct Stream {
    /// Per-block modulation from SiLU(vec) (FLUX); Chroma's come precomputed.
    modulation: Option<Linear>,
    qkv: Qkv,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    proj: Linear,
    mlp_in: Linear,
    mlp_out: Linear,
}

/// Attention heads of a block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub heads: usize,
    pub head_dim: usize,
}

impl From<&FluxConfig> for Heads {
    fn from(c: &FluxConfig) -> Self {
        Self {
            heads: c.heads,
            head_dim: c.head_dim,
        }
    }
}

/// Where one stream's weights of a split-projection double block live, relative to the block.
pub(crate) struct StreamNames<'a> {
    /// The per-block modulation linear (`None`: modulation comes from elsewhere, Chroma).
    pub modulation: Option<&'a str>,
    pub q: &'a str,
    pub k: &'a str,
    pub v: &'a str,
    pub norm_q: &'a str,
    pub norm_k: &'a str,
    pub proj: &'a str,
    /// The feed-forward (`{mlp}.net.0.proj`, `{mlp}.net.2`).
    pub mlp: &'a str,
}

/// Q, K (RMS-normed per head) and V of a stream's modulated input, each [D, n, B].
fn qkv_normed<'g>(
    g: &'g GraphCtx<'g>,
    qkv: &Qkv,
    norms: (&RmsNorm, &RmsNorm),
    h: Tensor<'g>,
    c: Heads,
) -> [Tensor<'g>; 3] {
    let [d, n, b, _] = h.ne();
    let [q, k, v] = qkv.forward(g, h, d);
    let heads = |t: Tensor<'g>| g.reshape(t, [c.head_dim, c.heads, n, b]);
    let flat = |t: Tensor<'g>| g.reshape(t, [d, n, b, 1]);
    [
        flat(norms.0.forward(g, heads(q))),
        flat(norms.1.forward(g, heads(k))),
        v,
    ]
}

/// Rotates joint-sequence q or k [D, n, B] by the rope tables.
fn rotate<'g>(g: &'g GraphCtx<'g>, t: Tensor<'g>, rope: Rope<'g>, c: Heads) -> Tensor<'g> {
    let [d, n, b, _] = t.ne();
    let t = g.reshape(t, [c.head_dim, c.heads, n, b]);
    let t = nn::apply_rope(g, t, rope.cos, rope.sin, RopeLayout::Interleaved);
    g.reshape(t, [d, n, b, 1])
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct DoubleBlock {
    img: Stream,
    txt: Stream,
}

impl DoubleBlock {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &FluxConfig) -> Result<Self, RunnerError> {
        let (d, hd, m) = (c.hidden_size, c.head_dim, c.mlp_hidden);
        let lin = |w: WeightBuilder<'_, '_>, i, o| Linear::new(&w, i, o, true);
        let modulation = |w: WeightBuilder<'_, '_>, k: usize| match c.chroma {
            Some(_) => Ok(None),
            None => Linear::new(&w, d, k * d, true).map(Some),
        };
        Ok(match c.layout {
            FluxLayout::Bfl => {
                let stream = |s: &str| -> Result<Stream, RunnerError> {
                    let attn = wb.pp(format!("{s}_attn"));
                    let norm = attn.pp("norm");
                    Ok(Stream {
                        modulation: modulation(wb.pp(format!("{s}_mod")).pp("lin"), 6)?,
                        qkv: Qkv::Fused(lin(attn.pp("qkv"), d, 3 * d)?),
                        norm_q: RmsNorm::named(&norm.pp("query_norm"), "scale", hd, NORM_EPS)?,
                        norm_k: RmsNorm::named(&norm.pp("key_norm"), "scale", hd, NORM_EPS)?,
                        proj: lin(attn.pp("proj"), d, d)?,
                        mlp_in: lin(wb.pp(format!("{s}_mlp")).pp(0), d, m)?,
                        mlp_out: lin(wb.pp(format!("{s}_mlp")).pp(2), m, d)?,
                    })
                };
                Self {
                    img: stream("img")?,
                    txt: stream("txt")?,
                }
            }
            FluxLayout::Diffusers => {
                let chroma = c.chroma.is_some();
                let names = |m: &'static str, qkv: [&'static str; 3], norms: [&'static str; 2]| {
                    StreamNames {
                        modulation: (!chroma).then_some(m),
                        q: qkv[0],
                        k: qkv[1],
                        v: qkv[2],
                        norm_q: norms[0],
                        norm_k: norms[1],
                        proj: "",
                        mlp: "",
                    }
                };
                let img = StreamNames {
                    proj: "attn.to_out.0",
                    mlp: "ff",
                    ..names(
                        "norm1.linear",
                        ["attn.to_q", "attn.to_k", "attn.to_v"],
                        ["attn.norm_q", "attn.norm_k"],
                    )
                };
                let txt = StreamNames {
                    proj: "attn.to_add_out",
                    mlp: "ff_context",
                    ..names(
                        "norm1_context.linear",
                        ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"],
                        ["attn.norm_added_q", "attn.norm_added_k"],
                    )
                };
                Self::split(wb, [&img, &txt], (d, hd, m))?
            }
        })
    }

    /// A block with separate q/k/v projections under `names` ([image, text]); `dims` =
    /// (hidden, head width, feed-forward width).
    pub(crate) fn split(
        wb: &WeightBuilder<'_, '_>,
        names: [&StreamNames<'_>; 2],
        (d, hd, m): (usize, usize, usize),
    ) -> Result<Self, RunnerError> {
        let lin = |path: &str, i, o| Linear::new(&wb.pp(path), i, o, true);
        let stream = |n: &StreamNames<'_>| -> Result<Stream, RunnerError> {
            let ff = wb.pp(n.mlp).pp("net");
            Ok(Stream {
                modulation: n.modulation.map(|p| lin(p, d, 6 * d)).transpose()?,
                qkv: Qkv::Split(lin(n.q, d, d)?, lin(n.k, d, d)?, lin(n.v, d, d)?),
                norm_q: RmsNorm::new(&wb.pp(n.norm_q), hd, NORM_EPS)?,
                norm_k: RmsNorm::new(&wb.pp(n.norm_k), hd, NORM_EPS)?,
                proj: lin(n.proj, d, d)?,
                mlp_in: Linear::new(&ff.pp(0).pp("proj"), d, m, true)?,
                mlp_out: Linear::new(&ff.pp(2), m, d, true)?,
            })
        };
        Ok(Self {
            img: stream(names[0])?,
            txt: stream(names[1])?,
        })
    }

    /// The block's (image, text) modulation rows from `vec` = SiLU(temb) [D, B] (FLUX); `None`
    /// for Chroma, whose rows come from its approximator.
    pub fn modulation<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        vec: Tensor<'g>,
        d: usize,
    ) -> Option<(Vec<Tensor<'g>>, Vec<Tensor<'g>>)> {
        let (i, t) = (self.img.modulation?, self.txt.modulation?);
        Some((
            mod_rows(g, i.forward(g, vec), d, 6),
            mod_rows(g, t.forward(g, vec), d, 6),
        ))
    }

    /// Runs the block on image tokens `x` [D, N, B] and text tokens `ctx` [D, L, B] with the
    /// (shift, scale, gate) × 2 rows `im` / `tm` and an optional additive key mask; returns
    /// the new (image, text) tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        ctx: Tensor<'g>,
        (im, tm): (&[Tensor<'g>], &[Tensor<'g>]),
        rope: Rope<'g>,
        mask: Option<Tensor<'g>>,
        c: Heads,
    ) -> (Tensor<'g>, Tensor<'g>) {
        let l = ctx.ne()[1];
        let hi = modulate(g, x, im[0], im[1], NORM_EPS);
        let ht = modulate(g, ctx, tm[0], tm[1], NORM_EPS);
        let [qi, ki, vi] = qkv_normed(
            g,
            &self.img.qkv,
            (&self.img.norm_q, &self.img.norm_k),
            hi,
            c,
        );
        let [qt, kt, vt] = qkv_normed(
            g,
            &self.txt.qkv,
            (&self.txt.norm_q, &self.txt.norm_k),
            ht,
            c,
        );
        let q = rotate(g, g.concat(qt, qi, 1), rope, c);
        let k = rotate(g, g.concat(kt, ki, 1), rope, c);
        let v = g.concat(vt, vi, 1);
        let mask = mask.map(nn::AttentionMask);
        let a = nn::attention(g, q, k, v, c.heads, mask.as_ref());
        let n = x.ne()[1];
        let (at, ai) = (columns(g, a, 0, l), columns(g, a, l, n));
        let finish = |s: &Stream, x: Tensor<'g>, a: Tensor<'g>, m: &[Tensor<'g>]| {
            let x = s.proj.forward_onto(g, a, x, Some(m[2]));
            let h = modulate(g, x, m[3], m[4], NORM_EPS);
            let f = s.mlp_in.forward_gelu_tanh(g, h);
            s.mlp_out.forward_onto(g, f, x, Some(m[5]))
        };
        (finish(&self.img, x, ai, im), finish(&self.txt, ctx, at, tm))
    }
}

/// A single block's input projections: BFL's `linear1` gives q, k, v and the MLP input at
/// once.
#[derive(Clone, Copy, Debug)]
enum SingleIn {
    Fused(Linear),
    Split { qkv: Qkv, mlp: Linear },
}

#[derive(Clone, Copy, Debug)]
pub(super) struct SingleBlock {
    /// Per-block modulation from SiLU(vec) (FLUX); Chroma's come precomputed.
    modulation: Option<Linear>,
    input: SingleIn,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    /// [attention, MLP] → D.
    out: Linear,
}

impl SingleBlock {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &FluxConfig) -> Result<Self, RunnerError> {
        let (d, hd, m) = (c.hidden_size, c.head_dim, c.mlp_hidden);
        let lin = |w: WeightBuilder<'_, '_>, i, o| Linear::new(&w, i, o, true);
        let modulation = |w: WeightBuilder<'_, '_>| match c.chroma {
            Some(_) => Ok(None),
            None => Linear::new(&w, d, 3 * d, true).map(Some),
        };
        Ok(match c.layout {
            FluxLayout::Bfl => {
                let norm = wb.pp("norm");
                Self {
                    modulation: modulation(wb.pp("modulation").pp("lin"))?,
                    input: SingleIn::Fused(lin(wb.pp("linear1"), d, 3 * d + m)?),
                    norm_q: RmsNorm::named(&norm.pp("query_norm"), "scale", hd, NORM_EPS)?,
                    norm_k: RmsNorm::named(&norm.pp("key_norm"), "scale", hd, NORM_EPS)?,
                    out: lin(wb.pp("linear2"), d + m, d)?,
                }
            }
            FluxLayout::Diffusers => {
                let attn = wb.pp("attn");
                Self {
                    modulation: modulation(wb.pp("norm").pp("linear"))?,
                    input: SingleIn::Split {
                        qkv: Qkv::Split(
                            lin(attn.pp("to_q"), d, d)?,
                            lin(attn.pp("to_k"), d, d)?,
                            lin(attn.pp("to_v"), d, d)?,
                        ),
                        mlp: lin(wb.pp("proj_mlp"), d, m)?,
                    },
                    norm_q: RmsNorm::new(&attn.pp("norm_q"), hd, NORM_EPS)?,
                    norm_k: RmsNorm::new(&attn.pp("norm_k"), hd, NORM_EPS)?,
                    out: lin(wb.pp("proj_out"), d + m, d)?,
                }
            }
        })
    }

    /// The block's (shift, scale, gate) rows from `vec` = SiLU(temb) (FLUX); `None` for Chroma.
    pub fn modulation<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        vec: Tensor<'g>,
        d: usize,
    ) -> Option<Vec<Tensor<'g>>> {
        Some(mod_rows(g, self.modulation?.forward(g, vec), d, 3))
    }

    /// Runs the block on the joint tokens `x` [D, L + N, B] with its modulation rows `m`.
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        m: &[Tensor<'g>],
        rope: Rope<'g>,
        mask: Option<Tensor<'g>>,
        c: &FluxConfig,
    ) -> Tensor<'g> {
        let d = c.hidden_size;
        let h = modulate(g, x, m[0], m[1], NORM_EPS);
        let (qkv, mlp) = match &self.input {
            SingleIn::Fused(l) => {
                let t = g.cont(l.forward(g, h));
                let qkv = [rows(g, t, 0, d), rows(g, t, d, d), rows(g, t, 2 * d, d)];
                (qkv, rows(g, t, 3 * d, c.mlp_hidden))
            }
            SingleIn::Split { qkv, mlp } => (qkv.forward(g, h, d), mlp.forward(g, h)),
        };
        let [q, k, v] = qkv;
        let [_, n, b, _] = h.ne();
        let heads = |t: Tensor<'g>| g.reshape(t, [c.head_dim, c.heads, n, b]);
        let flat = |t: Tensor<'g>| g.reshape(t, [d, n, b, 1]);
        let q = rotate(g, flat(self.norm_q.forward(g, heads(q))), rope, c.into());
        let k = rotate(g, flat(self.norm_k.forward(g, heads(k))), rope, c.into());
        let mask = mask.map(nn::AttentionMask);
        let a = nn::attention(g, q, k, v, c.heads, mask.as_ref());
        let cat = g.concat(a, nn::gelu_tanh(g, mlp), 0);
        self.out.forward_onto(g, cat, x, Some(m[2]))
    }
}
