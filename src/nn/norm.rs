use crate::ggml::Tensor;
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

/// PyTorch `nn.LayerNorm` over `ne[0]`, with optional affine parameters.
#[derive(Clone, Copy, Debug)]
pub struct LayerNorm {
    pub weight: Option<Param>,
    pub bias: Option<Param>,
    pub eps: f32,
}

impl LayerNorm {
    /// Declares `weight`/`bias` of size `dim` when `affine`.
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        dim: usize,
        eps: f32,
        affine: bool,
    ) -> Result<Self, RunnerError> {
        let (weight, bias) = if affine {
            (
                Some(wb.get("weight", [dim, 1, 1, 1], Storage::F32)?),
                wb.maybe("bias", [dim, 1, 1, 1], Storage::F32)?,
            )
        } else {
            (None, None)
        };
        Ok(Self { weight, bias, eps })
    }

    /// A norm without parameters (`elementwise_affine=False`).
    pub fn plain(eps: f32) -> Self {
        Self {
            weight: None,
            bias: None,
            eps,
        }
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut y = g.norm(x, self.eps);
        if let Some(w) = self.weight {
            y = g.mul(y, g.param(w));
        }
        if let Some(b) = self.bias {
            y = g.add(y, g.param(b));
        }
        y
    }
}

/// RMS norm over `ne[0]` with a learned scale (T5 `T5LayerNorm`, Qwen `RMSNorm`).
#[derive(Clone, Copy, Debug)]
pub struct RmsNorm {
    pub weight: Param,
    pub eps: f32,
}

impl RmsNorm {
    pub fn new(wb: &WeightBuilder<'_, '_>, dim: usize, eps: f32) -> Result<Self, RunnerError> {
        Ok(Self {
            weight: wb.get("weight", [dim, 1, 1, 1], Storage::F32)?,
            eps,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        g.mul(g.rms_norm(x, self.eps), g.param(self.weight))
    }
}

/// PyTorch `nn.GroupNorm` on images [W, H, C, N] with per-channel affine parameters.
#[derive(Clone, Copy, Debug)]
pub struct GroupNorm {
    pub weight: Param,
    pub bias: Param,
    pub groups: usize,
    pub channels: usize,
    pub eps: f32,
}

impl GroupNorm {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        groups: usize,
        channels: usize,
        eps: f32,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            weight: wb.get("weight", [channels, 1, 1, 1], Storage::F32)?,
            bias: wb.get("bias", [channels, 1, 1, 1], Storage::F32)?,
            groups,
            channels,
            eps,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let y = g.group_norm(x, self.groups, self.eps);
        let w = g.reshape(g.param(self.weight), [1, 1, self.channels, 1]);
        let b = g.reshape(g.param(self.bias), [1, 1, self.channels, 1]);
        g.add(g.mul(y, w), b)
    }
}
