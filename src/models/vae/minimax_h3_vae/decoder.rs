//! The non-causal ViT decoder on one chunk of latent frames.
//!
//! Every latent voxel becomes one token (t, then h, then w fastest); `register_tokens` and one
//! all-zero token follow, all at position 0. Blocks are pre-norm (RMS norm with a scale):
//! attention with an RMS norm on each q/k head and a 3-axis rotary embedding on the first
//! `rope_dim` channels of each head (`rotate_half` pairs; the (t, h, w) angles of each position
//! are its coordinates in [-1, 1) times 2π), then a SwiGLU feed-forward; each branch is scaled
//! per channel (`scale1`, `scale2`) before the residual add. A layer norm and `proj_out` turn
//! each voxel token into a `pt × p × p` block of pixels (diffusers
//! `MiniMaxH3VideoViTDecoder3d`).

use std::f64::consts::TAU;

use crate::dtype::DType;
use crate::ggml::Tensor;
use crate::models::vae::qwen_image_2_1_vae::blocks::Conv;
use crate::nn::{self, apply_rope, rope_table, LayerNorm, Linear, RmsNorm, RopeLayout};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::config::MiniMaxH3VaeConfig;
use super::layout::{QkvLayout, SwiGluLayout};

#[derive(Clone, Copy, Debug)]
enum Qkv {
    Split([Linear; 3]),
    /// Output rows head by head: q, k, v of head 0, then head 1, …
    FusedPerHead(Linear),
}

#[derive(Clone, Copy, Debug)]
struct Block {
    norm1: RmsNorm,
    qkv: Qkv,
    to_out: Linear,
    scale1: Param,
    norm2: RmsNorm,
    w1: Linear,
    swiglu: SwiGluLayout,
    w2: Linear,
    scale2: Param,
}

/// Sizes every block shares.
#[derive(Clone, Copy, Debug)]
struct Dims {
    dim: usize,
    heads: usize,
    head_dim: usize,
    rope_dim: usize,
    inner: usize,
    eps: f32,
}

impl Block {
    fn new(wb: &WeightBuilder<'_, '_>, c: &MiniMaxH3VaeConfig) -> Result<Self, RunnerError> {
        let (dim, inner, eps) = (c.dim, c.ffn_inner, c.decoder_eps);
        let qkv = match c.layout.qkv() {
            QkvLayout::Split => Qkv::Split([
                Linear::new(&wb.pp("attn.to_q"), dim, dim, true)?,
                Linear::new(&wb.pp("attn.to_k"), dim, dim, true)?,
                Linear::new(&wb.pp("attn.to_v"), dim, dim, true)?,
            ]),
            QkvLayout::FusedPerHead => {
                Qkv::FusedPerHead(Linear::new(&wb.pp("attn.to_qkv"), dim, 3 * dim, true)?)
            }
        };
        let (w1, w2, swiglu) = c.layout.ff();
        Ok(Self {
            norm1: RmsNorm::new(&wb.pp("norm1"), dim, eps)?,
            qkv,
            to_out: Linear::new(&wb.pp(c.layout.attn_out()), dim, dim, true)?,
            scale1: wb.get("scale1", [dim, 1, 1, 1], Storage::F32)?,
            norm2: RmsNorm::new(&wb.pp("norm2"), dim, eps)?,
            w1: Linear::new(&wb.pp(w1), dim, 2 * inner, true)?,
            swiglu,
            w2: Linear::new(&wb.pp(w2), inner, dim, true)?,
            scale2: wb.get("scale2", [dim, 1, 1, 1], Storage::F32)?,
        })
    }

    /// q, k, v as [head_dim, heads, L] (not necessarily contiguous).
    fn qkv<'g>(&self, g: &'g GraphCtx<'g>, d: &Dims, x: Tensor<'g>) -> [Tensor<'g>; 3] {
        let l = x.ne()[1];
        let heads = |t: Tensor<'g>| g.reshape(t, [d.head_dim, d.heads, l, 1]);
        match &self.qkv {
            Qkv::Split(p) => p.map(|lin| heads(lin.forward(g, x))),
            Qkv::FusedPerHead(lin) => {
                let y = lin.forward(g, x);
                let es = y.nb()[0];
                let nb = [3 * d.head_dim * es, 3 * d.dim * es, 3 * d.dim * es * l];
                [0, 1, 2].map(|k| g.view(y, [d.head_dim, d.heads, l, 1], nb, k * d.head_dim * es))
            }
        }
    }

    fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        d: &Dims,
        x: Tensor<'g>,
        rope: (Tensor<'g>, Tensor<'g>),
    ) -> Tensor<'g> {
        let l = x.ne()[1];
        // Attention.
        let h = self.norm1.forward(g, x);
        let [q, k, v] = self.qkv(g, d, h);
        let prep = |t: Tensor<'g>| {
            let t = g.rms_norm(g.cont(t), d.eps);
            let t = partial_rope(g, t, d.rope_dim, rope);
            g.reshape(t, [d.dim, l, 1, 1])
        };
        let v = g.reshape(g.cont(v), [d.dim, l, 1, 1]);
        let a = nn::attention(g, prep(q), prep(k), v, d.heads, None);
        let a = self.to_out.forward(g, a);
        let x = g.add(x, g.mul(a, g.param(self.scale1)));
        // SwiGLU feed-forward.
        let h = self.w1.forward(g, self.norm2.forward(g, x));
        let nb = h.nb();
        let half = |k: usize| {
            g.view(
                h,
                [d.inner, l, 1, 1],
                [nb[1], nb[2], nb[3]],
                k * d.inner * nb[0],
            )
        };
        let (up, gate) = match self.swiglu {
            SwiGluLayout::UpGate => (half(0), half(1)),
            SwiGluLayout::GateUp => (half(1), half(0)),
        };
        let f = self.w2.forward(g, g.mul(g.silu(g.cont(gate)), up));
        g.add(x, g.mul(f, g.param(self.scale2)))
    }
}

/// Rotates the first `rot` channels of each head of x [head_dim, heads, L, 1] (contiguous).
fn partial_rope<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    rot: usize,
    (cos, sin): (Tensor<'g>, Tensor<'g>),
) -> Tensor<'g> {
    let [hd, heads, l, _] = x.ne();
    if rot == 0 {
        return x;
    }
    let nb = x.nb();
    let part = |start: usize, len: usize| {
        g.view(x, [len, heads, l, 1], [nb[1], nb[2], nb[3]], start * nb[0])
    };
    let rotated = apply_rope(g, part(0, rot), cos, sin, RopeLayout::Halves);
    if rot == hd {
        return rotated;
    }
    g.concat(rotated, g.cont(part(rot, hd - rot)), 0)
}

/// The decoder with `post_quant_conv`.
#[derive(Clone, Debug)]
pub(crate) struct Decoder {
    post_quant: Conv,
    proj_in: Linear,
    register_tokens: Param,
    blocks: Vec<Block>,
    norm_out: LayerNorm,
    proj_out: Linear,
    dims: Dims,
    registers: usize,
    out_channels: usize,
    patch: usize,
    patch_t: usize,
    rope_theta: f32,
}

impl Decoder {
    pub(crate) fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &MiniMaxH3VaeConfig,
    ) -> Result<Self, RunnerError> {
        let (z, dim) = (c.latent_channels, c.dim);
        let (p, pt) = (c.scale_factor(), c.temporal_factor());
        let blocks = (0..c.layers)
            .map(|i| Block::new(&wb.pp(c.layout.block(i)), c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            post_quant: Conv::new(&wb.pp("post_quant_conv"), z, z, 1, 1, 0)?,
            proj_in: Linear::new(&wb.pp(c.layout.proj_in()), z, dim, true)?,
            register_tokens: wb.get(
                "decoder.register_tokens",
                [dim, c.register_tokens, 1, 1],
                Storage::F32,
            )?,
            blocks,
            norm_out: LayerNorm::new(&wb.pp("decoder.norm_out"), dim, c.decoder_eps, true)?,
            proj_out: Linear::new(
                &wb.pp("decoder.proj_out"),
                dim,
                c.out_channels * pt * p * p,
                true,
            )?,
            dims: Dims {
                dim,
                heads: c.heads,
                head_dim: c.head_dim,
                rope_dim: c.rope_dim,
                inner: c.ffn_inner,
                eps: c.decoder_eps,
            },
            registers: c.register_tokens,
            out_channels: c.out_channels,
            patch: p,
            patch_t: pt,
            rope_theta: c.rope_theta,
        })
    }

    /// The rotary tables (cos, sin), each `[rope_dim / 2, tokens]`, for a `w × h × t` latent
    /// followed by the register and zero tokens at position 0.
    fn rope_tables(&self, w: usize, h: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
        // Cell centres in [-1, 1) scaled by 2π (diffusers `MiniMaxH3VideoViTDecoder3d`).
        let coord = |i: usize, n: usize| (2.0 * ((i as f64 + 0.5) / n as f64) - 1.0) * TAU;
        let mut positions = Vec::with_capacity(w * h * t + self.registers + 1);
        for ti in 0..t {
            for yi in 0..h {
                for xi in 0..w {
                    positions.push(vec![
                        coord(ti, t) as f32,
                        coord(yi, h) as f32,
                        coord(xi, w) as f32,
                    ]);
                }
            }
        }
        positions.resize(positions.len() + self.registers + 1, vec![0.0; 3]);
        let axis = self.dims.rope_dim / 3;
        rope_table(&positions, &[axis; 3], self.rope_theta)
    }

    /// One chunk z [w, h, T, latent] (ggml order; PyTorch `[latent, T, h, w]`) → pixels
    /// [w·p, h·p, T·pt, C_out] in the VAE's ImageNet-normalised space.
    pub(crate) fn forward<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let [w, h, t, c] = z.ne();
        let n = w * h * t;
        let d = &self.dims;
        // Tokens [latent, N]: channels first, then w fastest, h, t.
        let x = g.reshape(g.cont(g.permute(z, [1, 2, 3, 0])), [c, n, 1, 1]);
        // A 1×1×1 conv is a product over channels; its kernel is stored like a conv's (f16
        // or f32, never converted on loading), so widen it: ggml's f16 product would round
        // the latent to f16.
        let pq = g.param(self.post_quant.weight);
        let pq = if pq.ty() == DType::F32 {
            pq
        } else {
            g.cast(pq, DType::F32)
        };
        let pq = g.reshape(pq, [c, c, 1, 1]);
        let x = g.linear(pq, x, Some(g.param(self.post_quant.bias)));
        let x = self.proj_in.forward(g, x);
        let regs = g.reshape(g.param(self.register_tokens), [d.dim, self.registers, 1, 1]);
        let x = g.concat(x, regs, 1);
        let nb = x.nb();
        let zero = g.scale(
            g.cont(g.view(x, [d.dim, 1, 1, 1], [nb[1], nb[1], nb[1]], 0)),
            0.0,
        );
        let mut x = g.concat(x, zero, 1);
        let l = n + self.registers + 1;
        let (cos, sin) = self.rope_tables(w, h, t);
        let half = d.rope_dim / 2;
        let rope = (
            g.input_f32("minimax_h3_vae.rope_cos", [half, l, 1, 1], cos),
            g.input_f32("minimax_h3_vae.rope_sin", [half, l, 1, 1], sin),
        );
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(g, d, x, rope);
            x = g.cut(
                &format!("minimax_h3_vae.decoder.blocks.{i}"),
                "hidden_states",
                x,
            );
        }
        let y = self.proj_out.forward(g, self.norm_out.forward(g, x));
        let nb = y.nb();
        let y = g.view(y, [y.ne()[0], n, 1, 1], [nb[1], nb[2], nb[3]], 0);
        self.unpatchify(g, y, [w, h, t])
    }

    /// Tokens [C·pt·p·p (dx fastest, then dy, dt, c), N (w fastest, h, t)] → pixels
    /// [w·p, h·p, t·pt, C].
    fn unpatchify<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        y: Tensor<'g>,
        [w, h, t]: [usize; 3],
    ) -> Tensor<'g> {
        let (p, pt, c) = (self.patch, self.patch_t, self.out_channels);
        let swap12 = |x: Tensor<'g>| g.cont(g.permute(x, [0, 2, 1, 3]));
        // [dx, (dy dt c), x, (y t)] → [dx, x, (dy dt c), (y t)]
        let y = swap12(g.reshape(g.cont(y), [p, p * pt * c, w, h * t]));
        // [(dx x), dy, (dt c), (y t)] → [(dx x), dy, (y t), (dt c)]
        let y = g.cont(g.permute(g.reshape(y, [p * w, p, pt * c, h * t]), [0, 1, 3, 2]));
        // [(dx x dy y), t, dt, c] → [(dx x dy y), dt, t, c]
        let y = swap12(g.reshape(y, [p * w * p * h, t, pt, c]));
        g.reshape(y, [p * w, p * h, pt * t, c])
    }
}
