//! The UNet's convolutional blocks: the time-conditioned resnet and the 2× resamplers.
//! Activations are images `[W, H, C, B]` (ggml order).

use crate::ggml::{ScaleMode, Tensor};
use crate::nn::{Conv2d, GroupNorm, Linear};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::layout::UNetLayout;

/// Shared construction settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub layout: UNetLayout,
    pub groups: usize,
    /// Epsilon of the resnet and output norms.
    pub eps: f32,
    pub time_embed_dim: usize,
}

impl Ctx {
    /// A GroupNorm over `channels`, refusing widths the groups do not divide.
    pub fn group_norm(
        &self,
        wb: &WeightBuilder<'_, '_>,
        channels: usize,
        eps: f32,
    ) -> Result<GroupNorm, RunnerError> {
        if self.groups == 0 || !channels.is_multiple_of(self.groups) {
            return Err(wb.bad_data(
                "weight",
                "UNet config",
                format!(
                    "{channels} channels do not split into {} norm groups",
                    self.groups
                ),
            ));
        }
        GroupNorm::new(wb, self.groups, channels, eps)
    }
}

/// `GroupNorm → SiLU → conv3×3`, plus the projected timestep embedding, then `GroupNorm →
/// SiLU → conv3×3`, plus the input (through a 1×1 conv when the width changes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    emb: Linear,
    norm2: GroupNorm,
    conv2: Conv2d,
    shortcut: Option<Conv2d>,
    out_channels: usize,
}

impl ResBlock {
    pub fn new(
        c: &Ctx,
        wb: &WeightBuilder<'_, '_>,
        in_ch: usize,
        out_ch: usize,
    ) -> Result<Self, RunnerError> {
        let n = c.layout.resnet();
        let shortcut = if in_ch != out_ch {
            Some(Conv2d::new_matrix(
                &wb.pp(n.shortcut),
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
            norm1: c.group_norm(&wb.pp(n.norm1), in_ch, c.eps)?,
            conv1: Conv2d::new_matrix(&wb.pp(n.conv1), in_ch, out_ch, 3, 1, 1, true)?,
            emb: Linear::new(&wb.pp(n.emb), c.time_embed_dim, out_ch, true)?,
            norm2: c.group_norm(&wb.pp(n.norm2), out_ch, c.eps)?,
            conv2: Conv2d::new_matrix(&wb.pp(n.conv2), out_ch, out_ch, 3, 1, 1, true)?,
            shortcut,
            out_channels: out_ch,
        })
    }

    /// x: [W, H, C_in, B]; emb_act: SiLU of the timestep embedding [T, B].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        emb_act: Tensor<'g>,
    ) -> Tensor<'g> {
        let batch = x.ne()[3];
        let h = self.conv1.forward(g, self.norm1.forward_silu(g, x));
        let e = self.emb.forward(g, emb_act);
        let h = g.add(h, g.reshape(e, [1, 1, self.out_channels, batch]));
        let h = self.conv2.forward(g, self.norm2.forward_silu(g, h));
        let skip = match &self.shortcut {
            Some(conv) => conv.forward(g, x),
            None => x,
        };
        g.add(h, skip)
    }
}

/// Halves the resolution: a 3×3 stride-2 conv with 1-pixel padding (odd sizes round up).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Downsample {
    conv: Conv2d,
}

impl Downsample {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        Ok(Self {
            conv: Conv2d::new_matrix(wb, channels, channels, 3, 2, 1, true)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.conv.forward(g, x)
    }
}

/// Nearest-neighbour resize to the skip tensor's size (2× unless an odd size was rounded up on
/// the way down, as diffusers' `upsample_size`), then a 3×3 conv.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Upsample {
    conv: Conv2d,
}

impl Upsample {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        Ok(Self {
            conv: Conv2d::new_matrix(wb, channels, channels, 3, 1, 1, true)?,
        })
    }

    /// x: [W, H, C, B] → [width, height, C, B].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        (width, height): (usize, usize),
    ) -> Tensor<'g> {
        let [_, _, c, n] = x.ne();
        let x = g.interpolate(x, [width, height, c, n], ScaleMode::Nearest);
        self.conv.forward(g, x)
    }
}
