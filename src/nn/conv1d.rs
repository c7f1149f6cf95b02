//! 1-D convolutions over sequences laid out `[T, C, N]` (ggml order: time fastest, then
//! channels, then batch; PyTorch's `[N, C, T]`).
//!
//! [`Conv1d`] runs as a 2-D convolution of height 1, so it shares the im2col path and the
//! blocked CPU kernels of [`Conv2d`](super::Conv2d); [`ConvTranspose1d`] uses ggml's
//! transposed convolution, one batch item at a time (ggml's op takes a single sequence).

use crate::ggml::Tensor;
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

/// Sizes of a 1-D convolution's kernel, read from its weight `[K, IC, OC]` (ggml order).
fn kernel_ne(
    wb: &WeightBuilder<'_, '_>,
    origin: &str,
) -> Result<(usize, usize, usize), RunnerError> {
    let ne = wb.require_ne("weight", origin)?;
    if ne[3] != 1 || ne.contains(&0) {
        return Err(wb.bad_data(
            "weight",
            origin,
            format!("shape {ne:?} is not a 1-D convolution kernel [K, IC, OC]"),
        ));
    }
    Ok((ne[0], ne[1], ne[2]))
}

/// PyTorch `nn.Conv1d` (groups = 1). The kernel is `[K, IC, OC]` in ggml order.
#[derive(Clone, Copy, Debug)]
pub struct Conv1d {
    pub weight: Param,
    pub bias: Option<Param>,
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
}

impl Conv1d {
    /// Declares `<path>.weight` `[kernel, in, out]` and, when `bias`, `<path>.bias`; stride
    /// and dilation 1, no padding (see [`Conv1d::with`]).
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        bias: bool,
    ) -> Result<Self, RunnerError> {
        let ne = [kernel, in_channels, out_channels, 1];
        let weight = wb.get("weight", ne, Storage::Float)?;
        let bias = bias
            .then(|| wb.get("bias", [out_channels, 1, 1, 1], Storage::F32))
            .transpose()?;
        Ok(Self {
            weight,
            bias,
            in_channels,
            out_channels,
            kernel,
            stride: 1,
            padding: 0,
            dilation: 1,
        })
    }

    /// Like [`Conv1d::new`] with every size read from the weight's shape (errors name the
    /// weight and `origin`); the bias is taken when the file has one.
    pub fn from_weights(wb: &WeightBuilder<'_, '_>, origin: &str) -> Result<Self, RunnerError> {
        let (k, i, o) = kernel_ne(wb, origin)?;
        Self::new(wb, i, o, k, wb.contains("bias"))
    }

    /// Sets stride, zero padding (both sides) and dilation.
    pub fn with(mut self, stride: usize, padding: usize, dilation: usize) -> Self {
        self.stride = stride;
        self.padding = padding;
        self.dilation = dilation;
        self
    }

    /// Output length for an input of `t` samples (0 when the input is too short).
    pub fn out_len(&self, t: usize) -> usize {
        let span = self.dilation * (self.kernel - 1) + 1;
        (t + 2 * self.padding)
            .checked_sub(span)
            .map_or(0, |n| n / self.stride + 1)
    }

    /// x: `[T, IC, N]` → `[T', OC, N]`.
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let [t, c, n, _] = x.ne();
        let x = if x.is_contiguous() { x } else { g.cont(x) };
        let x = g.reshape(x, [t, 1, c, n]);
        let k = g.reshape(
            g.param(self.weight),
            [self.kernel, 1, self.in_channels, self.out_channels],
        );
        let y = g.conv_2d(
            k,
            x,
            (self.stride, 1),
            (self.padding, 0),
            (self.dilation, 1),
            false,
        );
        let t_out = y.ne()[0];
        let y = g.reshape(y, [t_out, self.out_channels, n, 1]);
        match self.bias {
            Some(b) => g.add(y, g.reshape(g.param(b), [1, self.out_channels, 1, 1])),
            None => y,
        }
    }
}

/// PyTorch `nn.ConvTranspose1d` (groups = 1, dilation 1, no output padding). The kernel is
/// `[K, OC, IC]` in ggml order (PyTorch's `[IC, OC, K]`), kept in f32 (ggml's CPU kernel
/// takes no other type).
#[derive(Clone, Copy, Debug)]
pub struct ConvTranspose1d {
    pub weight: Param,
    pub bias: Option<Param>,
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel: usize,
    pub stride: usize,
    /// Samples cropped from each end of the full transposed output.
    pub padding: usize,
}

impl ConvTranspose1d {
    /// Declares `<path>.weight` `[K, OC, IC]` with its sizes read from the file, and its bias
    /// when present.
    pub fn from_weights(
        wb: &WeightBuilder<'_, '_>,
        stride: usize,
        padding: usize,
        origin: &str,
    ) -> Result<Self, RunnerError> {
        let (k, o, i) = kernel_ne(wb, origin)?;
        let weight = wb.get("weight", [k, o, i, 1], Storage::F32)?;
        let bias = wb.maybe("bias", [o, 1, 1, 1], Storage::F32)?;
        Ok(Self {
            weight,
            bias,
            in_channels: i,
            out_channels: o,
            kernel: k,
            stride,
            padding,
        })
    }

    /// Output length for an input of `t` samples: `(t − 1)·stride + K − 2·padding`.
    pub fn out_len(&self, t: usize) -> usize {
        ((t.max(1) - 1) * self.stride + self.kernel).saturating_sub(2 * self.padding)
    }

    /// x: `[T, IC, N]` → `[T', OC, N]`.
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let [t, c, n, _] = x.ne();
        let x = if x.is_contiguous() { x } else { g.cont(x) };
        let w = g.param(self.weight);
        let full = (t - 1) * self.stride + self.kernel;
        let t_out = self.out_len(t);
        let mut out: Option<Tensor<'g>> = None;
        for i in 0..n {
            let xi = g.view(
                x,
                [t, c, 1, 1],
                [x.nb()[1], x.nb()[2], x.nb()[3]],
                i * x.nb()[2],
            );
            let y = g.conv_transpose_1d(w, xi, self.stride);
            debug_assert_eq!(y.ne()[0], full);
            let nb = y.nb();
            let y = g.view(
                y,
                [t_out, self.out_channels, 1, 1],
                [nb[1], nb[2], nb[3]],
                self.padding * nb[0],
            );
            out = Some(match out {
                None => g.cont(y),
                Some(o) => g.concat(o, y, 2),
            });
        }
        let y = out.expect("a batch of at least one sequence");
        match self.bias {
            Some(b) => g.add(y, g.reshape(g.param(b), [1, self.out_channels, 1, 1])),
            None => y,
        }
    }
}
