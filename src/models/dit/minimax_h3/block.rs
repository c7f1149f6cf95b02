//! MiniMax-H3's two block kinds: the token refiner's plain pre-norm block and the main
//! block, whose norms are modulated per span of the packed sequence ([`Span`]).
//! Both: self-attention with per-head q/k RMS norms (rotary on the main blocks only, over
//! the first 6 · rope_freq_dim channels of each head) and a SwiGLU feed-forward, no biases.

use crate::ggml::Tensor;
use crate::nn::{self, Linear, RmsNorm, RopeLayout};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::super::adaln::{columns, rows};
use super::config::{MiniMaxH3Config, MiniMaxH3Layout};

/// f32 bytes.
const ES: usize = 4;

/// Rotary tables of the packed sequence: cos / sin [rotated/2, 1, S, 1].
#[derive(Clone, Copy)]
pub struct Rope<'g> {
    pub cos: Tensor<'g>,
    pub sin: Tensor<'g>,
}

/// Consecutive sequence rows sharing one AdaLN row (timestep × modality).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    /// Column of the [6·D, 3·T] modulation table: timestep index · 3 + modality tag.
    pub modulation: usize,
}

#[derive(Clone, Copy, Debug)]
enum Qkv {
    Fused(Linear),
    Split(Linear, Linear, Linear),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Attention {
    qkv: Qkv,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    out: Linear,
}

impl Attention {
    fn new(wb: &WeightBuilder<'_, '_>, c: &MiniMaxH3Config) -> Result<Self, RunnerError> {
        let (d, inner) = (c.hidden, c.inner());
        let plain = |w: WeightBuilder<'_, '_>, i, o| Linear::new(&w, i, o, false);
        let qkv = match c.layout {
            MiniMaxH3Layout::Original => Qkv::Fused(plain(wb.pp("qkv_proj"), d, 3 * inner)?),
            MiniMaxH3Layout::Diffusers => Qkv::Split(
                plain(wb.pp("to_q"), d, inner)?,
                plain(wb.pp("to_k"), d, inner)?,
                plain(wb.pp("to_v"), d, inner)?,
            ),
        };
        let [qn, kn, out] = c.layout.attn();
        Ok(Self {
            qkv,
            norm_q: RmsNorm::new(&wb.pp(qn), c.head_dim, c.qk_norm_eps)?,
            norm_k: RmsNorm::new(&wb.pp(kn), c.head_dim, c.qk_norm_eps)?,
            out: plain(wb.pp(out), inner, d)?,
        })
    }

    fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        h: Tensor<'g>,
        rope: Option<Rope<'g>>,
        c: &MiniMaxH3Config,
    ) -> Tensor<'g> {
        let inner = c.inner();
        let [_, n, b, _] = h.ne();
        let [q, k, v] = match self.qkv {
            Qkv::Fused(l) => {
                let t = g.cont(l.forward(g, h));
                [
                    rows(g, t, 0, inner),
                    rows(g, t, inner, inner),
                    rows(g, t, 2 * inner, inner),
                ]
            }
            Qkv::Split(q, k, v) => [q.forward(g, h), k.forward(g, h), v.forward(g, h)],
        };
        let prepare = |t: Tensor<'g>, norm: &RmsNorm| {
            let t = norm.forward(g, g.reshape(t, [c.head_dim, c.heads, n, b]));
            let t = match rope {
                Some(r) => rotate_leading(g, t, r, 6 * c.rope_freq_dim),
                None => t,
            };
            g.reshape(t, [inner, n, b, 1])
        };
        let q = prepare(q, &self.norm_q);
        let k = prepare(k, &self.norm_k);
        self.out
            .forward(g, nn::attention(g, q, k, v, c.heads, None))
    }
}

/// Rotates the first `rotated` channels of every head of x [head_dim, heads, n, B]
/// (`rotate_half` pairs within them) and passes the rest through.
fn rotate_leading<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    rope: Rope<'g>,
    rotated: usize,
) -> Tensor<'g> {
    let [hd, heads, n, b] = x.ne();
    let x = g.cont(x);
    let nb = [hd * ES, hd * heads * ES, hd * heads * n * ES];
    let head = g.view(x, [rotated, heads, n, b], nb, 0);
    let turned = nn::apply_rope(g, head, rope.cos, rope.sin, RopeLayout::Halves);
    if rotated == hd {
        return turned;
    }
    let tail = g.cont(g.view(x, [hd - rotated, heads, n, b], nb, rotated * ES));
    g.concat(turned, tail, 0)
}

#[derive(Clone, Copy, Debug)]
pub(super) struct FeedForward {
    fc1: Linear,
    fc2: Linear,
    /// Whether fc1's rows are [gate; value] (released files) rather than [value; gate].
    gate_first: bool,
}

impl FeedForward {
    fn new(wb: &WeightBuilder<'_, '_>, c: &MiniMaxH3Config) -> Result<Self, RunnerError> {
        let [fc1, fc2] = c.layout.ffn();
        Ok(Self {
            fc1: Linear::new(&wb.pp(fc1), c.hidden, 2 * c.ffn, false)?,
            fc2: Linear::new(&wb.pp(fc2), c.ffn, c.hidden, false)?,
            gate_first: c.layout == MiniMaxH3Layout::Original,
        })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, ffn: usize) -> Tensor<'g> {
        let t = g.cont(self.fc1.forward(g, x));
        let (gate, value) = if self.gate_first {
            (rows(g, t, 0, ffn), rows(g, t, ffn, ffn))
        } else {
            (rows(g, t, ffn, ffn), rows(g, t, 0, ffn))
        };
        self.fc2.forward(g, g.mul(g.silu(gate), value))
    }
}

/// A token-refiner block: x + attn(norm1 x), then + ffn(norm2 x); no rope, no modulation.
#[derive(Clone, Copy, Debug)]
pub(super) struct RefinerBlock {
    norm1: RmsNorm,
    attn: Attention,
    norm2: RmsNorm,
    ff: FeedForward,
}

impl RefinerBlock {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &MiniMaxH3Config) -> Result<Self, RunnerError> {
        Ok(Self {
            norm1: RmsNorm::new(&wb.pp("norm1"), c.hidden, c.norm_eps)?,
            attn: Attention::new(&wb.pp("attn"), c)?,
            norm2: RmsNorm::new(&wb.pp("norm2"), c.hidden, c.norm_eps)?,
            ff: FeedForward::new(wb, c)?,
        })
    }

    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        c: &MiniMaxH3Config,
    ) -> Tensor<'g> {
        let x = g.add(x, self.attn.forward(g, self.norm1.forward(g, x), None, c));
        g.add(x, self.ff.forward(g, self.norm2.forward(g, x), c.ffn))
    }
}

/// A main block: both sub-layers modulated as `norm(x)·(1 + scale) + shift` and gated into
/// the residual, with the (shift, scale, gate) of each span's AdaLN row.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    norm1: RmsNorm,
    attn: Attention,
    norm2: RmsNorm,
    ff: FeedForward,
    /// adaln_proj.linear: AdaLN input → [6·D per modality × 3 modalities].
    modulation: Linear,
}

impl Block {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &MiniMaxH3Config) -> Result<Self, RunnerError> {
        let r = RefinerBlock::new(wb, c)?;
        Ok(Self {
            norm1: r.norm1,
            attn: r.attn,
            norm2: r.norm2,
            ff: r.ff,
            modulation: Linear::new(
                &wb.pp("adaln_proj").pp("linear"),
                c.time_embed_dim,
                18 * c.hidden,
                true,
            )?,
        })
    }

    /// `x` [D, S, 1]; `adaln_in` [time_embed_dim, T] (the SiLU already applied where the
    /// model applies one).
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        adaln_in: Tensor<'g>,
        spans: &[Span],
        rope: Rope<'g>,
        c: &MiniMaxH3Config,
    ) -> Tensor<'g> {
        let d = c.hidden;
        let mods = g.cont(self.modulation.forward(g, adaln_in));
        // Piece k (shift, scale, gate, shift, scale, gate) of modulation column `col`.
        let piece = |col: usize, k: usize| {
            g.cont(g.view(mods, [d, 1, 1, 1], [d * ES; 3], (col * 6 + k) * d * ES))
        };
        let modulate = |h: Tensor<'g>, k: usize| {
            per_span(g, spans, |s| {
                let part = columns(g, h, s.start, s.len);
                let scaled = g.add(part, g.mul(part, piece(s.modulation, k + 1)));
                g.add(scaled, piece(s.modulation, k))
            })
        };
        let gated = |x: Tensor<'g>, update: Tensor<'g>, k: usize| {
            per_span(g, spans, |s| {
                let base = columns(g, x, s.start, s.len);
                let add = columns(g, update, s.start, s.len);
                g.add(base, g.mul(add, piece(s.modulation, k)))
            })
        };
        let h = modulate(self.norm1.forward(g, x), 0);
        let x = gated(x, self.attn.forward(g, h, Some(rope), c), 2);
        let h = modulate(self.norm2.forward(g, x), 3);
        gated(x, self.ff.forward(g, h, c.ffn), 5)
    }
}

/// `f` of every span, joined along the rows in order.
pub(super) fn per_span<'g>(
    g: &'g GraphCtx<'g>,
    spans: &[Span],
    f: impl Fn(&Span) -> Tensor<'g>,
) -> Tensor<'g> {
    let mut out: Option<Tensor<'g>> = None;
    for s in spans {
        let part = f(s);
        out = Some(match out {
            Some(o) => g.concat(o, part, 1),
            None => part,
        });
    }
    out.expect("a packed sequence has at least one span")
}
