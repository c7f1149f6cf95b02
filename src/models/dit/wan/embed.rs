//! Wan's condition embedders (timestep, text, CLIP image features) and the output head.

use crate::ggml::Tensor;
use crate::nn::{self, LayerNorm, Linear};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::blocks::{modulate, row};
use super::config::{WanConfig, IMAGE_NORM_EPS};

/// Timestep features → `temb` (linear, SiLU, linear) and the blocks' six modulation rows
/// (SiLU, linear).
#[derive(Clone, Copy, Debug)]
pub(super) struct TimeEmbedding {
    l1: Linear,
    l2: Linear,
    proj: Linear,
}

impl TimeEmbedding {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &WanConfig) -> Result<Self, RunnerError> {
        let n = c.layout.names();
        let d = c.dim;
        Ok(Self {
            l1: Linear::new(&wb.pp(n.time[0]), c.freq_dim, d, true)?,
            l2: Linear::new(&wb.pp(n.time[1]), d, d, true)?,
            proj: Linear::new(&wb.pp(n.time_proj), d, 6 * d, true)?,
        })
    }

    /// For features [freq_dim, F]: (temb [D, 1, F], time projection [D, 6, F]).
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, freqs: Tensor<'g>) -> (Tensor<'g>, Tensor<'g>) {
        let f = freqs.ne()[1];
        let temb = self.l2.forward(g, g.silu(self.l1.forward(g, freqs)));
        let d = temb.ne()[0];
        let proj = self.proj.forward(g, g.silu(temb));
        (g.reshape(temb, [d, 1, f, 1]), g.reshape(proj, [d, 6, f, 1]))
    }
}

/// Text states → model width: linear, tanh-GELU, linear.
#[derive(Clone, Copy, Debug)]
pub(super) struct TextEmbedding {
    l1: Linear,
    l2: Linear,
}

impl TextEmbedding {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &WanConfig) -> Result<Self, RunnerError> {
        let n = c.layout.names();
        Ok(Self {
            l1: Linear::new(&wb.pp(n.text[0]), c.text_dim, c.dim, true)?,
            l2: Linear::new(&wb.pp(n.text[1]), c.dim, c.dim, true)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, text: Tensor<'g>) -> Tensor<'g> {
        self.l2
            .forward(g, nn::gelu_tanh(g, self.l1.forward(g, text)))
    }
}

/// CLIP-vision features → model width (I2V): [+ FLF2V position table], layer norm, linear,
/// exact GELU, linear, layer norm.
#[derive(Clone, Copy, Debug)]
pub(super) struct ImageEmbedding {
    pos: Option<Param>,
    norm1: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    norm2: LayerNorm,
}

impl ImageEmbedding {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &WanConfig,
        in_dim: usize,
        pos_len: Option<usize>,
    ) -> Result<Self, RunnerError> {
        let n = c.layout.names();
        let d = c.dim;
        Ok(Self {
            pos: pos_len
                .map(|len| wb.get(n.img_pos, [in_dim, len, 1, 1], Storage::F32))
                .transpose()?,
            norm1: LayerNorm::new(&wb.pp(n.img_norm1), in_dim, IMAGE_NORM_EPS, true)?,
            fc1: Linear::new(&wb.pp(n.img_fc1), in_dim, in_dim, true)?,
            fc2: Linear::new(&wb.pp(n.img_fc2), in_dim, d, true)?,
            norm2: LayerNorm::new(&wb.pp(n.img_norm2), d, IMAGE_NORM_EPS, true)?,
        })
    }

    /// `image` [in_dim, n]; with a position table, n must not exceed its length (the first
    /// n rows are added, as upstream).
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, image: Tensor<'g>) -> Tensor<'g> {
        let mut x = image;
        if let Some(pos) = self.pos {
            let [w, n, ..] = image.ne();
            let p = g.param(pos);
            x = g.add(x, g.view(p, [w, n, 1, 1], [w * 4, w * n * 4, w * n * 4], 0));
        }
        let x = self.fc1.forward(g, self.norm1.forward(g, x));
        let x = self.fc2.forward(g, g.gelu_erf(x));
        self.norm2.forward(g, x)
    }
}

/// Output norm modulated by `table + temb` (shift, scale) and the patch projection.
#[derive(Clone, Copy, Debug)]
pub(super) struct Head {
    /// [1, 2, D] (ggml [D, 2]).
    table: Param,
    proj: Linear,
}

impl Head {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: &WanConfig) -> Result<Self, RunnerError> {
        let n = c.layout.names();
        let out = c.out_channels * c.patch.iter().product::<usize>();
        Ok(Self {
            table: wb.get(n.head_table, [c.dim, 2, 1, 1], Storage::F32)?,
            proj: Linear::new(&wb.pp(n.proj_out), c.dim, out, true)?,
        })
    }

    /// x [D, N], temb [D, 1, F] → patch features [pt·ph·pw·C_out, N].
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, temb: Tensor<'g>) -> Tensor<'g> {
        let table = g.param(self.table);
        let e = |k: usize| g.add(temb, row(g, table, k));
        self.proj.forward(g, modulate(g, x, e(0), e(1)))
    }
}
