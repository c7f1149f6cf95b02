//! Building blocks of the Qwen Image 2.1 VAE on single images `[W, H, C, N]` (ggml order):
//! convolutions that may be stored as one-frame 3D kernels, the channel RMS norm, the residual
//! block and the single-head mid attention.

use crate::dtype::DType;
use crate::ggml::{ConvGeometry, Tensor};
use crate::nn;
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::layout::{Names, Part};

/// Added to the mean square in the channel norm. diffusers divides by `max(‖x‖, 1e-12)`; this
/// only keeps an all-zero pixel at zero instead of NaN.
const NORM_EPS: f32 = 1e-24;

/// Input scale of convolutions with f16 kernels.
pub(crate) const F16_CONV_SCALE: f32 = 1.0 / 128.0;

/// A 2D convolution whose kernel is stored either as `[K, K, I, O]` (ggml order; PyTorch
/// Conv2d) or folded from a causal Conv3d, `[K, K, T, I·O]` (PyTorch `[O, I, T, K, K]`).
///
/// A causal Conv3d pads `T − 1` zero frames in front of a clip, so on a single frame only the
/// last temporal slice of the kernel meets real data: that slice is the 2D kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conv {
    pub(crate) weight: Param,
    pub(crate) bias: Param,
    pub(crate) kernel: usize,
    pub(crate) in_ch: usize,
    pub(crate) out_ch: usize,
    /// Temporal depth of a folded 3D kernel; 0 for a plain 2D kernel.
    pub(crate) frames: usize,
    pub(crate) stride: usize,
    pub(crate) padding: usize,
}

/// (in, out, temporal depth or 0) of a conv stored under `wb`, read from the weight and bias shapes.
pub(crate) fn conv_shape(wb: &WeightBuilder<'_, '_>) -> Option<(usize, usize, usize)> {
    let out = wb.source_ne("bias")?[0];
    let w = wb.source_ne("weight")?;
    if out == 0 {
        return None;
    }
    if w[3] == out {
        Some((w[2], out, 0))
    } else if w[3].is_multiple_of(out) {
        Some((w[3] / out, out, w[2]))
    } else {
        None
    }
}

impl Conv {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        in_ch: usize,
        out_ch: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self, RunnerError> {
        let plain = [kernel, kernel, in_ch, out_ch];
        let found = wb.source_ne("weight");
        let frames = match found {
            Some([k0, k1, t, io]) if k0 == kernel && k1 == kernel && io == in_ch * out_ch => {
                // A folded 3D kernel, unless it is the plain shape (in = 1 cannot tell).
                if [k0, k1, t, io] == plain {
                    0
                } else {
                    t
                }
            }
            _ => 0,
        };
        let ne = if frames == 0 {
            plain
        } else {
            [kernel, kernel, frames, in_ch * out_ch]
        };
        Ok(Self {
            weight: wb.get("weight", ne, Storage::Float)?,
            bias: wb.get("bias", [out_ch, 1, 1, 1], Storage::F32)?,
            kernel,
            in_ch,
            out_ch,
            frames,
            stride,
            padding,
        })
    }

    /// The 2D kernel [K, K, I, O].
    fn kernel<'g>(&self, g: &'g GraphCtx<'g>) -> Tensor<'g> {
        let w = g.param(self.weight);
        let (k, i, o) = (self.kernel, self.in_ch, self.out_ch);
        match self.frames {
            0 => w,
            1 => g.reshape(w, [k, k, i, o]),
            t => {
                let nb = w.nb();
                let last = g.view(w, [k, k, 1, i * o], [nb[1], nb[2], nb[3]], (t - 1) * nb[2]);
                g.reshape(g.cont(last), [k, k, i, o])
            }
        }
    }

    /// x: [W, H, I, N] → [W', H', O, N].
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let y = conv_plain(g, self.kernel(g), x, self.stride, self.padding);
        g.add(y, g.reshape(g.param(self.bias), [1, 1, self.out_ch, 1]))
    }
}

/// x [W, H, I, N] convolved by `kernel` [K, K, I, O] (no bias). On the CPU with the blocked
/// kernels, as the matrix [I·K·K, O] whose patches are built a chunk at a time inside the
/// product (f16 kernels widened there, activations f32): a whole im2col of a video chunk at
/// 480×832 (96 channels × 9 taps × 4 frames) would take 5.5 GB. Elsewhere ggml's im2col conv;
/// there f16 kernels convolve f16 patches, and this VAE's activations can leave the f16 range,
/// so the conv runs on x / 128 and the result is scaled back (as stable-diffusion.cpp does).
pub(crate) fn conv_plain<'g>(
    g: &'g GraphCtx<'g>,
    kernel: Tensor<'g>,
    x: Tensor<'g>,
    stride: usize,
    padding: usize,
) -> Tensor<'g> {
    let (s, p) = (stride, padding);
    let [kw, kh, i, o] = kernel.ne();
    let blocked = g.cpu_kernels().is_some()
        && x.ty() == DType::F32
        && crate::ggml::blocked_gemm_available(kernel.ty());
    if blocked {
        // [KW, KH, I, O] → [I, KW, KH, O]: each row of the matrix a tap's channels.
        let matrix = g.reshape(
            g.cont(g.permute(kernel, [1, 2, 0, 3])),
            [i * kw * kh, o, 1, 1],
        );
        let geometry = ConvGeometry {
            kernel: (kw, kh),
            stride: (s, s),
            pad: (p, p),
            dilation: (1, 1),
        };
        return g.conv_2d_matrix(matrix, x, geometry, None);
    }
    if kernel.ty() == DType::F16 {
        let y = g.conv_2d(
            kernel,
            g.scale(x, F16_CONV_SCALE),
            (s, s),
            (p, p),
            (1, 1),
            false,
        );
        g.scale(y, 1.0 / F16_CONV_SCALE)
    } else {
        g.conv_2d(kernel, x, (s, s), (p, p), (1, 1), false)
    }
}

/// `F.normalize(x, dim=channels) · √C · γ`, i.e. `x / rms(x) · γ` over the channels of each
/// pixel. The scale γ may be stored as `[C]`, `(C, 1, 1)` or `(C, 1, 1, 1)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChannelNorm {
    gamma: Param,
    channels: usize,
}

impl ChannelNorm {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        let vector = [channels, 1, 1, 1];
        let ne = match wb.source_ne("gamma") {
            Some(ne)
                if ne.iter().product::<usize>() == channels
                    && ne.iter().filter(|&&d| d != 1).count() <= 1 =>
            {
                ne
            }
            _ => vector,
        };
        Ok(Self {
            gamma: wb.get("gamma", ne, Storage::F32)?,
            channels,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        // [W, H, C, N] -> [C, W, H, N] so the norm runs over ne[0].
        let t = g.cont(g.permute(x, [1, 2, 0, 3]));
        let gamma = g.reshape(g.param(self.gamma), [self.channels, 1, 1, 1]);
        let t = g.mul(g.rms_norm(t, NORM_EPS), gamma);
        g.cont(g.permute(t, [2, 0, 1, 3]))
    }
}

/// `norm → SiLU → conv3×3 → norm → SiLU → conv3×3`, plus the input (through a 1×1 conv when
/// the width changes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResidualBlock {
    pub(crate) norm1: ChannelNorm,
    pub(crate) conv1: Conv,
    pub(crate) norm2: ChannelNorm,
    pub(crate) conv2: Conv,
    pub(crate) shortcut: Option<Conv>,
}

impl ResidualBlock {
    pub fn new(
        names: &Names,
        wb: &WeightBuilder<'_, '_>,
        in_ch: usize,
        out_ch: usize,
    ) -> Result<Self, RunnerError> {
        let l = names.resnet_leaves();
        let shortcut = if in_ch != out_ch {
            Some(Conv::new(&wb.pp(l.shortcut), in_ch, out_ch, 1, 1, 0)?)
        } else {
            None
        };
        Ok(Self {
            norm1: ChannelNorm::new(&wb.pp(l.norm1), in_ch)?,
            conv1: Conv::new(&wb.pp(l.conv1), in_ch, out_ch, 3, 1, 1)?,
            norm2: ChannelNorm::new(&wb.pp(l.norm2), out_ch)?,
            conv2: Conv::new(&wb.pp(l.conv2), out_ch, out_ch, 3, 1, 1)?,
            shortcut,
        })
    }

    /// A level's `count` resnets under `path(j)`: the first from `in_ch`, all to `out_ch`.
    pub fn stack(
        names: &Names,
        wb: &WeightBuilder<'_, '_>,
        count: usize,
        in_ch: usize,
        out_ch: usize,
        path: impl Fn(usize) -> String,
    ) -> Result<Vec<Self>, RunnerError> {
        (0..count)
            .map(|j| {
                let c = if j == 0 { in_ch } else { out_ch };
                Self::new(names, &wb.pp(path(j)), c, out_ch)
            })
            .collect()
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let h = self.conv1.forward(g, g.silu(self.norm1.forward(g, x)));
        let h = self.conv2.forward(g, g.silu(self.norm2.forward(g, h)));
        let skip = match &self.shortcut {
            Some(conv) => conv.forward(g, x),
            None => x,
        };
        g.add(h, skip)
    }
}

/// Single-head self-attention over all pixels (`to_qkv` and `proj` are 1×1 convs), residual.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MidAttention {
    norm: ChannelNorm,
    to_qkv: Conv,
    proj: Conv,
}

impl MidAttention {
    pub fn new(wb: &WeightBuilder<'_, '_>, channels: usize) -> Result<Self, RunnerError> {
        Ok(Self {
            norm: ChannelNorm::new(&wb.pp("norm"), channels)?,
            to_qkv: Conv::new(&wb.pp("to_qkv"), channels, 3 * channels, 1, 1, 0)?,
            proj: Conv::new(&wb.pp("proj"), channels, channels, 1, 1, 0)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let [w, h, c, n] = x.ne();
        let qkv = self.to_qkv.forward(g, self.norm.forward(g, x));
        let nb = qkv.nb();
        // Channel thirds q | k | v, each as tokens [C, W*H, N] (w fastest, as PyTorch flattens).
        let part = |k: usize| {
            let t = g.view(qkv, [w, h, c, n], [nb[1], nb[2], nb[3]], k * c * nb[2]);
            g.cont_reshape(g.permute(t, [1, 2, 0, 3]), [c, w * h, n, 1])
        };
        let o = nn::attention(g, part(0), part(1), part(2), 1, None);
        // [C, W, H, N] -> [W, H, C, N]
        let o = g.cont(g.permute(g.reshape(o, [c, w, h, n]), [2, 0, 1, 3]));
        g.add(self.proj.forward(g, o), x)
    }
}

/// resnet → attention → resnet at the deepest level.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MidBlock {
    pub(crate) resnet_1: ResidualBlock,
    pub(crate) attention: MidAttention,
    pub(crate) resnet_2: ResidualBlock,
}

impl MidBlock {
    pub fn new(
        names: &Names,
        wb: &WeightBuilder<'_, '_>,
        part: Part,
        channels: usize,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            resnet_1: ResidualBlock::new(
                names,
                &wb.pp(names.mid_resnet(part, 0)),
                channels,
                channels,
            )?,
            attention: MidAttention::new(&wb.pp(names.mid_attn(part)), channels)?,
            resnet_2: ResidualBlock::new(
                names,
                &wb.pp(names.mid_resnet(part, 1)),
                channels,
                channels,
            )?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let x = self.resnet_1.forward(g, x);
        let x = self.attention.forward(g, x);
        self.resnet_2.forward(g, x)
    }
}
