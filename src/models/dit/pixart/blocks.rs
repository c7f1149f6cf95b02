//! PixArt building blocks: MLP embedders, fused/split attention projections and the
//! adaLN-single transformer block.

use crate::ggml::Tensor;
use crate::nn::{self, AttentionMask, Linear};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::super::adaln;
use super::config::{Names, PixArtConfig, PixArtLayout};

/// Layer-norm epsilon of every PixArt norm (all without affine parameters).
pub(crate) const NORM_EPS: f32 = 1e-6;

/// Activation between the two linears of an [`Mlp2`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Act {
    Silu,
    GeluTanh,
}

/// Linear → activation → Linear (timestep / size embedders, caption projection).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mlp2 {
    fc1: Linear,
    fc2: Linear,
    act: Act,
}

impl Mlp2 {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        names: [&str; 2],
        dims: [usize; 3],
        act: Act,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            fc1: Linear::new(&wb.pp(names[0]), dims[0], dims[1], true)?,
            fc2: Linear::new(&wb.pp(names[1]), dims[1], dims[2], true)?,
            act,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let h = self.fc1.forward(g, x);
        let h = match self.act {
            Act::Silu => g.silu(h),
            Act::GeluTanh => nn::gelu_tanh(g, h),
        };
        self.fc2.forward(g, h)
    }
}

/// Part `i` of `parts` equal slices of `ne[0]` (a fused projection's output), as a view.
pub(crate) fn chunk<'g>(g: &'g GraphCtx<'g>, y: Tensor<'g>, parts: usize, i: usize) -> Tensor<'g> {
    let [n0, n1, n2, n3] = y.ne();
    let nb = y.nb();
    let width = n0 / parts;
    g.view(
        y,
        [width, n1, n2, n3],
        [nb[1], nb[2], nb[3]],
        i * width * nb[0],
    )
}

/// Projections whose outputs may be one fused matrix in the checkpoint.
#[derive(Clone, Debug)]
enum Projections {
    /// One linear per output (diffusers).
    Split(Vec<Linear>),
    /// One linear whose output dimension concatenates all outputs (original layout).
    Fused(Linear, usize),
}

impl Projections {
    fn split(
        wb: &WeightBuilder<'_, '_>,
        names: &[&str],
        d_in: usize,
        d_out: usize,
    ) -> Result<Self, RunnerError> {
        names
            .iter()
            .map(|n| Linear::new(&wb.pp(n), d_in, d_out, true))
            .collect::<Result<Vec<_>, _>>()
            .map(Projections::Split)
    }

    fn fused(
        wb: &WeightBuilder<'_, '_>,
        d_in: usize,
        d_out: usize,
        parts: usize,
    ) -> Result<Self, RunnerError> {
        Ok(Projections::Fused(
            Linear::new(wb, d_in, parts * d_out, true)?,
            parts,
        ))
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Vec<Tensor<'g>> {
        match self {
            Projections::Split(ls) => ls.iter().map(|l| l.forward(g, x)).collect(),
            Projections::Fused(l, parts) => {
                let y = l.forward(g, x);
                (0..*parts).map(|i| chunk(g, y, *parts, i)).collect()
            }
        }
    }
}

/// One PixArt transformer block: adaLN-single modulated self-attention, unmodulated
/// cross-attention to the caption, modulated feed-forward.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    /// (6, D) table added to the shared t_mod: [shift, scale, gate]_msa, [shift, scale, gate]_mlp.
    table: Param,
    qkv: Projections,
    attn_out: Linear,
    cross_q: Linear,
    cross_kv: Projections,
    cross_out: Linear,
    ff1: Linear,
    ff2: Linear,
    dim: usize,
    heads: usize,
}

impl Block {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        config: &PixArtConfig,
        names: &Names,
    ) -> Result<Self, RunnerError> {
        let d = config.hidden_size;
        let (qkv, cross_kv) = match config.layout {
            PixArtLayout::Diffusers => (
                Projections::split(wb, &["attn1.to_q", "attn1.to_k", "attn1.to_v"], d, d)?,
                Projections::split(wb, &["attn2.to_k", "attn2.to_v"], d, d)?,
            ),
            PixArtLayout::Original => (
                Projections::fused(&wb.pp("attn.qkv"), d, d, 3)?,
                Projections::fused(&wb.pp("cross_attn.kv_linear"), d, d, 2)?,
            ),
        };
        Ok(Self {
            table: wb.get("scale_shift_table", [d, 6, 1, 1], Storage::F32)?,
            qkv,
            attn_out: Linear::new(&wb.pp(names.attn_out), d, d, true)?,
            cross_q: Linear::new(&wb.pp(names.cross_q), d, d, true)?,
            cross_kv,
            cross_out: Linear::new(&wb.pp(names.cross_out), d, d, true)?,
            ff1: Linear::new(&wb.pp(names.ff[0]), d, config.ffn_dim, true)?,
            ff2: Linear::new(&wb.pp(names.ff[1]), config.ffn_dim, d, true)?,
            dim: d,
            heads: config.heads,
        })
    }

    /// The cross-attention's keys and values [D, n_txt, B] of the projected caption
    /// `context` [D, n_txt, B]: the same at every sampling step.
    pub fn cross_kv<'g>(&self, g: &'g GraphCtx<'g>, context: Tensor<'g>) -> [Tensor<'g>; 2] {
        let kv = self.cross_kv.forward(g, context);
        [kv[0], kv[1]]
    }

    /// x: [D, N, B] image tokens; t_mod: [D, 6, B] shared adaLN-single output;
    /// kv: [`Block::cross_kv`] of the caption; mask: additive caption-key bias.
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        t_mod: Tensor<'g>,
        [k, v]: [Tensor<'g>; 2],
        mask: Option<&AttentionMask<'g>>,
    ) -> Tensor<'g> {
        let m = g.add(t_mod, g.param(self.table));
        let nb = m.nb();
        let batch = m.ne()[2];
        // Row i of the modulation as [D, 1, B], broadcasting over tokens (tiny: made contiguous
        // so every backend's element-wise ops accept it).
        let row =
            |i: usize| g.cont(g.view(m, [self.dim, 1, batch, 1], [nb[1], nb[2], nb[3]], i * nb[1]));
        let modulate = |h: Tensor<'g>, shift: usize, scale: usize| {
            adaln::modulate(g, h, row(shift), row(scale), NORM_EPS)
        };

        let h = modulate(x, 0, 1);
        let qkv = self.qkv.forward(g, h);
        let attn = nn::attention(g, qkv[0], qkv[1], qkv[2], self.heads, None);
        let x = self.attn_out.forward_onto(g, attn, x, Some(row(2)));

        // No norm before cross-attention (PixArt's ada_norm_single block).
        let q = self.cross_q.forward(g, x);
        let cross = nn::attention(g, q, k, v, self.heads, mask);
        let x = self.cross_out.forward_onto(g, cross, x, None);

        let h = modulate(x, 3, 4);
        let h = self.ff1.forward_gelu_tanh(g, h);
        self.ff2.forward_onto(g, h, x, Some(row(5)))
    }
}
