use crate::ggml::Tensor;
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

/// PyTorch `nn.Conv2d` (groups = 1); the kernel is [KW, KH, IC, OC] in ggml order.
#[derive(Clone, Copy, Debug)]
pub struct Conv2d {
    pub weight: Param,
    pub bias: Option<Param>,
    pub out_channels: usize,
    pub stride: usize,
    pub padding: usize,
}

impl Conv2d {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    ) -> Result<Self, RunnerError> {
        let weight = wb.get(
            "weight",
            [kernel, kernel, in_channels, out_channels],
            Storage::Float,
        )?;
        let bias = if bias {
            Some(wb.get("bias", [out_channels, 1, 1, 1], Storage::F32)?)
        } else {
            None
        };
        Ok(Self {
            weight,
            bias,
            out_channels,
            stride,
            padding,
        })
    }

    /// x: [W, H, IC, N] → [W', H', OC, N].
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let (s, p) = (self.stride, self.padding);
        let y = g.conv_2d(g.param(self.weight), x, (s, s), (p, p), (1, 1), false);
        match self.bias {
            Some(b) => {
                let b = g.reshape(g.param(b), [1, 1, self.out_channels, 1]);
                g.add(y, b)
            }
            None => y,
        }
    }
}
