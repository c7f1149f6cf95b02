//! Attention's online-softmax rows on 16 lanes, and the entry points that pick them or the
//! 8-lane ones (`avx2_rows.rs`) for this CPU. A chunk of scores takes two passes: first its
//! largest (without a mask, of the raw scores: the scale goes into the exponent), or with a
//! mask the scaled, masked scores written back in place with their largest; then the
//! exponentials, `2^(row[j] · c − top)` in one FMA and a power of two, written in place with
//! their sum. Whole vectors run unmasked; only a row's last partial vector is masked. The
//! 8-lane rows took ~20 % of PixArt's attention on an AVX-512 core (`perf`).

use std::arch::x86_64::*;

use super::avx2_rows;
use super::kernels::{lanes16, pow2_nonpositive};
use super::Tiles;

/// The first pass over a chunk of `n` scores: returns `c`, what [`chunk_exp_sum`] multiplies
/// each entry by, and the chunk's largest entry times `c` (−∞ when all are masked). Without a
/// mask and with a positive scale the row is only read, `c` = scale · log2 e; otherwise the
/// row becomes `row[j] · scale + mask[j]` and `c` = log2 e.
///
/// # Safety
/// The CPU has the instructions of `tiles`; `row` (and `mask`, unless null) hold `n` floats.
pub(super) unsafe fn chunk_top(
    tiles: Tiles,
    row: *mut f32,
    mask: *const f32,
    n: usize,
    scale: f32,
) -> (f32, f32) {
    use std::f32::consts::LOG2_E;
    // SAFETY: the caller's contract, passed on.
    unsafe {
        if mask.is_null() && scale > 0.0 {
            // Rounding is monotonic, so the largest score times c is the largest product.
            let c = scale * LOG2_E;
            let top = match tiles {
                Tiles::Avx512 => row_max(row, n),
                Tiles::Avx2 => avx2_rows::row_max(row, n),
            };
            (c, top * c)
        } else {
            let top = match tiles {
                Tiles::Avx512 => logits_max(row, mask, n, scale),
                Tiles::Avx2 => avx2_rows::logits_max(row, mask, n, scale),
            };
            (LOG2_E, top * LOG2_E)
        }
    }
}

/// `row[j] = 2^(row[j] · c − top)` over `n` entries (`top` finite and, but for rounding, at
/// least every `row[j] · c`); returns their sum. With `c = scale · log2 e` and `top` the
/// largest score times `c`, these are softmax's e^(scale · (s − max)).
///
/// # Safety
/// As for [`chunk_top`].
pub(super) unsafe fn chunk_exp_sum(tiles: Tiles, row: *mut f32, n: usize, c: f32, top: f32) -> f32 {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match tiles {
            Tiles::Avx512 => exp_sum(row, n, c, top),
            Tiles::Avx2 => avx2_rows::exp_sum(row, n, c, top),
        }
    }
}

/// `row[j] · scale (+ mask[j])` of the lanes in `m` (the same two roundings as the 8-lane
/// rows: a product, then a sum).
#[inline(always)]
unsafe fn scaled(row: *const f32, mask: *const f32, m: __mmask16, scale: __m512) -> __m512 {
    // SAFETY: the caller's masked range lies inside the row and the mask.
    unsafe {
        let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row), scale);
        if mask.is_null() {
            v
        } else {
            _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, mask))
        }
    }
}

/// The mask from entry `j` on; null (no mask) stays null.
pub(super) fn offset(mask: *const f32, j: usize) -> *const f32 {
    if mask.is_null() {
        mask
    } else {
        mask.wrapping_add(j)
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn logits_max(row: *mut f32, mask: *const f32, n: usize, scale: f32) -> f32 {
    let s = _mm512_set1_ps(scale);
    // Four running maxima: one would wait on vmaxps' latency every vector.
    let mut max = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
    let whole = n / 16 * 16;
    for j in (0..whole).step_by(16) {
        // SAFETY: 16 floats inside the row (and the mask).
        unsafe {
            let v = scaled(row.add(j), offset(mask, j), u16::MAX, s);
            _mm512_storeu_ps(row.add(j), v);
            let m = &mut max[j / 16 % 4];
            *m = _mm512_max_ps(*m, v);
        }
    }
    if whole < n {
        let m = lanes16(n - whole);
        // SAFETY: masked accesses inside the `n` floats.
        unsafe {
            let v = scaled(row.add(whole), offset(mask, whole), m, s);
            _mm512_mask_storeu_ps(row.add(whole), m, v);
            max[0] = _mm512_mask_max_ps(max[0], m, max[0], v);
        }
    }
    let max = _mm512_max_ps(_mm512_max_ps(max[0], max[1]), _mm512_max_ps(max[2], max[3]));
    _mm512_reduce_max_ps(max)
}

#[target_feature(enable = "avx512f")]
unsafe fn row_max(row: *const f32, n: usize) -> f32 {
    let mut max = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
    let whole = n / 16 * 16;
    for j in (0..whole).step_by(16) {
        // SAFETY: 16 floats inside the row.
        let v = unsafe { _mm512_loadu_ps(row.add(j)) };
        let m = &mut max[j / 16 % 4];
        *m = _mm512_max_ps(*m, v);
    }
    if whole < n {
        let m = lanes16(n - whole);
        // SAFETY: a masked load inside the `n` floats.
        let v = unsafe { _mm512_maskz_loadu_ps(m, row.add(whole)) };
        max[0] = _mm512_mask_max_ps(max[0], m, max[0], v);
    }
    let max = _mm512_max_ps(_mm512_max_ps(max[0], max[1]), _mm512_max_ps(max[2], max[3]));
    _mm512_reduce_max_ps(max)
}

#[target_feature(enable = "avx512f")]
unsafe fn exp_sum(row: *mut f32, n: usize, c: f32, top: f32) -> f32 {
    let (c, top) = (_mm512_set1_ps(c), _mm512_set1_ps(-top));
    let mut sum = _mm512_setzero_ps();
    let whole = n / 16 * 16;
    for j in (0..whole).step_by(16) {
        // SAFETY: 16 floats inside the row; the rest is register arithmetic.
        unsafe {
            let x = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(j)), c, top);
            let e = pow2_nonpositive(x);
            _mm512_storeu_ps(row.add(j), e);
            sum = _mm512_add_ps(sum, e);
        }
    }
    if whole < n {
        let m = lanes16(n - whole);
        // SAFETY: masked accesses inside the `n` floats.
        unsafe {
            let x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, row.add(whole)), c, top);
            let e = _mm512_maskz_mov_ps(m, pow2_nonpositive(x));
            _mm512_mask_storeu_ps(row.add(whole), m, e);
            sum = _mm512_add_ps(sum, e);
        }
    }
    _mm512_reduce_add_ps(sum)
}

#[cfg(test)]
mod tests {
    use super::{chunk_exp_sum, chunk_top, Tiles};
    use crate::ggml::gemm::tests::{pseudo_random, runnable_tiles as runnable};

    /// A softmax row from the two passes (the division is attention's, at the end).
    ///
    /// # Safety
    /// The CPU has `tiles`' instructions; `mask`, unless null, holds `row.len()` floats.
    unsafe fn softmax(tiles: Tiles, row: &mut [f32], mask: *const f32, scale: f32) {
        let n = row.len();
        // SAFETY: the caller's contract.
        unsafe {
            let (c, top) = chunk_top(tiles, row.as_mut_ptr(), mask, n, scale);
            let sum = chunk_exp_sum(tiles, row.as_mut_ptr(), n, c, top);
            row.iter_mut().for_each(|v| *v /= sum);
        }
    }

    /// Rows of several lengths (partial vectors of either width), with and without masked
    /// entries, with a positive scale (read-only first pass) and a negative one, against f64;
    /// an all-masked row has no maximum.
    #[test]
    fn softmax_rows_match_f64() {
        for tiles in runnable() {
            for n in [1, 5, 8, 9, 16, 17, 100, 256] {
                for (masked, scale) in [(false, 0.3), (true, 0.3), (false, -0.2)] {
                    let scores: Vec<f32> = pseudo_random(n, n as u64)
                        .iter()
                        .map(|v| v * 40.0)
                        .collect();
                    let mask: Vec<f32> = (0..n)
                        .map(|j| match masked && j % 3 == 1 {
                            true => f32::NEG_INFINITY,
                            false => 0.0,
                        })
                        .collect();
                    let m = match masked {
                        true => mask.as_ptr(),
                        false => std::ptr::null(),
                    };
                    let mut row = scores.clone();
                    // SAFETY: `tiles` is runnable here; the row and the mask hold `n` floats.
                    unsafe { softmax(tiles, &mut row, m, scale) };
                    let logits: Vec<f64> = (0..n)
                        .map(|j| scores[j] as f64 * scale as f64 + mask[j] as f64)
                        .collect();
                    let top = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = logits.iter().map(|l| (l - top).exp()).sum();
                    for j in 0..n {
                        let want = (logits[j] - top).exp() / sum;
                        // f32 logits of size ~12 carry ~1e-6 of absolute rounding.
                        assert!(
                            (row[j] as f64 - want).abs() <= 2e-6 * want + 1e-12,
                            "{tiles:?} n {n} masked {masked} scale {scale}: p[{j}] = {}, want {want}",
                            row[j]
                        );
                    }
                }
            }
            let mut row = [1.0f32; 11];
            let mask = [f32::NEG_INFINITY; 11];
            // SAFETY: as above.
            let (_, top) = unsafe { chunk_top(tiles, row.as_mut_ptr(), mask.as_ptr(), 11, 1.0) };
            assert_eq!(
                top,
                f32::NEG_INFINITY,
                "{tiles:?}: an all-masked row has no maximum"
            );
        }
    }

    /// The exponential pass alone (c = 1, top = 0: `2^x`) across its range: within 2.5e-7 of
    /// f64 down to the cut-off, exactly 0 below it and for −∞, never a denormal.
    #[test]
    fn powers_of_two_match_f64() {
        let xs: Vec<f32> = (0..=26_000)
            .map(|i| -130.0 + i as f32 * 0.005)
            .chain([f32::NEG_INFINITY, -125.0, -124.999, -1e-30, 0.0, 1e-6])
            .collect();
        for tiles in runnable() {
            let mut row = xs.clone();
            // SAFETY: `tiles` is runnable here; the row holds its length.
            unsafe { chunk_exp_sum(tiles, row.as_mut_ptr(), row.len(), 1.0, 0.0) };
            for (&x, &e) in xs.iter().zip(&row) {
                assert!(e == 0.0 || e.is_normal(), "{tiles:?}: 2^{x} = {e:e}");
                if x < super::super::approx::EXP2_MIN {
                    assert_eq!(e, 0.0, "{tiles:?}: 2^{x} below the cut-off");
                } else {
                    let want = (x as f64).exp2();
                    let rel = (e as f64 - want).abs() / want;
                    assert!(
                        rel <= 2.5e-7,
                        "{tiles:?}: 2^{x} = {e:e}, want {want:e} ({rel:e})"
                    );
                }
            }
        }
    }
}
