//! Snake activations and BigVGAN's anti-aliased activation wrapper, over `[T, C, N]`.
//!
//! Formulas (diffusers `MiniMaxH3AudioSnake1d` / `MiniMaxH3AudioSnakeBeta`):
//! * Snake: `x + sin²(α·x) / (α + 1e-9)`, α stored as is (`[1, C, 1]`);
//! * SnakeBeta: `x + sin²(e^α·x) / (e^β + 1e-9)`, α and β stored in log space (`[C]`).
//!
//! [`AntiAliased`] runs SnakeBeta at twice the rate: a Kaiser-sinc transposed-convolution
//! upsampler, the activation, then a Kaiser-sinc strided low-pass (both with replicate
//! padding). The filters are the checkpoint's `upsample.filter` and
//! `downsample.lowpass.filter` buffers; their length comes from the file, the ratio is 2 (the
//! only one the model uses).

use crate::ggml::Tensor;
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

/// The ε added to the Snake divisors.
const SNAKE_EPS: f32 = 1e-9;

/// Up/down-sampling ratio of the anti-aliased activations (diffusers'
/// `MiniMaxH3AudioActivation1d` default, never overridden).
const RATIO: usize = 2;

/// Snake with a linear per-channel frequency `alpha`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Snake {
    alpha: Param,
    channels: usize,
}

impl Snake {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        let alpha = wb.get("alpha", [1, channels, 1, 1], Storage::F32)?;
        Ok(Self { alpha, channels })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let alpha = g.reshape(g.param(self.alpha), [1, self.channels, 1, 1]);
        let s = g.sin(g.mul(x, alpha));
        g.add(x, g.div(g.sqr(s), g.scale_bias(alpha, 1.0, SNAKE_EPS)))
    }
}

/// SnakeBeta with log-scale `alpha` (frequency) and `beta` (magnitude).
#[derive(Clone, Copy, Debug)]
pub(super) struct SnakeBeta {
    alpha: Param,
    beta: Param,
    channels: usize,
}

impl SnakeBeta {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        Ok(Self {
            alpha: wb.get("alpha", [channels, 1, 1, 1], Storage::F32)?,
            beta: wb.get("beta", [channels, 1, 1, 1], Storage::F32)?,
            channels,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let per_channel = |p: Param| g.reshape(g.exp(g.param(p)), [1, self.channels, 1, 1]);
        let (alpha, beta) = (per_channel(self.alpha), per_channel(self.beta));
        let s = g.sin(g.mul(x, alpha));
        g.add(x, g.div(g.sqr(s), g.scale_bias(beta, 1.0, SNAKE_EPS)))
    }
}

/// `x` `[T, C, N]` padded with `left` copies of its first sample and `right` of its last.
fn replicate_pad<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>, left: usize, right: usize) -> Tensor<'g> {
    let [t, c, n, _] = x.ne();
    let nb = x.nb();
    let edge = |at: usize, count: usize| {
        let v = g.cont(g.view(x, [1, c, n, 1], [nb[1], nb[2], nb[3]], at * nb[0]));
        g.repeat_4d(v, [count, c, n, 1])
    };
    let mut y = x;
    if left > 0 {
        y = g.concat(edge(0, left), y, 0);
    }
    if right > 0 {
        y = g.concat(y, edge(t - 1, right), 0);
    }
    y
}

/// The same `[K]` filter over every channel: `[T, C, N]` → `[T', C, N]` (no padding), as a
/// direct depthwise convolution over `C·N` one-channel rows (no patch matrix: the filters are
/// short and there are many of them).
fn depthwise<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    filter: Tensor<'g>,
    stride: usize,
) -> Tensor<'g> {
    let [t, c, n, _] = x.ne();
    let k: usize = filter.ne().iter().product();
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    let x = g.reshape(x, [t, 1, 1, c * n]);
    let y = g.conv_2d_dw_direct(g.reshape(filter, [k, 1, 1, 1]), x, (stride, 1), (0, 0));
    let t_out = y.ne()[0];
    g.reshape(y, [t_out, c, n, 1])
}

/// BigVGAN's alias-free activation: 2× Kaiser-sinc upsampling, SnakeBeta, 2× low-pass
/// downsampling (diffusers `MiniMaxH3AudioActivation1d`). Keeps the length.
#[derive(Clone, Copy, Debug)]
pub(super) struct AntiAliased {
    act: SnakeBeta,
    up_filter: Param,
    up_kernel: usize,
    down_filter: Param,
    down_kernel: usize,
}

impl AntiAliased {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        let origin = "MiniMax-H3 audio VAE weights";
        let filter = |name: &str| -> Result<(Param, usize), RunnerError> {
            let ne = wb.require_ne(name, origin)?;
            let k = ne[0];
            if ne[1..] != [1, 1, 1] || k < RATIO {
                return Err(wb.bad_data(
                    name,
                    origin,
                    format!("shape {ne:?} is not a [K, 1, 1] filter"),
                ));
            }
            Ok((wb.get(name, [k, 1, 1, 1], Storage::F32)?, k))
        };
        let (up_filter, up_kernel) = filter("upsample.filter")?;
        let (down_filter, down_kernel) = filter("downsample.lowpass.filter")?;
        Ok(Self {
            act: SnakeBeta::new(&wb.pp("act"), channels)?,
            up_filter,
            up_kernel,
            down_filter,
            down_kernel,
        })
    }

    /// Length of the upsampling filter.
    pub fn up_kernel(&self) -> usize {
        self.up_kernel
    }

    /// The i32 indices `K − 1, …, 0` that reverse an upsampling filter of length `k`; one per
    /// graph, shared by every activation (see [`AntiAliased::forward`]).
    pub fn reversal<'g>(g: &'g GraphCtx<'g>, k: usize) -> Tensor<'g> {
        let ids: Vec<i32> = (0..k as i32).rev().collect();
        g.input_i32("minimax_h3_audio.reverse_filter", [k, 1, 1, 1], ids)
    }

    /// x: `[T, C, N]` → `[T, C, N]`; `reversal` from [`AntiAliased::reversal`] for this
    /// activation's [`up_kernel`](Self::up_kernel).
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        reversal: Tensor<'g>,
    ) -> Tensor<'g> {
        let y = self.upsample(g, x, reversal);
        let y = self.act.forward(g, y);
        self.downsample(g, y)
    }

    /// diffusers `MiniMaxH3AudioUpSample1d`: replicate-pad by `K/r − 1`, depthwise transposed
    /// convolution with stride r scaled by r, crop. The transposed convolution runs as a
    /// correlation of the zero-stuffed input with the reversed filter.
    fn upsample<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, ids: Tensor<'g>) -> Tensor<'g> {
        let (r, k) = (RATIO, self.up_kernel);
        let pad = (k / r).saturating_sub(1);
        let pad_left = pad * r + (k - r) / 2;
        let pad_right = pad * r + (k - r).div_ceil(2);
        let x = replicate_pad(g, x, pad, pad);
        let x = if x.is_contiguous() { x } else { g.cont(x) };
        let [t1, c, n, _] = x.ne();
        let full = (t1 - 1) * r + k;
        let out_len = full.saturating_sub(pad_left + pad_right).max(1);
        // Zero-stuffed: x[m] at r·m, zeros between → [r·t1, C, N].
        let s = g.pad(
            g.reshape(x, [1, t1 * c * n, 1, 1]),
            [(0, r - 1), (0, 0), (0, 0), (0, 0)],
        );
        let s = g.reshape(s, [r * t1, c, n, 1]);
        // Output n needs stuffed samples n − (K − 1) ..= n.
        let first = pad_left as isize - (k as isize - 1);
        let last = (pad_left + out_len - 1) as isize;
        let (lpad, start) = if first < 0 {
            ((-first) as usize, 0)
        } else {
            (0, first as usize)
        };
        let rpad = (last + 1 - (r * t1) as isize).max(0) as usize;
        let s = if lpad + rpad > 0 {
            g.pad(s, [(lpad, rpad), (0, 0), (0, 0), (0, 0)])
        } else {
            s
        };
        let len = out_len + k - 1;
        let nb = s.nb();
        let s = g.view(s, [len, c, n, 1], [nb[1], nb[2], nb[3]], start * nb[0]);
        let reversed = g.get_rows(g.reshape(g.param(self.up_filter), [1, k, 1, 1]), ids);
        g.scale(depthwise(g, s, reversed, 1), r as f32)
    }

    /// diffusers `MiniMaxH3AudioLowPassFilter1d` with stride r: replicate-pad by
    /// (K/2 − [K even], K/2), depthwise correlation with stride r.
    fn downsample<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let k = self.down_kernel;
        let left = k / 2 - usize::from(k.is_multiple_of(2));
        let x = replicate_pad(g, x, left, k / 2);
        depthwise(g, x, g.param(self.down_filter), RATIO)
    }
}
