//! A convolution as one custom op: each thread takes a run of output pixels and, a chunk at
//! a time, writes their patches into its own buffer and multiplies them by the kernel matrix
//! with the blocked product. The patch matrix never exists whole: for an SDXL up-block conv
//! at 1024² (960 channels, 3×3, batch 2) it would take 1.1 GB.

use std::cell::RefCell;
use std::os::raw::{c_int, c_void};

use super::claims::Claims;
use super::driver::{self, Packed};
use super::im2col::{fill_patches, ConvGeometry, Patches};
use super::{Context, CpuKernels, Tensor, MR};
use crate::dtype::DType;
use crate::ggml::sys;

/// Most bytes of patches a thread builds at a time (then multiplies): the kernel matrix is
/// packed again for every chunk, which costs a few percent at this size.
const CHUNK_BYTES: usize = 32 << 20;

impl CpuKernels {
    /// conv(pixels, kernel) + bias: `pixels` [C, W, H, N] f32 (channel-last, contiguous),
    /// `matrix` [C·KW·KH, OC] (rows tap-major, channel fastest), `bias` [OC] f32 → [OC, OW,
    /// OH, N] f32 (each pixel's outputs contiguous). `None` when the blocked product does not
    /// take this kernel.
    pub fn conv<'c>(
        self,
        ctx: &'c Context,
        pixels: Tensor<'c>,
        matrix: Tensor<'c>,
        bias: Option<Tensor<'c>>,
        geometry: ConvGeometry,
    ) -> Option<Tensor<'c>> {
        let [c, w, h, n] = pixels.ne();
        let [k, oc, m2, m3] = matrix.ne();
        let g = geometry;
        let ok = super::blocked_gemm_available(matrix.ty())
            && (matrix.ty() != DType::Q8_0 || k.is_multiple_of(DType::Q8_0.block_size()))
            && pixels.ty() == DType::F32
            && pixels.is_contiguous()
            && matrix.is_contiguous()
            && [m2, m3] == [1, 1]
            && k == c * g.kernel.0 * g.kernel.1
            && g.params().iter().all(|&v| v <= i32::MAX as usize)
            && [g.kernel, g.stride, g.dilation]
                .iter()
                .all(|&(a, b)| a > 0 && b > 0)
            && bias.is_none_or(|b| {
                b.ty() == DType::F32 && b.is_contiguous() && b.ne() == [oc, 1, 1, 1]
            });
        if !ok {
            return None;
        }
        let ow = ConvGeometry::out_len(w, g.kernel.0, g.stride.0, g.pad.0, g.dilation.0)?;
        let oh = ConvGeometry::out_len(h, g.kernel.1, g.stride.1, g.pad.1, g.dilation.1)?;
        let args: Vec<_> = [Some(pixels), Some(matrix), bias]
            .into_iter()
            .flatten()
            .collect();
        let ne = [oc, ow, oh, n];
        Some(super::custom_node(ctx, ne, &args, compute, &g.op_params()))
    }
}

/// Whether a custom op's function is this convolution.
pub(super) fn is_node(fun: *const ()) -> bool {
    fun == compute as *const ()
}

thread_local! {
    static PATCHES: RefCell<Packed> = RefCell::default();
}

/// # Safety
/// `dst` is a node built by [`CpuKernels::conv`], its sources and itself in host memory, on
/// a CPU with the instructions its kernel type needs.
unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, _: c_int, nth: c_int, _: *mut c_void) {
    let nth = nth.max(1) as usize;
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth) };
    // SAFETY: the contract above: contiguous tensors of these element counts and types.
    let (x, ne_x, w, bias, out, [oc, ow, oh, n], patches) = unsafe {
        let d = &*dst;
        let s = &*d.src[0];
        let ne_x = s.ne.map(|v| v as usize);
        let ne = d.ne.map(|v| v as usize);
        let bias = (!d.src[2].is_null())
            .then(|| std::slice::from_raw_parts((*d.src[2]).data.cast::<f32>(), ne[0]));
        (
            std::slice::from_raw_parts(s.data.cast::<f32>(), ne_x.iter().product()),
            ne_x,
            &*d.src[1],
            bias,
            d.data.cast::<f32>(),
            ne,
            Patches::from_params(&d.op_params, ne[1], ne[2]),
        )
    };
    let k = w.ne[0] as usize;
    let tokens = ow * oh * n;
    // Runs of whole register strips, claimed by whichever thread is free; no longer than
    // keeps the patches within bounds.
    let most = (CHUNK_BYTES / (4 * k * MR)).max(1);
    PATCHES.with(|buf| {
        let mut buf = buf.borrow_mut();
        claims.each_run_at_most(tokens.div_ceil(MR), most, |strips| {
            let (t0, t1) = (strips.start * MR, (strips.end * MR).min(tokens));
            let cols = &mut buf.f32s((t1 - t0) * k)[..];
            fill_patches(x, ne_x, patches, t0..t1, cols);
            // SAFETY: the node's weight and bias as the contract says; output rows t0..t1
            // (oc floats each) belong to the piece this thread claimed.
            unsafe { driver::product_on_this_thread(w, bias, cols, out.add(t0 * oc)) };
        });
    });
}
