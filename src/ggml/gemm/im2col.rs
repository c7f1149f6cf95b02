//! im2col for the blocked conv path, from a channel-last image: [C, W, H, N] f32 →
//! [C·KW·KH, OW, OH, N] f32 patches, each the KW·KH taps' channel rows one after another
//! (zeros outside the image). With channels contiguous a tap is one row copy; ggml's CPU
//! im2col (channel-first image, patch ordered channel-major) gathers single floats and
//! splits threads by channel, so threads share cache lines: on SD's UNet it took an eighth
//! of a step.

use std::os::raw::{c_int, c_void};

use super::claims::Claims;
use super::{Context, CpuKernels, Tensor};
use crate::dtype::DType;
use crate::ggml::sys;

use super::PARAM_BASE;

/// Kernel size, stride, padding and dilation, (x, y) each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeometry {
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub pad: (usize, usize),
    pub dilation: (usize, usize),
}

impl ConvGeometry {
    /// The geometry as a custom node's op params (checked to fit in i32 before).
    pub(super) fn op_params(self) -> [i32; 8] {
        self.params().map(|v| v as i32)
    }

    pub(super) fn params(self) -> [usize; 8] {
        [
            self.kernel.0,
            self.kernel.1,
            self.stride.0,
            self.stride.1,
            self.pad.0,
            self.pad.1,
            self.dilation.0,
            self.dilation.1,
        ]
    }

    /// The output width and height for an input of `w` × `h`.
    pub fn out_size(self, w: usize, h: usize) -> Option<(usize, usize)> {
        Some((
            Self::out_len(w, self.kernel.0, self.stride.0, self.pad.0, self.dilation.0)?,
            Self::out_len(h, self.kernel.1, self.stride.1, self.pad.1, self.dilation.1)?,
        ))
    }

    /// A 1×1 kernel with unit stride and no padding: the image is its own patch matrix.
    pub(in crate::ggml) fn is_pointwise(self) -> bool {
        self.kernel == (1, 1) && self.stride == (1, 1) && self.pad == (0, 0)
    }

    /// Output size along one axis, as PyTorch's `Conv2d` (None when the kernel does not fit).
    pub(super) fn out_len(input: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
        if k == 0 || s == 0 || d == 0 {
            return None;
        }
        let span = d * (k - 1) + 1;
        (input + 2 * p).checked_sub(span).map(|r| r / s + 1)
    }
}

impl CpuKernels {
    /// Patches of the channel-last image `x` ([C, W, H, N] f32, contiguous) for `geometry`:
    /// [C·KW·KH, OW, OH, N] f32, each patch ordered (row, column, channel) slowest first.
    pub fn im2col<'c>(
        self,
        ctx: &'c Context,
        x: Tensor<'c>,
        geometry: ConvGeometry,
    ) -> Option<Tensor<'c>> {
        let [c, w, h, n] = x.ne();
        let g = geometry;
        let ok = x.ty() == DType::F32
            && x.is_contiguous()
            && g.params().iter().all(|&v| v <= i32::MAX as usize)
            && g.kernel.0 > 0
            && g.kernel.1 > 0
            && g.stride.0 > 0
            && g.stride.1 > 0
            && g.dilation.0 > 0
            && g.dilation.1 > 0;
        if !ok {
            return None;
        }
        let ow = ConvGeometry::out_len(w, g.kernel.0, g.stride.0, g.pad.0, g.dilation.0)?;
        let oh = ConvGeometry::out_len(h, g.kernel.1, g.stride.1, g.pad.1, g.dilation.1)?;
        let k = c * g.kernel.0 * g.kernel.1;
        Some(super::custom_node(
            ctx,
            [k, ow, oh, n],
            &[x],
            compute,
            &g.op_params(),
        ))
    }
}

/// Whether `t` is an im2col node of [`CpuKernels::im2col`].
pub(super) fn is_node(fun: *const ()) -> bool {
    fun == compute as *const ()
}

/// # Safety
/// `dst` is a node built by [`CpuKernels::im2col`], its source and itself allocated in host
/// memory.
unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, _: c_int, nth: c_int, _: *mut c_void) {
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth.max(1) as usize) };
    // SAFETY: the contract above: contiguous f32 tensors of exactly these element counts.
    let (x, out, p, ne_x, ne_out) = unsafe {
        let d = &*dst;
        let s = &*d.src[0];
        let ne_x = s.ne.map(|v| v as usize);
        let ne_out = d.ne.map(|v| v as usize);
        let p: [usize; 8] = Patches::from_params(&d.op_params, 0, 0).params;
        (
            std::slice::from_raw_parts(s.data.cast::<f32>(), ne_x.iter().product()),
            d.data.cast::<f32>(),
            p,
            ne_x,
            ne_out,
        )
    };
    let [_, ow, oh, n] = ne_out;
    let tokens = ow * oh * n;
    let k = ne_out[0];
    // Runs of whole output rows, so no two threads share a cache line.
    claims.each_run(oh * n, |rows| {
        let range = (rows.start * ow).min(tokens)..(rows.end * ow).min(tokens);
        // SAFETY: these tokens' patches (k floats each) are the run this thread claimed.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(out.add(range.start * k), range.len() * k) };
        fill_patches(x, ne_x, Patches { params: p, ow, oh }, range, dst);
    });
}

/// The output grid and geometry parameters of an im2col.
#[derive(Clone, Copy)]
pub(super) struct Patches {
    /// KW, KH, stride, padding, dilation (x, y each), as the op params hold them.
    pub params: [usize; 8],
    pub ow: usize,
    pub oh: usize,
}

impl Patches {
    /// The geometry of a node's op params.
    pub(super) fn from_params(op_params: &[i32], ow: usize, oh: usize) -> Self {
        Self {
            params: std::array::from_fn(|i| op_params[PARAM_BASE + i] as usize),
            ow,
            oh,
        }
    }
}

/// The patches of `tokens` (token t = (n·OH + oy)·OW + ox) of the channel-last image `x`
/// ([C, W, H, N]) into `dst`, C·KW·KH floats each.
pub(super) fn fill_patches(
    x: &[f32],
    [c, iw, ih, _]: [usize; 4],
    g: Patches,
    tokens: std::ops::Range<usize>,
    dst: &mut [f32],
) {
    let [kw, kh, s0, s1, p0, p1, d0, d1] = g.params;
    let k = c * kw * kh;
    let image_len = c * iw * ih;
    for (t, patch) in tokens.zip(dst.chunks_exact_mut(k)) {
        let (ox, row) = (t % g.ow, t / g.ow);
        let (b, oy) = (row / g.oh, row % g.oh);
        let image = &x[b * image_len..(b + 1) * image_len];
        for (tap, dst) in patch.chunks_exact_mut(c).enumerate() {
            let (ky, kx) = (tap / kw, tap % kw);
            let iy = (oy * s1 + ky * d1) as isize - p1 as isize;
            let ix = (ox * s0 + kx * d0) as isize - p0 as isize;
            if iy < 0 || iy >= ih as isize || ix < 0 || ix >= iw as isize {
                dst.fill(0.0);
            } else {
                let at = (iy as usize * iw + ix as usize) * c;
                dst.copy_from_slice(&image[at..at + c]);
            }
        }
    }
}
