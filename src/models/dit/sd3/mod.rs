//! Stable Diffusion 3 / 3.5 MMDiT (Stability's `MMDiT`, diffusers `SD3Transformer2DModel`):
//! the latent patchified by a strided convolution plus a centre crop of the stored position
//! embedding, N joint blocks (image and text streams, joint attention; the last block's text
//! stream only feeds attention), modulated by `c = time(t) + y(pooled text)`; SD3.5 adds q/k
//! RMS norms and (medium) a second image attention in the first blocks.
//!
//! The output is the velocity in patch tokens [p·p·C, N] with features ordered (row, column,
//! channel) of each patch ([`unpatchify`]).

mod blocks;
mod config;

pub use config::{Sd3Config, Sd3Layout, NORM_EPS, TIME_FREQ_DIM};

use crate::dtype::DType;
use crate::ggml::Tensor;
use crate::nn::{self, Conv2d, Linear};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};
use crate::tensor::HostTensor;

use super::adaln::{mod_rows, modulate};
use blocks::JointBlock;

/// Cut-group prefix of this model's graph-cut marks.
pub const CUT_PREFIX: &str = "sd3";

/// A 2-layer MLP with SiLU between (`t_embedder.mlp`, `y_embedder.mlp`).
#[derive(Clone, Copy, Debug)]
struct Mlp(Linear, Linear);

impl Mlp {
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.1.forward(g, g.silu(self.0.forward(g, x)))
    }
}

#[derive(Clone, Debug)]
pub struct Sd3 {
    config: Sd3Config,
    patch: Conv2d,
    pos_embed: Param,
    t_embed: Mlp,
    y_embed: Mlp,
    context_embedder: Linear,
    blocks: Vec<JointBlock>,
    /// Final norm: (shift, scale) rows in SAI's order, (scale, shift) in diffusers'.
    final_mod: Linear,
    final_linear: Linear,
}

impl Sd3 {
    pub fn new(wb: &WeightBuilder<'_, '_>, config: Sd3Config) -> Result<Self, RunnerError> {
        let c = &config;
        let d = c.hidden_size;
        let sai = c.layout == config::Sd3Layout::Sai;
        let pick = |s: &'static str, df: &'static str| if sai { s } else { df };
        let lin = |w: WeightBuilder<'_, '_>, i, o| Linear::new(&w, i, o, true);
        let mlp = |w: WeightBuilder<'_, '_>, i| -> Result<Mlp, RunnerError> {
            Ok(if sai {
                Mlp(lin(w.pp("mlp").pp(0), i, d)?, lin(w.pp("mlp").pp(2), d, d)?)
            } else {
                Mlp(lin(w.pp("linear_1"), i, d)?, lin(w.pp("linear_2"), d, d)?)
            })
        };
        let blocks = (0..c.depth)
            .map(|i| {
                JointBlock::new(
                    &wb.pp(pick("joint_blocks", "transformer_blocks")).pp(i),
                    c,
                    i + 1 == c.depth,
                    i < c.dual_blocks,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tte = wb.pp("time_text_embed");
        let p = c.patch_size;
        Ok(Self {
            patch: Conv2d::new(
                &wb.pp(pick("x_embedder", "pos_embed")).pp("proj"),
                c.in_channels,
                d,
                p,
                p,
                0,
                true,
            )?,
            pos_embed: wb.get(
                pick("pos_embed", "pos_embed.pos_embed"),
                [d, c.pos_embed_max * c.pos_embed_max, 1, 1],
                // f16 stays f16: the grid is a tenth of SD3.5 medium and only a crop is read.
                Storage::Float,
            )?,
            t_embed: mlp(
                if sai {
                    wb.pp("t_embedder")
                } else {
                    tte.pp("timestep_embedder")
                },
                config::TIME_FREQ_DIM,
            )?,
            y_embed: mlp(
                if sai {
                    wb.pp("y_embedder")
                } else {
                    tte.pp("text_embedder")
                },
                c.pooled_dim,
            )?,
            context_embedder: lin(wb.pp("context_embedder"), c.context_dim, d)?,
            blocks,
            final_mod: lin(
                if sai {
                    wb.pp("final_layer").pp("adaLN_modulation").pp(1)
                } else {
                    wb.pp("norm_out").pp("linear")
                },
                d,
                2 * d,
            )?,
            final_linear: lin(
                if sai {
                    wb.pp("final_layer").pp("linear")
                } else {
                    wb.pp("proj_out")
                },
                d,
                p * p * c.out_channels,
            )?,
            config,
        })
    }

    pub fn config(&self) -> &Sd3Config {
        &self.config
    }

    /// The velocity tokens [p·p·C, N, B] for a latent [W, H, C, B], text [context_dim, L, B],
    /// pooled [pooled_dim, B] and σ per batch element (the model sees t = 1000σ), without the
    /// blocks in `skip_layers`.
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        latent: Tensor<'g>,
        context: Tensor<'g>,
        pooled: Tensor<'g>,
        sigmas: &[f32],
        skip_layers: &[usize],
    ) -> Result<Tensor<'g>, RunnerError> {
        let c = &self.config;
        let d = c.hidden_size;
        let p = c.patch_size;
        let [w, h, ch, b] = latent.ne();
        let (pw, ph) = (w / p, h / p);
        if ch != c.in_channels
            || w % p != 0
            || h % p != 0
            || pw > c.pos_embed_max
            || ph > c.pos_embed_max
        {
            return Err(RunnerError::Internal(format!(
                "SD3 latent {:?}: {} channels, sides multiples of {p} up to {} patches",
                latent.ne(),
                c.in_channels,
                c.pos_embed_max
            )));
        }
        let ts: Vec<f32> = sigmas.iter().map(|s| s * 1000.0).collect();
        let freqs = nn::timestep_embedding(&ts, config::TIME_FREQ_DIM, true, 0.0, 1.0, 10_000.0);
        let t = g.input_f32("sd3.t_freq", [config::TIME_FREQ_DIM, b, 1, 1], freqs);
        let cvec = g.add(
            self.t_embed.forward(g, t),
            self.y_embed
                .forward(g, g.reshape(pooled, [c.pooled_dim, b, 1, 1])),
        );
        let vec = g.silu(cvec);

        // Patches [W/p, H/p, D, B] -> tokens [D, N, B] (row-major), plus the centred crop of
        // the stored position grid.
        let x = self.patch.forward(g, latent);
        let x = g.reshape(g.cont(g.permute(x, [1, 2, 0, 3])), [d, pw * ph, b, 1]);
        let m = c.pos_embed_max;
        let (top, left) = ((m - ph) / 2, (m - pw) / 2);
        let grid = g.param(self.pos_embed);
        let row = grid.nb()[1];
        let pos = g.view(
            grid,
            [d, pw, ph, 1],
            [row, row * m, row * m * m],
            (top * m + left) * row,
        );
        let mut pos = g.reshape(g.cont(pos), [d, pw * ph, 1, 1]);
        if grid.ty() != DType::F32 {
            pos = g.cast(pos, DType::F32);
        }
        let prelude = format!("{CUT_PREFIX}.prelude");
        let mut x = g.cut(&prelude, "x", g.add(x, pos));
        let mut ctx = g.cut(&prelude, "ctx", self.context_embedder.forward(g, context));
        for (i, block) in self.blocks.iter().enumerate() {
            if skip_layers.contains(&i) {
                continue; // skip-layer guidance leaves the block out
            }
            let group = format!("{CUT_PREFIX}.joint_blocks.{i}");
            let (xi, ci) = block.forward(g, x, ctx, vec, c);
            x = g.cut(&group, "x", xi);
            if let Some(ci) = ci {
                ctx = g.cut(&group, "ctx", ci);
            }
        }
        let r = mod_rows(g, self.final_mod.forward(g, vec), d, 2);
        let (shift, scale) = match c.layout {
            config::Sd3Layout::Sai => (r[0], r[1]),
            config::Sd3Layout::Diffusers => (r[1], r[0]),
        };
        Ok(self
            .final_linear
            .forward(g, modulate(g, x, shift, scale, NORM_EPS)))
    }
}

/// The latent [W, H, C] of velocity tokens [p·p·C, (H/p)(W/p)] (features (row, column,
/// channel) of each patch, as diffusers unpatchifies).
pub fn unpatchify(tokens: &[f32], w: usize, h: usize, c: usize, p: usize) -> HostTensor {
    let pw = w / p;
    let f = p * p * c;
    let mut data = vec![0f32; w * h * c];
    for ch in 0..c {
        for y in 0..h {
            for x in 0..w {
                let token = (y / p) * pw + x / p;
                data[x + w * (y + h * ch)] = tokens[token * f + ((y % p) * p + x % p) * c + ch];
            }
        }
    }
    HostTensor {
        ne: [w, h, c, 1],
        data,
    }
}
