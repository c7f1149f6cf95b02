//! AVX2 + FMA row kernels: attention's softmax and the fused GroupNorm / LayerNorm / GEGLU /
//! GELU bodies, the same arithmetic as their AVX-512 versions (`kernels.rs`, `norm.rs`,
//! `geglu.rs`) on 8 lanes.

use std::arch::x86_64::*;

use super::approx::{ERF_A, ERF_P, EXP2_MIN, EXP2_POLY, EXP_MIN, EXP_TAYLOR, LN2_HI, LN2_LO};
use super::avx2::{lanes, load_lanes, store_lanes};
use super::norm::Affine;
use super::softmax::offset;

/// e^x for x ≤ 0, as [`super::kernels::exp_nonpositive`] computes it (the same split of x,
/// the same polynomial), with 2^n built in the exponent bits; x below −87 gives exactly 0.
#[inline(always)]
unsafe fn exp_nonpositive(x: __m256) -> __m256 {
    // SAFETY: register-only arithmetic (the caller has AVX2 and FMA).
    unsafe {
        let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(EXP_MIN));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_TAYLOR[0]);
        for &c in &EXP_TAYLOR[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        // n ≥ −126 wherever x ≥ −87, so 2^n is a normal float: (n + 127) in the exponent.
        let n = _mm256_max_ps(n, _mm256_set1_ps(-126.0));
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_and_ps(_mm256_mul_ps(p, two_n), keep)
    }
}

/// 2^x for x ≤ 0, as [`super::kernels::pow2_nonpositive`] computes it, with 2^n built in
/// the exponent bits; below `EXP2_MIN` (and for −∞) exactly 0.
#[inline(always)]
unsafe fn pow2_nonpositive(x: __m256) -> __m256 {
    // SAFETY: register-only arithmetic (the caller has AVX2 and FMA).
    unsafe {
        let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(EXP2_MIN));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let f = _mm256_sub_ps(x, n);
        let mut p = _mm256_set1_ps(EXP2_POLY[0]);
        for &c in &EXP2_POLY[1..] {
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
        }
        // Where kept, −125 ≤ n ≤ 0 and (n + 127) is a normal exponent; elsewhere the
        // garbage bits are cleared by `keep`.
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_and_ps(_mm256_mul_ps(p, two_n), keep)
    }
}

/// The largest of 8 lanes.
#[inline(always)]
pub(super) unsafe fn reduce_max(v: __m256) -> f32 {
    // SAFETY: register-only arithmetic (the caller has AVX).
    unsafe {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
        _mm_cvtss_f32(m)
    }
}

/// The sum of 8 lanes.
#[inline(always)]
unsafe fn reduce_add(v: __m256) -> f32 {
    // SAFETY: register-only arithmetic (the caller has AVX).
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }
}

/// `row[j] · scale (+ mask[j])` of the first `valid` lanes: a product, then a sum.
#[inline(always)]
unsafe fn scaled(row: *const f32, mask: *const f32, valid: usize, scale: __m256) -> __m256 {
    let m = lanes(valid);
    // SAFETY: the caller's `valid` lanes lie inside the row and the mask.
    unsafe {
        let v = _mm256_mul_ps(load_lanes(row, valid, m), scale);
        if mask.is_null() {
            v
        } else {
            _mm256_add_ps(v, load_lanes(mask, valid, m))
        }
    }
}

/// One chunk of a score row for the online softmax: `row[j] = row[j] · scale + mask[j]` in
/// place over `n` entries; returns the largest (−∞ when all are masked).
///
/// # Safety
/// AVX2 and FMA must be present; `row` (and `mask`, unless null) hold `n` floats.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn logits_max(row: *mut f32, mask: *const f32, n: usize, scale: f32) -> f32 {
    let s = _mm256_set1_ps(scale);
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    // Four running maxima: one would wait on vmaxps' latency every vector.
    let mut max = [neg_inf; 4];
    let whole = n / 8 * 8;
    for j in (0..whole).step_by(8) {
        // SAFETY: 8 floats inside the row (and the mask).
        unsafe {
            let v = scaled(row.add(j), offset(mask, j), 8, s);
            _mm256_storeu_ps(row.add(j), v);
            let m = &mut max[j / 8 % 4];
            *m = _mm256_max_ps(*m, v);
        }
    }
    if whole < n {
        let valid = n - whole;
        // SAFETY: accesses masked to the row's first `n` floats.
        unsafe {
            let v = scaled(row.add(whole), offset(mask, whole), valid, s);
            let m = lanes(valid);
            store_lanes(row.add(whole), valid, m, v);
            max[0] = _mm256_max_ps(max[0], _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(m)));
        }
    }
    // SAFETY: register-only arithmetic.
    unsafe {
        let max = _mm256_max_ps(_mm256_max_ps(max[0], max[1]), _mm256_max_ps(max[2], max[3]));
        reduce_max(max)
    }
}

/// The largest of the row's `n` entries.
///
/// # Safety
/// AVX2 and FMA must be present; `row` holds `n` floats.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn row_max(row: *const f32, n: usize) -> f32 {
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut max = [neg_inf; 4];
    let whole = n / 8 * 8;
    for j in (0..whole).step_by(8) {
        // SAFETY: 8 floats inside the row.
        let v = unsafe { _mm256_loadu_ps(row.add(j)) };
        let m = &mut max[j / 8 % 4];
        *m = _mm256_max_ps(*m, v);
    }
    if whole < n {
        let valid = n - whole;
        let m = lanes(valid);
        // SAFETY: a load masked to the row's first `n` floats.
        unsafe {
            let v = load_lanes(row.add(whole), valid, m);
            max[0] = _mm256_max_ps(max[0], _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(m)));
        }
    }
    // SAFETY: register-only arithmetic.
    unsafe {
        let max = _mm256_max_ps(_mm256_max_ps(max[0], max[1]), _mm256_max_ps(max[2], max[3]));
        reduce_max(max)
    }
}

/// `row[j] = 2^(row[j] · c − top)` over `n` entries (see `softmax::chunk_exp_sum`); returns
/// their sum.
///
/// # Safety
/// AVX2 and FMA must be present; `row` holds `n` floats.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_sum(row: *mut f32, n: usize, c: f32, top: f32) -> f32 {
    let (c, top) = (_mm256_set1_ps(c), _mm256_set1_ps(-top));
    let mut sum = _mm256_setzero_ps();
    let whole = n / 8 * 8;
    for j in (0..whole).step_by(8) {
        // SAFETY: 8 floats inside the row; the rest is register arithmetic.
        unsafe {
            let e = pow2_nonpositive(_mm256_fmadd_ps(_mm256_loadu_ps(row.add(j)), c, top));
            _mm256_storeu_ps(row.add(j), e);
            sum = _mm256_add_ps(sum, e);
        }
    }
    if whole < n {
        let valid = n - whole;
        let m = lanes(valid);
        // SAFETY: accesses masked to the row's first `n` floats.
        unsafe {
            let v = load_lanes(row.add(whole), valid, m);
            let e = pow2_nonpositive(_mm256_fmadd_ps(v, c, top));
            let e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
            store_lanes(row.add(whole), valid, m, e);
            sum = _mm256_add_ps(sum, e);
        }
    }
    // SAFETY: register-only arithmetic.
    unsafe { reduce_add(sum) }
}

/// One row: `out[j] = row[j] · gelu(row[half + j])` (see `geglu.rs`).
///
/// # Safety
/// AVX2 and FMA must be present; `row` holds `2 · half` floats, `out` room for `half`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn geglu_row(row: *const f32, out: *mut f32, half: usize) {
    for j in (0..half).step_by(8) {
        let valid = (half - j).min(8);
        // SAFETY: masked accesses inside the row's two halves and the output row.
        unsafe {
            let m = lanes(valid);
            let value = load_lanes(row.add(j), valid, m);
            let gate = load_lanes(row.add(half + j), valid, m);
            store_lanes(out.add(j), valid, m, _mm256_mul_ps(value, gelu_erf(gate)));
        }
    }
}

/// `out[j] = gelu_tanh(x[j])` for `n` elements, as `gelu.rs` computes it on 16 lanes.
///
/// # Safety
/// AVX2 and FMA must be present; `x` holds `n` floats, `out` room for as many.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gelu_tanh_row(x: *const f32, out: *mut f32, n: usize) {
    use super::gelu::{GELU_CUBIC, GELU_K};
    for j in (0..n).step_by(8) {
        let valid = (n - j).min(8);
        // SAFETY: masked accesses inside the n elements; the rest is register arithmetic.
        unsafe {
            let m = lanes(valid);
            let v = load_lanes(x.add(j), valid, m);
            let one = _mm256_set1_ps(1.0);
            let q = _mm256_fmadd_ps(
                _mm256_mul_ps(v, v),
                _mm256_set1_ps(GELU_CUBIC * GELU_K),
                _mm256_set1_ps(GELU_K),
            );
            let z = _mm256_mul_ps(v, q);
            let e = exp_nonpositive(_mm256_sub_ps(_mm256_setzero_ps(), abs(z)));
            let positive = _mm256_cmp_ps::<_CMP_GE_OQ>(z, _mm256_setzero_ps());
            let num = _mm256_blendv_ps(e, one, positive);
            let y = _mm256_mul_ps(v, _mm256_div_ps(num, _mm256_add_ps(one, e)));
            store_lanes(out.add(j), valid, m, y);
        }
    }
}

/// x · Φ(x) with the erf approximation of `geglu.rs` (Abramowitz & Stegun 7.1.26).
#[inline(always)]
unsafe fn gelu_erf(x: __m256) -> __m256 {
    // SAFETY: register-only arithmetic (the caller has AVX2 and FMA).
    unsafe {
        let z = _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
        let a = abs(z);
        let one = _mm256_set1_ps(1.0);
        let t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(ERF_P), a, one));
        let mut poly = _mm256_set1_ps(ERF_A[4]);
        for &c in ERF_A[..4].iter().rev() {
            poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(c));
        }
        poly = _mm256_mul_ps(poly, t);
        let q = _mm256_mul_ps(
            poly,
            exp_nonpositive(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(a, a))),
        );
        let positive = _mm256_cmp_ps::<_CMP_GE_OQ>(z, _mm256_setzero_ps());
        let one_plus_erf = _mm256_blendv_ps(q, _mm256_sub_ps(_mm256_set1_ps(2.0), q), positive);
        _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5)), one_plus_erf)
    }
}

/// |x| (the sign bit cleared).
#[inline(always)]
unsafe fn abs(x: __m256) -> __m256 {
    // SAFETY: register-only arithmetic (the caller has AVX).
    unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), x) }
}

/// `out[j] = ((x[j] − mean) · scale) · w + b`, then SiLU when asked (see `norm.rs`).
///
/// # Safety
/// AVX2 and FMA must be present; `out` has room for `x.len()` floats, and the per-column
/// vectors of `affine` hold as many.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn affine_row(
    x: &[f32],
    out: *mut f32,
    (mean, scale): (f32, f32),
    affine: Affine<'_>,
    silu: bool,
) {
    let n = x.len();
    for j in (0..n).step_by(8) {
        let valid = (n - j).min(8);
        // SAFETY: masked accesses inside the row, the output row and the per-column vectors.
        unsafe {
            let m = lanes(valid);
            let v = _mm256_sub_ps(
                load_lanes(x.as_ptr().add(j), valid, m),
                _mm256_set1_ps(mean),
            );
            let mut y = _mm256_mul_ps(v, _mm256_set1_ps(scale));
            match affine {
                Affine::Scalar(w, b) => {
                    y = _mm256_add_ps(_mm256_mul_ps(y, _mm256_set1_ps(w)), _mm256_set1_ps(b));
                }
                Affine::Vectors(w, b) => {
                    if let Some(w) = w {
                        y = _mm256_mul_ps(y, load_lanes(w.as_ptr().add(j), valid, m));
                    }
                    if let Some(b) = b {
                        y = _mm256_add_ps(y, load_lanes(b.as_ptr().add(j), valid, m));
                    }
                }
            }
            if silu {
                y = silu_ps(y);
            }
            store_lanes(out.add(j), valid, m, y);
        }
    }
}

/// y · sigmoid(y), as `norm.rs` computes it.
#[inline(always)]
unsafe fn silu_ps(y: __m256) -> __m256 {
    // SAFETY: register-only arithmetic (the caller has AVX2 and FMA).
    unsafe {
        let e = exp_nonpositive(_mm256_sub_ps(_mm256_setzero_ps(), abs(y)));
        let inv = _mm256_div_ps(_mm256_set1_ps(1.0), _mm256_add_ps(_mm256_set1_ps(1.0), e));
        let negative = _mm256_cmp_ps::<_CMP_LT_OQ>(y, _mm256_setzero_ps());
        let sigmoid = _mm256_blendv_ps(inv, _mm256_mul_ps(inv, e), negative);
        _mm256_mul_ps(y, sigmoid)
    }
}
