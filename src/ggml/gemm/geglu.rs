//! GEGLU in one pass: `value · gelu(gate)` over the two halves of each row, with the erf
//! GELU diffusers uses, vectorised. ggml needs a copy of the gate half, a scalar `erff` per
//! element and a separate product (three passes; SD's feed-forwards spent ~6 % of a UNet
//! step there).

use std::arch::x86_64::*;
use std::os::raw::{c_int, c_void};

use super::approx::{ERF_A, ERF_P};
use super::avx2_rows;
use super::claims::Claims;
use super::kernels::exp_nonpositive;
use super::Tiles;
use crate::dtype::DType;
use crate::ggml::context::{Context, Tensor};
use crate::ggml::sys;

impl super::CpuKernels {
    /// x: [2·h, rows...] f32, contiguous → [h, rows...]: the first half times the GELU of the
    /// second, like `nn::geglu`.
    pub fn geglu<'c>(self, ctx: &'c Context, x: Tensor<'c>) -> Option<Tensor<'c>> {
        let [n0, n1, n2, n3] = x.ne();
        if super::tiles().is_none()
            || x.ty() != DType::F32
            || !x.is_contiguous()
            || n0 % 2 != 0
            || n0 == 0
        {
            return None;
        }
        Some(super::custom_node(
            ctx,
            [n0 / 2, n1, n2, n3],
            &[x],
            compute,
            &[],
        ))
    }
}

/// Whether a custom op's function is this GEGLU.
pub(super) fn is_node(fun: *const ()) -> bool {
    fun == compute as *const ()
}

/// # Safety
/// `dst` is a node built by [`super::CpuKernels::geglu`], its source and itself in host
/// memory, on a CPU with the blocked kernels' tiles.
unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, _: c_int, nth: c_int, _: *mut c_void) {
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth.max(1) as usize) };
    // SAFETY: the contract above: contiguous f32 tensors of these element counts.
    let (x, out, half, rows) = unsafe {
        let d = &*dst;
        let s = &*d.src[0];
        let half = d.ne[0] as usize;
        let rows = (d.ne[1] * d.ne[2] * d.ne[3]) as usize;
        (
            std::slice::from_raw_parts(s.data.cast::<f32>(), 2 * half * rows),
            d.data.cast::<f32>(),
            half,
            rows,
        )
    };
    let Some(tiles) = super::tiles() else {
        return;
    };
    claims.each_run(rows, |rows| {
        for r in rows {
            let row = &x[2 * r * half..2 * (r + 1) * half];
            // SAFETY: row r of the output (half floats) belongs to the run this thread claimed; the CPU
            // has `tiles`' instructions.
            unsafe {
                match tiles {
                    Tiles::Avx512 => geglu_row(row.as_ptr(), out.add(r * half), half),
                    Tiles::Avx2 => avx2_rows::geglu_row(row.as_ptr(), out.add(r * half), half),
                }
            };
        }
    });
}

/// One row: `out[j] = row[j] · gelu(row[half + j])`.
#[target_feature(enable = "avx512f")]
unsafe fn geglu_row(row: *const f32, out: *mut f32, half: usize) {
    for j in (0..half).step_by(16) {
        let valid = (half - j).min(16);
        let m = super::kernels::lanes16(valid);
        // SAFETY: masked accesses inside the row's two halves and the output row.
        unsafe {
            let value = _mm512_maskz_loadu_ps(m, row.add(j));
            let gate = _mm512_maskz_loadu_ps(m, row.add(half + j));
            let y = _mm512_mul_ps(value, gelu_erf(gate));
            _mm512_mask_storeu_ps(out.add(j), m, y);
        }
    }
}

/// x · Φ(x) = x/2 · (1 + erf(x/√2)). With z = x/√2, 1 + erf(z) is 2 − q for z ≥ 0 and q for
/// z < 0, where q = erfc(|z|) = poly(t) · e^(−z²), t = 1 / (1 + p|z|): Abramowitz & Stegun
/// 7.1.26 (absolute error < 1.5e−7); taking q directly for negative z avoids cancelling.
#[inline(always)]
unsafe fn gelu_erf(x: __m512) -> __m512 {
    // SAFETY: register-only arithmetic (the caller has AVX-512F).
    unsafe {
        let z = _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
        let a = _mm512_abs_ps(z);
        let one = _mm512_set1_ps(1.0);
        let t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(ERF_P), a, one));
        let mut poly = _mm512_set1_ps(ERF_A[4]);
        for &c in ERF_A[..4].iter().rev() {
            poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(c));
        }
        poly = _mm512_mul_ps(poly, t);
        let q = _mm512_mul_ps(
            poly,
            exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a))),
        );
        let positive = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(z, _mm512_setzero_ps());
        let one_plus_erf = _mm512_mask_sub_ps(q, positive, _mm512_set1_ps(2.0), q);
        _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5)), one_plus_erf)
    }
}
