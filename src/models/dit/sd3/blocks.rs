//! One MMDiT joint block: image (`x_block`) and text (`context_block`) streams with their own
//! weights, joint attention, and for SD3.5 medium a second image-only attention.

use crate::ggml::Tensor;
use crate::nn::{self, Linear, RmsNorm};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::super::adaln::{columns, mod_rows, modulate, rows};

use super::config::{Sd3Config, Sd3Layout, NORM_EPS};

/// An attention's projections: q, k, v (fused in SAI files), optional q/k RMS norms, output.
#[derive(Clone, Copy, Debug)]
struct Attn {
    qkv: Option<Linear>,
    split: Option<(Linear, Linear, Linear)>,
    norms: Option<(RmsNorm, RmsNorm)>,
    out: Option<Linear>,
}

impl Attn {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        names: AttnNames<'_>,
        c: &Sd3Config,
        with_out: bool,
    ) -> Result<Self, RunnerError> {
        let d = c.hidden_size;
        let lin = |n: &str, o| Linear::new(&wb.pp(n), d, o, true);
        let (qkv, split) = match names.qkv {
            Ok(n) => (Some(lin(n, 3 * d)?), None),
            Err((q, k, v)) => (None, Some((lin(q, d)?, lin(k, d)?, lin(v, d)?))),
        };
        let norms = if c.qk_norm {
            Some((
                RmsNorm::new(&wb.pp(names.norm_q), c.head_dim, NORM_EPS)?,
                RmsNorm::new(&wb.pp(names.norm_k), c.head_dim, NORM_EPS)?,
            ))
        } else {
            None
        };
        let out = with_out.then(|| lin(names.out, d)).transpose()?;
        Ok(Self {
            qkv,
            split,
            norms,
            out,
        })
    }

    /// Q (normed), K (normed), V of `h` [D, n, B].
    fn qkv<'g>(&self, g: &'g GraphCtx<'g>, h: Tensor<'g>, c: &Sd3Config) -> [Tensor<'g>; 3] {
        let [d, n, b, _] = h.ne();
        let [q, k, v] = match (&self.qkv, &self.split) {
            (Some(l), _) => {
                let t = g.cont(l.forward(g, h));
                [rows(g, t, 0, d), rows(g, t, d, d), rows(g, t, 2 * d, d)]
            }
            (None, Some((q, k, v))) => [q.forward(g, h), k.forward(g, h), v.forward(g, h)],
            _ => unreachable!("attention projections are declared"),
        };
        match &self.norms {
            Some((nq, nk)) => {
                let heads = |t: Tensor<'g>| g.reshape(t, [c.head_dim, c.heads, n, b]);
                let flat = |t: Tensor<'g>| g.reshape(t, [d, n, b, 1]);
                [
                    flat(nq.forward(g, heads(q))),
                    flat(nk.forward(g, heads(k))),
                    v,
                ]
            }
            None => [q, k, v],
        }
    }
}

/// Weight names of one attention.
#[derive(Clone, Copy)]
struct AttnNames<'a> {
    /// The fused projection, or the three split ones.
    qkv: Result<&'a str, (&'a str, &'a str, &'a str)>,
    norm_q: &'a str,
    norm_k: &'a str,
    out: &'a str,
}

/// One stream of a block.
#[derive(Clone, Copy, Debug)]
struct Stream {
    modulation: Linear,
    attn: Attn,
    /// (fc1, fc2); absent in the last block's text stream.
    mlp: Option<(Linear, Linear)>,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct JointBlock {
    x: Stream,
    ctx: Stream,
    /// SD3.5 medium's second image attention.
    attn2: Option<Attn>,
    /// The last block's text stream only feeds attention (2-row modulation, no output).
    pre_only: bool,
}

impl JointBlock {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &Sd3Config,
        last: bool,
        dual: bool,
    ) -> Result<Self, RunnerError> {
        let (d, m) = (c.hidden_size, c.mlp_hidden);
        let lin = |w: WeightBuilder<'_, '_>, i, o| Linear::new(&w, i, o, true);
        let x_mods = if dual { 9 } else { 6 };
        let ctx_mods = if last { 2 } else { 6 };
        Ok(match c.layout {
            Sd3Layout::Sai => {
                let sai = |blk: &WeightBuilder<'_, '_>, attn: &str, with_out| {
                    let (qkv, nq, nk, out) = (
                        format!("{attn}.qkv"),
                        format!("{attn}.ln_q"),
                        format!("{attn}.ln_k"),
                        format!("{attn}.proj"),
                    );
                    Attn::new(
                        blk,
                        AttnNames {
                            qkv: Ok(&qkv),
                            norm_q: &nq,
                            norm_k: &nk,
                            out: &out,
                        },
                        c,
                        with_out,
                    )
                };
                let (xb, cb) = (wb.pp("x_block"), wb.pp("context_block"));
                let mlp = |b: &WeightBuilder<'_, '_>| -> Result<(Linear, Linear), RunnerError> {
                    Ok((
                        lin(b.pp("mlp").pp("fc1"), d, m)?,
                        lin(b.pp("mlp").pp("fc2"), m, d)?,
                    ))
                };
                Self {
                    x: Stream {
                        modulation: lin(xb.pp("adaLN_modulation").pp(1), d, x_mods * d)?,
                        attn: sai(&xb, "attn", true)?,
                        mlp: Some(mlp(&xb)?),
                    },
                    ctx: Stream {
                        modulation: lin(cb.pp("adaLN_modulation").pp(1), d, ctx_mods * d)?,
                        attn: sai(&cb, "attn", !last)?,
                        mlp: (!last).then(|| mlp(&cb)).transpose()?,
                    },
                    attn2: dual.then(|| sai(&xb, "attn2", true)).transpose()?,
                    pre_only: last,
                }
            }
            Sd3Layout::Diffusers => {
                let attn = wb.pp("attn");
                let ff = |name: &str| -> Result<(Linear, Linear), RunnerError> {
                    let net = wb.pp(name).pp("net");
                    Ok((lin(net.pp(0).pp("proj"), d, m)?, lin(net.pp(2), m, d)?))
                };
                let x_attn = Attn::new(
                    &attn,
                    AttnNames {
                        qkv: Err(("to_q", "to_k", "to_v")),
                        norm_q: "norm_q",
                        norm_k: "norm_k",
                        out: "to_out.0",
                    },
                    c,
                    true,
                )?;
                let c_attn = Attn::new(
                    &attn,
                    AttnNames {
                        qkv: Err(("add_q_proj", "add_k_proj", "add_v_proj")),
                        norm_q: "norm_added_q",
                        norm_k: "norm_added_k",
                        out: "to_add_out",
                    },
                    c,
                    !last,
                )?;
                let attn2 = dual
                    .then(|| {
                        Attn::new(
                            &wb.pp("attn2"),
                            AttnNames {
                                qkv: Err(("to_q", "to_k", "to_v")),
                                norm_q: "norm_q",
                                norm_k: "norm_k",
                                out: "to_out.0",
                            },
                            c,
                            true,
                        )
                    })
                    .transpose()?;
                Self {
                    x: Stream {
                        modulation: lin(wb.pp("norm1").pp("linear"), d, x_mods * d)?,
                        attn: x_attn,
                        mlp: Some(ff("ff")?),
                    },
                    ctx: Stream {
                        modulation: lin(wb.pp("norm1_context").pp("linear"), d, ctx_mods * d)?,
                        attn: c_attn,
                        mlp: (!last).then(|| ff("ff_context")).transpose()?,
                    },
                    attn2,
                    pre_only: last,
                }
            }
        })
    }

    /// Runs the block on image tokens `x` [D, N, B] and text tokens `ctx` [D, L, B] under
    /// `vec` = SiLU(c) [D, B]; returns the image tokens and, unless this is the last block,
    /// the text tokens.
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        ctx: Tensor<'g>,
        vec: Tensor<'g>,
        c: &Sd3Config,
    ) -> (Tensor<'g>, Option<Tensor<'g>>) {
        let d = c.hidden_size;
        let xm = mod_rows(
            g,
            self.x.modulation.forward(g, vec),
            d,
            if self.attn2.is_some() { 9 } else { 6 },
        );
        let cm_all = self.ctx.modulation.forward(g, vec);
        let (n, l) = (x.ne()[1], ctx.ne()[1]);
        let hx = modulate(g, x, xm[0], xm[1], NORM_EPS);
        let (hc, cm) = if self.pre_only {
            let r = mod_rows(g, cm_all, d, 2);
            let (shift, scale) = match c.layout {
                Sd3Layout::Sai => (r[0], r[1]),
                Sd3Layout::Diffusers => (r[1], r[0]),
            };
            (modulate(g, ctx, shift, scale, NORM_EPS), None)
        } else {
            let r = mod_rows(g, cm_all, d, 6);
            (modulate(g, ctx, r[0], r[1], NORM_EPS), Some(r))
        };
        let [qx, kx, vx] = self.x.attn.qkv(g, hx, c);
        let [qc, kc, vc] = self.ctx.attn.qkv(g, hc, c);
        let a = nn::attention(
            g,
            g.concat(qx, qc, 1),
            g.concat(kx, kc, 1),
            g.concat(vx, vc, 1),
            c.heads,
            None,
        );
        let (ax, ac) = (columns(g, a, 0, n), columns(g, a, n, l));
        // residual + gate ⊙ out(a): one op on the CPU.
        let proj = |s: &Stream, a, residual, gate| {
            let out = s.attn.out.expect("output projection");
            out.forward_onto(g, a, residual, Some(gate))
        };
        let x_in = x;
        let mut x = proj(&self.x, ax, x, xm[2]);
        if let Some(attn2) = &self.attn2 {
            // SD3.5 medium: a second attention over the image alone, modulated from the
            // block's input.
            let [q, k, v] = attn2.qkv(g, modulate(g, x_in, xm[6], xm[7], NORM_EPS), c);
            let a2 = nn::attention(g, q, k, v, c.heads, None);
            let out = attn2.out.expect("output projection");
            x = out.forward_onto(g, a2, x, Some(xm[8]));
        }
        // residual + gate ⊙ fc2(gelu(fc1(h))).
        let ff = |s: &Stream, h, residual, gate| {
            let (fc1, fc2) = s.mlp.expect("feed-forward");
            fc2.forward_onto(g, fc1.forward_gelu_tanh(g, h), residual, Some(gate))
        };
        x = ff(&self.x, modulate(g, x, xm[3], xm[4], NORM_EPS), x, xm[5]);
        let ctx = cm.map(|cm| {
            let t = proj(&self.ctx, ac, ctx, cm[2]);
            ff(&self.ctx, modulate(g, t, cm[3], cm[4], NORM_EPS), t, cm[5])
        });
        (x, ctx)
    }
}
