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
        if self.weight.is_some() || self.bias.is_some() {
            let (w, b) = (
                self.weight.map(|p| g.param(p)),
                self.bias.map(|p| g.param(p)),
            );
            if let Some(y) = g
                .cpu_kernels()
                .and_then(|k| k.layer_norm(g.ctx(), x, self.eps, w, b))
            {
                return y;
            }
        }
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
        Self::named(wb, "weight", dim, eps)
    }

    /// The same with the scale stored as `name` (BFL's FLUX checkpoints say `scale`).
    pub fn named(
        wb: &WeightBuilder<'_, '_>,
        name: &str,
        dim: usize,
        eps: f32,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            weight: wb.get(name, [dim, 1, 1, 1], Storage::F32)?,
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
        self.forward_maybe_silu(g, x, false)
    }

    /// `silu(forward(x))`, in one pass with the CPU kernels.
    pub fn forward_silu<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.forward_maybe_silu(g, x, true)
    }

    fn forward_maybe_silu<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, silu: bool) -> Tensor<'g> {
        let (w, b) = (g.param(self.weight), g.param(self.bias));
        let fused = g
            .cpu_kernels()
            .and_then(|k| k.group_norm(g.ctx(), x, self.groups, self.eps, w, b, silu));
        if let Some(y) = fused {
            return y;
        }
        let y = g.group_norm(x, self.groups, self.eps);
        let w = g.reshape(w, [1, 1, self.channels, 1]);
        let b = g.reshape(b, [1, 1, self.channels, 1]);
        let y = g.add(g.mul(y, w), b);
        if silu {
            g.silu(y)
        } else {
            y
        }
    }
}
