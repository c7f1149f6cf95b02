use crate::ggml::{ConvGeometry, Tensor};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder, WeightRole};

/// PyTorch `nn.Conv2d` (groups = 1); the kernel is [KW, KH, IC, OC] in ggml order, or the
/// matrix [KW·KH·IC, OC] for [`Conv2d::new_matrix`].
#[derive(Clone, Copy, Debug)]
pub struct Conv2d {
    pub weight: Param,
    pub bias: Option<Param>,
    pub out_channels: usize,
    pub stride: usize,
    pub padding: usize,
    /// Side of the square kernel when `weight` is stored as a matrix.
    matrix_kernel: Option<usize>,
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
        let shape = (in_channels, out_channels, kernel);
        Self::declare(wb, shape, (stride, padding), bias, false)
    }

    /// Like [`Conv2d::new`], with the kernel kept as a matrix, so that `--type` converts it
    /// like a linear weight and the product runs through the matmul kernels of that type.
    pub fn new_matrix(
        wb: &WeightBuilder<'_, '_>,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    ) -> Result<Self, RunnerError> {
        let shape = (in_channels, out_channels, kernel);
        Self::declare(wb, shape, (stride, padding), bias, true)
    }

    fn declare(
        wb: &WeightBuilder<'_, '_>,
        (in_channels, out_channels, kernel): (usize, usize, usize),
        (stride, padding): (usize, usize),
        bias: bool,
        matrix: bool,
    ) -> Result<Self, RunnerError> {
        let role = WeightRole::Conv {
            kernel: (kernel, kernel),
        };
        let weight = if matrix {
            let ne = [kernel * kernel * in_channels, out_channels, 1, 1];
            wb.get_as("weight", ne, Storage::Matrix, role)?
        } else {
            let ne = [kernel, kernel, in_channels, out_channels];
            wb.get_as("weight", ne, Storage::Float, role)?
        };
        let bias = bias
            .then(|| wb.get("bias", [out_channels, 1, 1, 1], Storage::F32))
            .transpose()?;
        Ok(Self {
            weight,
            bias,
            out_channels,
            stride,
            padding,
            matrix_kernel: matrix.then_some(kernel),
        })
    }

    /// x: [W, H, IC, N] → [W', H', OC, N] (plus the kernel's run-time adapter, if any).
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let y = self.forward_plain(g, x);
        g.adapt_conv(self.weight, x, y, self.stride, self.padding)
    }

    fn forward_plain<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let (s, p) = (self.stride, self.padding);
        if let Some(k) = self.matrix_kernel {
            let geometry = ConvGeometry {
                kernel: (k, k),
                stride: (s, s),
                pad: (p, p),
                dilation: (1, 1),
            };
            let bias = self.bias.map(|b| g.param(b));
            return g.conv_2d_matrix(g.param(self.weight), x, geometry, bias);
        }
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
