//! Sinusoidal embeddings (timesteps, 2D positions), computed on the host: they are small and
//! depend only on scalars, so the graph takes them as inputs.

use crate::ggml::Tensor;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::linear::Linear;

/// Sinusoidal timestep features as diffusers' `get_timestep_embedding`:
/// freqs_i = exp(-ln(max_period) * i / (half - shift)), features [sin | cos] (or [cos | sin]
/// with `flip_sin_to_cos`), times `scale`. Returns `dim` values per timestep, row-major.
pub fn timestep_embedding(
    timesteps: &[f32],
    dim: usize,
    flip_sin_to_cos: bool,
    shift: f32,
    scale: f32,
    max_period: f32,
) -> Vec<f32> {
    let half = dim / 2;
    let mut out = Vec::with_capacity(timesteps.len() * dim);
    for &t in timesteps {
        let args: Vec<f32> = (0..half)
            .map(|i| {
                let exponent = -(max_period.ln()) * i as f32 / (half as f32 - shift);
                t * exponent.exp() * scale
            })
            .collect();
        let (sin, cos): (Vec<f32>, Vec<f32>) = args.iter().map(|a| (a.sin(), a.cos())).unzip();
        if flip_sin_to_cos {
            out.extend(&cos);
            out.extend(&sin);
        } else {
            out.extend(&sin);
            out.extend(&cos);
        }
        if dim % 2 == 1 {
            out.push(0.0);
        }
    }
    out
}

/// diffusers `TimestepEmbedding`: linear_1 → SiLU → linear_2.
#[derive(Clone, Copy, Debug)]
pub struct TimestepEmbedding {
    pub linear_1: Linear,
    pub linear_2: Linear,
}

impl TimestepEmbedding {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        in_channels: usize,
        dim: usize,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            linear_1: Linear::new(&wb.pp("linear_1"), in_channels, dim, true)?,
            linear_2: Linear::new(&wb.pp("linear_2"), dim, dim, true)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let h = g.silu(self.linear_1.forward(g, x));
        self.linear_2.forward(g, h)
    }
}

/// 2D sin-cos position embedding for a `grid_w` × `grid_h` patch grid, as diffusers'
/// `get_2d_sincos_pos_embed` (positions scaled by `base_size / interpolation_scale`
/// relative to the grid): `dim` values per patch, patches row-major (h outer, w inner).
pub fn sincos_2d_pos_embed(
    dim: usize,
    grid_h: usize,
    grid_w: usize,
    base_size: f32,
    interpolation_scale: f32,
) -> Vec<f32> {
    let quarter = dim / 4;
    let omega: Vec<f64> = (0..quarter)
        .map(|i| 1.0 / 10000f64.powf(i as f64 / quarter as f64))
        .collect();
    let emb_1d = |pos: f64, out: &mut Vec<f32>| {
        for &w in &omega {
            out.push((pos * w).sin() as f32);
        }
        for &w in &omega {
            out.push((pos * w).cos() as f32);
        }
    };
    let mut out = Vec::with_capacity(grid_h * grid_w * dim);
    for h in 0..grid_h {
        for w in 0..grid_w {
            // diffusers: grid = arange(n) / (n / base_size) / interpolation_scale; the first
            // half of the features encodes the w coordinate, the second half h.
            let pw =
                w as f64 / (grid_w as f64 / f64::from(base_size)) / f64::from(interpolation_scale);
            let ph =
                h as f64 / (grid_h as f64 / f64::from(base_size)) / f64::from(interpolation_scale);
            emb_1d(pw, &mut out);
            emb_1d(ph, &mut out);
        }
    }
    out
}
