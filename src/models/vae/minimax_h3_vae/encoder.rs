//! The causal 3-D CNN encoder on one clip `[W, H, C, T]` (ggml order: the frames ride in the
//! batch slot, so per-frame ops such as the group norm apply unchanged).
//!
//! Every 3×3×3 conv pads space by reflection and time causally: two zero frames in front,
//! none behind (diffusers `MiniMaxH3VideoCausalConv3d`). A conv is the sum of its three
//! temporal taps, each a 2D conv over the frames it reads (shared with the Wan VAE's causal
//! convs); taps that would only meet the zero frames are skipped. A clip is encoded whole, in
//! one graph: clips never share history.

use crate::ggml::Tensor;
use crate::models::vae::qwen_image_2_1_vae::blocks::Conv;
use crate::models::vae::wan_vae::posterior_mean;
use crate::models::vae::wan_vae::video::causal::{frames, sum_taps};
use crate::nn::GroupNorm;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::config::MiniMaxH3VaeConfig;

/// Temporal taps of the causal kernels.
const DEPTH: usize = 3;

/// A 3×3×3 conv, causal in time with stride `time_stride`, spatial stride in `conv.stride`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CausalConv {
    conv: Conv,
    time_stride: usize,
    /// Pad space by one reflected pixel on every side first (the stride-1 convs).
    reflect: bool,
}

impl CausalConv {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        in_ch: usize,
        out_ch: usize,
        strides: (usize, usize),
        reflect: bool,
    ) -> Result<Self, RunnerError> {
        let conv = Conv::new(wb, in_ch, out_ch, 3, strides.1, 0)?;
        if conv.frames != DEPTH {
            return Err(wb.bad_data(
                "weight",
                "MiniMax-H3 video VAE weights",
                format!("expected a 3x3x3 Conv3d kernel [{out_ch}, {in_ch}, 3, 3, 3]"),
            ));
        }
        Ok(Self {
            conv,
            time_stride: strides.0,
            reflect,
        })
    }

    /// x [W, H, I, T] → [W', H', O, (T − 1) / stride + 1].
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let x = if self.reflect {
            reflect_pad(g, x, true, true)
        } else {
            x
        };
        let t = x.ne()[3];
        let ts = self.time_stride;
        let outputs = (t - 1) / ts + 1;
        // Output j reads input frame j·ts + dt − 2 through tap dt; below 0 is a causal zero.
        let windows: Vec<_> = (0..DEPTH)
            .filter_map(|dt| {
                let lead = (DEPTH - 1 - dt).div_ceil(ts);
                (lead < outputs).then(|| {
                    let first = lead * ts + dt + 1 - DEPTH;
                    (dt, strided_frames(g, x, first, outputs - lead, ts), lead)
                })
            })
            .collect();
        sum_taps(g, &self.conv, &windows)
    }
}

/// Frames `start, start + step, …` (`len` of them) of x [W, H, C, T].
fn strided_frames<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    start: usize,
    len: usize,
    step: usize,
) -> Tensor<'g> {
    if step == 1 {
        return frames(g, x, start, len);
    }
    let [w, h, c, _] = x.ne();
    let nb = x.nb();
    g.cont(g.view(
        x,
        [w, h, c, len],
        [nb[1], nb[2], step * nb[3]],
        start * nb[3],
    ))
}

/// One reflected pixel before and/or after x [W, H, C, T] along W and H (PyTorch
/// `F.pad(mode="reflect")` by 1: the neighbour of the edge, not the edge).
fn reflect_pad<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>, before: bool, after: bool) -> Tensor<'g> {
    let line = |x: Tensor<'g>, axis: usize, at: usize| {
        let mut ne = x.ne();
        ne[axis] = 1;
        let nb = x.nb();
        g.cont(g.view(x, ne, [nb[1], nb[2], nb[3]], at * nb[axis]))
    };
    let mut y = x;
    for axis in 0..2 {
        let n = y.ne()[axis];
        if before {
            y = g.concat(line(y, axis, 1), y, axis);
        }
        if after {
            let last = if before { n - 1 } else { n - 2 };
            y = g.concat(y, line(y, axis, last), axis);
        }
    }
    y
}

/// group norm → SiLU → conv → group norm → SiLU → conv, plus the input (through a 1×1×1 conv
/// when the width changes).
#[derive(Clone, Copy, Debug)]
struct Resnet {
    norm1: GroupNorm,
    conv1: CausalConv,
    norm2: GroupNorm,
    conv2: CausalConv,
    shortcut: Option<Conv>,
}

impl Resnet {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &MiniMaxH3VaeConfig,
        in_ch: usize,
        out_ch: usize,
    ) -> Result<Self, RunnerError> {
        let norm = |name: &str, ch| GroupNorm::new(&wb.pp(name), c.norm_groups, ch, c.norm_eps);
        let shortcut = if in_ch != out_ch {
            Some(Conv::new(
                &wb.pp(c.layout.shortcut()),
                in_ch,
                out_ch,
                1,
                1,
                0,
            )?)
        } else {
            None
        };
        Ok(Self {
            norm1: norm("norm1", in_ch)?,
            conv1: CausalConv::new(&wb.pp("conv1"), in_ch, out_ch, (1, 1), true)?,
            norm2: norm("norm2", out_ch)?,
            conv2: CausalConv::new(&wb.pp("conv2"), out_ch, out_ch, (1, 1), true)?,
            shortcut,
        })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let h = self.conv1.forward(g, self.norm1.forward_silu(g, x));
        let h = self.conv2.forward(g, self.norm2.forward_silu(g, h));
        let skip = match &self.shortcut {
            Some(conv) => conv.forward(g, x),
            None => x,
        };
        g.add(skip, h)
    }
}

#[derive(Clone, Debug)]
struct Level {
    resnets: Vec<Resnet>,
    /// The strided conv and whether it halves space (then the input is first padded by one
    /// reflected pixel on the right and bottom, so the output is `ceil(size / 2)`).
    down: Option<(CausalConv, bool)>,
}

/// The encoder with `quant_conv`.
#[derive(Clone, Debug)]
pub(crate) struct Encoder {
    conv_in: CausalConv,
    levels: Vec<Level>,
    norm_out: GroupNorm,
    conv_out: CausalConv,
    quant: Conv,
    latent: usize,
}

impl Encoder {
    pub(crate) fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &MiniMaxH3VaeConfig,
    ) -> Result<Self, RunnerError> {
        let widths = &c.block_out_channels;
        let first = widths[0];
        let conv_in = CausalConv::new(
            &wb.pp("encoder.conv_in"),
            c.in_channels,
            first,
            (1, 1),
            true,
        )?;
        let mut levels = Vec::with_capacity(widths.len());
        let mut prev = first;
        for (i, &width) in widths.iter().enumerate() {
            let resnets = (0..c.layers_per_block)
                .map(|j| {
                    let in_ch = if j == 0 { prev } else { width };
                    Resnet::new(&wb.pp(c.layout.resnet(i, j)), c, in_ch, width)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let (s, t) = (c.spatial_factors[i], c.temporal_factors[i]);
            let down = if s * t > 1 {
                let conv =
                    CausalConv::new(&wb.pp(c.layout.downsampler(i)), width, width, (t, s), false)?;
                Some((conv, s == 2))
            } else {
                None
            };
            levels.push(Level { resnets, down });
            prev = width;
        }
        let z2 = 2 * c.latent_channels;
        Ok(Self {
            conv_in,
            levels,
            norm_out: GroupNorm::new(&wb.pp("encoder.norm_out"), c.norm_groups, prev, c.norm_eps)?,
            conv_out: CausalConv::new(&wb.pp("encoder.conv_out"), prev, z2, (1, 1), true)?,
            quant: Conv::new(&wb.pp("quant_conv"), z2, z2, 1, 1, 0)?,
            latent: c.latent_channels,
        })
    }

    /// One clip x [W, H, C_in, T] (ImageNet-normalised pixels) → the posterior mean
    /// [W/f, H/f, latent, latent frames].
    pub(crate) fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.conv_in.forward(g, x);
        for (i, level) in self.levels.iter().enumerate() {
            for r in &level.resnets {
                x = r.forward(g, x);
            }
            if let Some((conv, halve_space)) = &level.down {
                if *halve_space {
                    x = reflect_pad(g, x, false, true);
                }
                x = conv.forward(g, x);
            }
            x = g.cut(&format!("minimax_h3_vae.encoder.down.{i}"), "x", x);
        }
        let x = self.conv_out.forward(g, self.norm_out.forward_silu(g, x));
        posterior_mean(g, self.quant.forward(g, x), self.latent)
    }
}
