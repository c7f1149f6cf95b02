//! GroupNorm and LayerNorm with their affine parameters (and, for GroupNorm, an optional
//! SiLU) in one custom op: ggml computes the norm, the scale, the shift and the activation
//! as separate passes over the tensor (SD's UNet spent ~6 % of a step in them). The
//! statistics follow ggml's kernels: sums in f64, the mean and variance rounded to f32.

use std::arch::x86_64::*;
use std::os::raw::{c_int, c_void};

use super::avx2_rows;
use super::claims::Claims;
use super::kernels::exp_nonpositive;
use super::Tiles;
use crate::dtype::DType;
use crate::ggml::context::{Context, Tensor};
use crate::ggml::sys;

/// Op-param slots (as `custom_node` writes them from `PARAM_BASE`).
const PARAM_GROUPS: usize = super::PARAM_BASE;
const PARAM_EPS: usize = super::PARAM_BASE + 1;
/// GroupNorm: 1 when SiLU follows.
const PARAM_SILU: usize = super::PARAM_BASE + 2;
/// LayerNorm: bit 0 set when it has a weight (source 1), bit 1 a bias (the next source).
const PARAM_AFFINE: usize = super::PARAM_BASE + 2;

impl super::CpuKernels {
    /// `nn.GroupNorm(groups, C, eps)` over x [W, H, C, N] (f32, contiguous) with per-channel
    /// `weight` and `bias` ([C] f32), followed by SiLU when `silu`. `None` when the groups do
    /// not divide the channels or the tensors are not these.
    #[allow(clippy::too_many_arguments)]
    pub fn group_norm<'c>(
        self,
        ctx: &'c Context,
        x: Tensor<'c>,
        groups: usize,
        eps: f32,
        weight: Tensor<'c>,
        bias: Tensor<'c>,
        silu: bool,
    ) -> Option<Tensor<'c>> {
        let c = x.ne()[2];
        let per_channel = |t: Tensor<'_>| {
            t.ty() == DType::F32 && t.is_contiguous() && t.ne().iter().product::<usize>() == c
        };
        let ok = super::tiles().is_some()
            && groups > 0
            && c.is_multiple_of(groups)
            && x.ty() == DType::F32
            && x.is_contiguous()
            && per_channel(weight)
            && per_channel(bias)
            && i32::try_from(groups).is_ok();
        if !ok {
            return None;
        }
        let params = [groups as i32, eps.to_bits() as i32, i32::from(silu)];
        Some(super::custom_node(
            ctx,
            x.ne(),
            &[x, weight, bias],
            group_norm_op,
            &params,
        ))
    }

    /// `nn.LayerNorm` over ne[0] of x (f32, contiguous) times `weight` plus `bias` ([ne0]
    /// f32; each optional, as `LayerNorm` has them). Either may also hold one vector per
    /// batch item ([ne0, 1, B] for x [ne0, n, B]): an adaptive norm's `LN(x)·(1 + scale) +
    /// shift` in one pass instead of ggml's three.
    pub fn layer_norm<'c>(
        self,
        ctx: &'c Context,
        x: Tensor<'c>,
        eps: f32,
        weight: Option<Tensor<'c>>,
        bias: Option<Tensor<'c>>,
    ) -> Option<Tensor<'c>> {
        let [n0, _, batch, n3] = x.ne();
        let per_column = |t: Option<Tensor<'_>>| {
            t.is_none_or(|t| {
                let ne = t.ne();
                let batches_ok = ne[2] == 1 || (ne[2] == batch && n3 == 1);
                t.ty() == DType::F32
                    && t.is_contiguous()
                    && ne[..2] == [n0, 1]
                    && ne[3] == 1
                    && batches_ok
            })
        };
        let ok = super::tiles().is_some()
            && x.ty() == DType::F32
            && x.is_contiguous()
            && per_column(weight)
            && per_column(bias);
        if !ok {
            return None;
        }
        let args: Vec<_> = [Some(x), weight, bias].into_iter().flatten().collect();
        let affine = i32::from(weight.is_some()) | (i32::from(bias.is_some()) << 1);
        let params = [0, eps.to_bits() as i32, affine];
        Some(super::custom_node(
            ctx,
            x.ne(),
            &args,
            layer_norm_op,
            &params,
        ))
    }
}

/// Whether a custom op's function is one of these norms.
pub(super) fn is_node(fun: *const ()) -> bool {
    fun == group_norm_op as *const () || fun == layer_norm_op as *const ()
}

/// Mean and 1/σ of `x` as ggml's norms compute them.
fn stats(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f64;
    let mut acc = [0.0f64; 16];
    let chunks = x.chunks_exact(16);
    let tail: f64 = chunks.remainder().iter().map(|&v| v as f64).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v as f64;
        }
    }
    let mean = ((acc.iter().sum::<f64>() + tail) / n) as f32;
    let mut acc = [0.0f64; 16];
    let chunks = x.chunks_exact(16);
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&v| ((v - mean) * (v - mean)) as f64)
        .sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            let d = v - mean;
            *a += (d * d) as f64;
        }
    }
    let variance = ((acc.iter().sum::<f64>() + tail) / n) as f32;
    (mean, 1.0 / (variance + eps).sqrt())
}

/// # Safety
/// `dst` is a node built by [`super::CpuKernels::group_norm`], its sources and itself in host
/// memory, on a CPU with the blocked kernels' tiles.
unsafe extern "C" fn group_norm_op(
    dst: *mut sys::ggml_tensor,
    _: c_int,
    nth: c_int,
    _: *mut c_void,
) {
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth.max(1) as usize) };
    // SAFETY: the contract above: contiguous f32 tensors of these element counts.
    let (x, w, b, out, [pw, ph, c, n], groups, eps, silu) = unsafe {
        let d = &*dst;
        let ne = d.ne.map(|v| v as usize);
        let len = ne.iter().product();
        let (s, w, b) = (&*d.src[0], &*d.src[1], &*d.src[2]);
        (
            std::slice::from_raw_parts(s.data.cast::<f32>(), len),
            std::slice::from_raw_parts(w.data.cast::<f32>(), ne[2]),
            std::slice::from_raw_parts(b.data.cast::<f32>(), ne[2]),
            d.data.cast::<f32>(),
            ne,
            d.op_params[PARAM_GROUPS] as usize,
            f32::from_bits(d.op_params[PARAM_EPS] as u32),
            d.op_params[PARAM_SILU] != 0,
        )
    };
    let Some(tiles) = super::tiles() else {
        return;
    };
    let plane = pw * ph;
    let per_group = c / groups;
    claims.each_run(n * groups, |units| {
        for unit in units {
            let c0 = (unit % groups) * per_group;
            let start = ((unit / groups) * c + c0) * plane;
            let (mean, scale) = stats(&x[start..start + per_group * plane], eps);
            for ch in 0..per_group {
                let at = start + ch * plane;
                let affine = Affine::Scalar(w[c0 + ch], b[c0 + ch]);
                // SAFETY: this channel plane of the output belongs to this unit alone; the CPU
                // has `tiles`' instructions.
                unsafe {
                    affine_row_on(
                        tiles,
                        &x[at..at + plane],
                        out.add(at),
                        (mean, scale),
                        affine,
                        silu,
                    )
                };
            }
        }
    });
}

/// # Safety
/// `dst` is a node built by [`super::CpuKernels::layer_norm`], its sources and itself in host
/// memory, on a CPU with the blocked kernels' tiles.
unsafe extern "C" fn layer_norm_op(
    dst: *mut sys::ggml_tensor,
    _: c_int,
    nth: c_int,
    _: *mut c_void,
) {
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth.max(1) as usize) };
    // SAFETY: the contract above: contiguous f32 tensors of these element counts, the
    // weight and bias (when the flags say they exist) in the sources after x.
    let (x, w, b, out, n0, n1, rows, eps) = unsafe {
        let d = &*dst;
        let n0 = d.ne[0] as usize;
        let rows = (d.ne[1] * d.ne[2] * d.ne[3]) as usize;
        let flags = d.op_params[PARAM_AFFINE];
        // One vector, or one per batch item (ne[2]).
        let vectors = |i: usize| {
            let t = &*d.src[i];
            std::slice::from_raw_parts(t.data.cast::<f32>(), n0 * t.ne[2] as usize)
        };
        let w = (flags & 1 != 0).then(|| vectors(1));
        let b = (flags & 2 != 0).then(|| vectors(1 + usize::from(w.is_some())));
        (
            std::slice::from_raw_parts((*d.src[0]).data.cast::<f32>(), n0 * rows),
            w,
            b,
            d.data.cast::<f32>(),
            n0,
            d.ne[1] as usize,
            rows,
            f32::from_bits(d.op_params[PARAM_EPS] as u32),
        )
    };
    let Some(tiles) = super::tiles() else {
        return;
    };
    claims.each_run(rows, |rows| {
        for r in rows {
            let row = &x[r * n0..(r + 1) * n0];
            let stats = stats(row, eps);
            let affine = Affine::Vectors(row_vector(w, n0, n1, r), row_vector(b, n0, n1, r));
            // SAFETY: output row r belongs to the run this thread claimed; the CPU has `tiles`'
            // instructions.
            unsafe { affine_row_on(tiles, row, out.add(r * n0), stats, affine, false) };
        }
    });
}

/// Row `r`'s part of a LayerNorm's `n0`-long weight or bias: the one vector, or its batch
/// item's (rows `n1` per item) where there is one per item.
fn row_vector(v: Option<&[f32]>, n0: usize, n1: usize, r: usize) -> Option<&[f32]> {
    v.map(|v| {
        let at = (r / n1) % (v.len() / n0) * n0;
        &v[at..at + n0]
    })
}

/// [`affine_row`] on `tiles`' registers.
///
/// # Safety
/// The CPU has `tiles`' instructions; `out` has room for `x.len()` floats and the vectors of
/// `affine` hold as many.
unsafe fn affine_row_on(
    tiles: Tiles,
    x: &[f32],
    out: *mut f32,
    stats: (f32, f32),
    affine: Affine<'_>,
    silu: bool,
) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match tiles {
            Tiles::Avx512 => affine_row(x, out, stats, affine, silu),
            Tiles::Avx2 => avx2_rows::affine_row(x, out, stats, affine, silu),
        }
    }
}

/// The affine part: one scale and shift for the whole row (a GroupNorm channel), or one per
/// column (LayerNorm; either may be absent).
#[derive(Clone, Copy)]
pub(super) enum Affine<'a> {
    Scalar(f32, f32),
    Vectors(Option<&'a [f32]>, Option<&'a [f32]>),
}

/// `out[j] = ((x[j] − mean) · scale) · w + b` (ggml's order of operations, no fused
/// multiply-add), then SiLU when asked.
#[target_feature(enable = "avx512f")]
unsafe fn affine_row(
    x: &[f32],
    out: *mut f32,
    (mean, scale): (f32, f32),
    affine: Affine<'_>,
    silu: bool,
) {
    let n = x.len();
    for j in (0..n).step_by(16) {
        let valid = (n - j).min(16);
        let m = super::kernels::lanes16(valid);
        // SAFETY: masked accesses inside the row, the output row and the per-column vectors
        // (each n long).
        unsafe {
            let v = _mm512_sub_ps(
                _mm512_maskz_loadu_ps(m, x.as_ptr().add(j)),
                _mm512_set1_ps(mean),
            );
            let mut y = _mm512_mul_ps(v, _mm512_set1_ps(scale));
            match affine {
                Affine::Scalar(w, b) => {
                    y = _mm512_add_ps(_mm512_mul_ps(y, _mm512_set1_ps(w)), _mm512_set1_ps(b));
                }
                Affine::Vectors(w, b) => {
                    if let Some(w) = w {
                        y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, w.as_ptr().add(j)));
                    }
                    if let Some(b) = b {
                        y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, b.as_ptr().add(j)));
                    }
                }
            }
            if silu {
                y = silu_ps(y);
            }
            _mm512_mask_storeu_ps(out.add(j), m, y);
        }
    }
}

/// y · sigmoid(y), with e = e^(−|y|) ≤ 1: sigmoid is 1/(1+e) for y ≥ 0, e/(1+e) below.
#[inline(always)]
unsafe fn silu_ps(y: __m512) -> __m512 {
    // SAFETY: register-only arithmetic (the caller has AVX-512F).
    unsafe {
        let e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(y)));
        let inv = _mm512_div_ps(_mm512_set1_ps(1.0), _mm512_add_ps(_mm512_set1_ps(1.0), e));
        let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(y, _mm512_setzero_ps());
        let sigmoid = _mm512_mask_mul_ps(inv, negative, inv, e);
        _mm512_mul_ps(y, sigmoid)
    }
}
