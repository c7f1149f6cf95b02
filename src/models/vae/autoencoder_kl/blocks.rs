//! The AutoencoderKL building blocks: resnet, single-head mid attention, mid block, and the
//! 2× resamplers. Activations are images `[W, H, C, N]` (ggml order).

use crate::ggml::{ScaleMode, Tensor};
use crate::nn::{self, Conv2d, GroupNorm};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::layout::{Names, Part};

/// GroupNorm epsilon of every norm in the autoencoder.
pub(crate) const NORM_EPS: f32 = 1e-6;

/// Shared construction settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub names: Names,
    pub groups: usize,
}

impl Ctx {
    pub fn group_norm(
        &self,
        wb: &WeightBuilder<'_, '_>,
        channels: usize,
    ) -> Result<GroupNorm, RunnerError> {
        if self.groups == 0 || !channels.is_multiple_of(self.groups) {
            return Err(RunnerError::BadData {
                key: wb.key("weight"),
                origin: "AutoencoderKL config".into(),
                reason: format!(
                    "{channels} channels do not split into {} groups",
                    self.groups
                ),
            });
        }
        GroupNorm::new(wb, self.groups, channels, NORM_EPS)
    }
}

/// `GroupNorm → SiLU → conv3×3 → GroupNorm → SiLU → conv3×3`, plus the input (through a 1×1
/// conv when the width changes). No time embedding in the autoencoder.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResnetBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    norm2: GroupNorm,
    conv2: Conv2d,
    shortcut: Option<Conv2d>,
}

impl ResnetBlock {
    pub fn new(
        c: &Ctx,
        wb: &WeightBuilder<'_, '_>,
        in_ch: usize,
        out_ch: usize,
    ) -> Result<Self, RunnerError> {
        let shortcut = if in_ch != out_ch {
            Some(Conv2d::new(
                &wb.pp(c.names.shortcut()),
                in_ch,
                out_ch,
                1,
                1,
                0,
                true,
            )?)
        } else {
            None
        };
        Ok(Self {
            norm1: c.group_norm(&wb.pp("norm1"), in_ch)?,
            conv1: Conv2d::new(&wb.pp("conv1"), in_ch, out_ch, 3, 1, 1, true)?,
            norm2: c.group_norm(&wb.pp("norm2"), out_ch)?,
            conv2: Conv2d::new(&wb.pp("conv2"), out_ch, out_ch, 3, 1, 1, true)?,
            shortcut,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let h = self.conv1.forward(g, self.norm1.forward_silu(g, x));
        let h = self.conv2.forward(g, self.norm2.forward_silu(g, h));
        let skip = match &self.shortcut {
            Some(conv) => conv.forward(g, x),
            None => x,
        };
        g.add(h, skip)
    }
}

/// A channel projection stored either as a Linear (`[C, C]`, diffusers) or as a 1×1 conv
/// (`[1, 1, C, C]`, LDM). Both are the same matrix in memory.
#[derive(Clone, Copy, Debug)]
struct Projection {
    weight: Param,
    bias: Param,
    channels: usize,
}

impl Projection {
    fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        let c = channels;
        let conv_shaped = wb
            .source_ne("weight")
            .is_some_and(|ne| ne == [1, 1, c, c] && c > 1);
        let weight = if conv_shaped {
            // Kept as a float type: the 1-wide rows could not be re-quantized anyway.
            wb.get("weight", [1, 1, c, c], Storage::Float)?
        } else {
            wb.get("weight", [c, c, 1, 1], Storage::Any)?
        };
        Ok(Self {
            weight,
            bias: wb.get("bias", [c, 1, 1, 1], Storage::F32)?,
            channels: c,
        })
    }

    /// x: [C, T, N] → [C, T, N].
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let w = g.param(self.weight);
        let w = if w.ne()[0] == self.channels {
            w
        } else {
            g.reshape(w, [self.channels, self.channels, 1, 1])
        };
        g.add(g.mul_mat(w, x), g.param(self.bias))
    }
}

/// Single-head self-attention over all pixels, with a residual connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MidAttention {
    norm: GroupNorm,
    q: Projection,
    k: Projection,
    v: Projection,
    out: Projection,
}

impl MidAttention {
    pub fn new(c: &Ctx, wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        let [norm, q, k, v, out] = c.names.attn_leaves();
        Ok(Self {
            norm: c.group_norm(&wb.pp(norm), channels)?,
            q: Projection::new(&wb.pp(q), channels)?,
            k: Projection::new(&wb.pp(k), channels)?,
            v: Projection::new(&wb.pp(v), channels)?,
            out: Projection::new(&wb.pp(out), channels)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let [w, h, c, n] = x.ne();
        let t = self.norm.forward(g, x);
        // [W, H, C, N] -> [C, W*H, N]: tokens row-major (w fastest), as PyTorch flattens H×W.
        let t = g.cont_reshape(g.permute(t, [1, 2, 0, 3]), [c, w * h, n, 1]);
        let q = self.q.forward(g, t);
        let k = self.k.forward(g, t);
        let v = self.v.forward(g, t);
        let o = self.out.forward(g, nn::attention(g, q, k, v, 1, None));
        // [C, W, H, N] -> [W, H, C, N]
        let o = g.cont(g.permute(g.reshape(o, [c, w, h, n]), [2, 0, 1, 3]));
        g.add(o, x)
    }
}

/// resnet → (attention) → resnet at the deepest level.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MidBlock {
    resnet_1: ResnetBlock,
    attention: Option<MidAttention>,
    resnet_2: ResnetBlock,
}

impl MidBlock {
    pub fn new(
        c: &Ctx,
        wb: &WeightBuilder<'_, '_>,
        part: Part,
        channels: usize,
        attention: bool,
    ) -> Result<Self, RunnerError> {
        let n = &c.names;
        let attention = if attention {
            Some(MidAttention::new(c, &wb.pp(n.mid_attn(part)), channels)?)
        } else {
            None
        };
        Ok(Self {
            resnet_1: ResnetBlock::new(c, &wb.pp(n.mid_resnet(part, 0)), channels, channels)?,
            attention,
            resnet_2: ResnetBlock::new(c, &wb.pp(n.mid_resnet(part, 1)), channels, channels)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.resnet_1.forward(g, x);
        if let Some(attn) = &self.attention {
            x = attn.forward(g, x);
        }
        self.resnet_2.forward(g, x)
    }
}

/// Halves the resolution: zero-pad one pixel on the right and bottom, then a 3×3 stride-2
/// conv without padding (diffusers `Downsample2D(padding=0)`; odd sizes round up).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Downsample {
    conv: Conv2d,
}

impl Downsample {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        Ok(Self {
            conv: Conv2d::new(wb, channels, channels, 3, 2, 0, true)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let x = g.pad(x, [(0, 1), (0, 1), (0, 0), (0, 0)]);
        self.conv.forward(g, x)
    }
}

/// Doubles the resolution: nearest-neighbour 2× then a 3×3 conv.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Upsample {
    conv: Conv2d,
}

impl Upsample {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        Ok(Self {
            conv: Conv2d::new(wb, channels, channels, 3, 1, 1, true)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let [w, h, c, n] = x.ne();
        let x = g.interpolate(x, [2 * w, 2 * h, c, n], ScaleMode::Nearest);
        self.conv.forward(g, x)
    }
}
