//! Attention's online-softmax rows on 16 lanes, and the entry points that pick them or the
//! 8-lane ones (`avx2_rows.rs`) for this CPU. Two passes over a chunk of scores: the scaled,
//! masked scores written back in place with their largest (so the second pass reads them
//! ready), then the exponentials against the running maximum written in place, with their
//! sum. Whole vectors run unmasked; only a row's last partial vector is masked. The 8-lane
//! rows took ~20 % of PixArt's attention on an AVX-512 core (`perf`).

use std::arch::x86_64::*;

use super::avx2_rows;
use super::kernels::{exp_nonpositive, lanes16};
use super::Tiles;

/// `row[j] = row[j] · scale + mask[j]` over `n` entries; returns the largest (−∞ when all
/// are masked).
///
/// # Safety
/// The CPU has the instructions of `tiles`; `row` (and `mask`, unless null) hold `n` floats.
pub(super) unsafe fn chunk_logits_max(
    tiles: Tiles,
    row: *mut f32,
    mask: *const f32,
    n: usize,
    scale: f32,
) -> f32 {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match tiles {
            Tiles::Avx512 => logits_max(row, mask, n, scale),
            Tiles::Avx2 => avx2_rows::logits_max(row, mask, n, scale),
        }
    }
}

/// `row[j] = e^(row[j] − top)` over `n` entries (`top` finite and at least every entry);
/// returns their sum.
///
/// # Safety
/// As for [`chunk_logits_max`].
pub(super) unsafe fn chunk_exp_sum(tiles: Tiles, row: *mut f32, n: usize, top: f32) -> f32 {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match tiles {
            Tiles::Avx512 => exp_sum(row, n, top),
            Tiles::Avx2 => avx2_rows::exp_sum(row, n, top),
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
unsafe fn exp_sum(row: *mut f32, n: usize, top: f32) -> f32 {
    let top = _mm512_set1_ps(top);
    let mut sum = _mm512_setzero_ps();
    let whole = n / 16 * 16;
    for j in (0..whole).step_by(16) {
        // SAFETY: 16 floats inside the row; the rest is register arithmetic.
        unsafe {
            let e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row.add(j)), top));
            _mm512_storeu_ps(row.add(j), e);
            sum = _mm512_add_ps(sum, e);
        }
    }
    if whole < n {
        let m = lanes16(n - whole);
        // SAFETY: masked accesses inside the `n` floats.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, row.add(whole));
            let e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(v, top)));
            _mm512_mask_storeu_ps(row.add(whole), m, e);
            sum = _mm512_add_ps(sum, e);
        }
    }
    _mm512_reduce_add_ps(sum)
}

#[cfg(test)]
mod tests {
    use super::{chunk_exp_sum, chunk_logits_max, Tiles};
    use crate::ggml::gemm::tests::pseudo_random;

    /// The row kernels this CPU can run, whatever `SD_CLI_CPU` says.
    fn runnable() -> Vec<Tiles> {
        let mut tiles = Vec::new();
        if is_x86_feature_detected!("avx512f") {
            tiles.push(Tiles::Avx512);
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            tiles.push(Tiles::Avx2);
        }
        tiles
    }

    /// A softmax row from the two passes (the division is attention's, at the end).
    ///
    /// # Safety
    /// The CPU has `tiles`' instructions; `mask`, unless null, holds `row.len()` floats.
    unsafe fn softmax(tiles: Tiles, row: &mut [f32], mask: *const f32, scale: f32) {
        let n = row.len();
        // SAFETY: the caller's contract.
        unsafe {
            let top = chunk_logits_max(tiles, row.as_mut_ptr(), mask, n, scale);
            let sum = chunk_exp_sum(tiles, row.as_mut_ptr(), n, top);
            row.iter_mut().for_each(|v| *v /= sum);
        }
    }

    /// Rows of several lengths (partial vectors of either width) with and without masked
    /// entries against f64; an all-masked row has no maximum.
    #[test]
    fn softmax_rows_match_f64() {
        for tiles in runnable() {
            for n in [1, 5, 8, 9, 16, 17, 100, 256] {
                for masked in [false, true] {
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
                    unsafe { softmax(tiles, &mut row, m, 0.3) };
                    let logits: Vec<f64> = (0..n)
                        .map(|j| scores[j] as f64 * 0.3 + mask[j] as f64)
                        .collect();
                    let top = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = logits.iter().map(|l| (l - top).exp()).sum();
                    for j in 0..n {
                        let want = (logits[j] - top).exp() / sum;
                        assert!(
                            (row[j] as f64 - want).abs() < 1e-6,
                            "{tiles:?} n {n} masked {masked}: p[{j}] = {}, want {want}",
                            row[j]
                        );
                    }
                }
            }
            let mut row = [1.0f32; 11];
            let mask = [f32::NEG_INFINITY; 11];
            // SAFETY: as above.
            let top = unsafe { chunk_logits_max(tiles, row.as_mut_ptr(), mask.as_ptr(), 11, 1.0) };
            assert_eq!(
                top,
                f32::NEG_INFINITY,
                "{tiles:?}: an all-masked row has no maximum"
            );
        }
    }
}
