//! The AVX2 + FMA register tiles (CPUs without AVX-512: most desktops and laptops): the same
//! packed panels of [`NR`] outputs as the AVX-512 tiles, read as four 16-column strips. Each
//! strip is a 6-token × 16-output tile (12 accumulators, two weight vectors and a broadcast:
//! 15 of the 16 vector registers), the shape BLIS uses on Haswell-class cores.

use std::arch::x86_64::*;

use super::kernels::{prefetch_output, unrolled, with_rows, Tile};
use super::{MR, NR};

/// Outputs per strip: two 8-lane vectors.
const STRIP: usize = 16;

/// k-steps ahead that a strip's weight lines are prefetched.
const PREFETCH: usize = 8;

const _: () = assert!(
    MR == 6 && NR.is_multiple_of(STRIP),
    "a tile holds 6 rows of two vectors per strip"
);

/// f32 products over `kc` k-steps, like [`super::kernels::tile_f32_width`]: `xs` is the
/// tile's first activation row (rows `ldx` apart, read in place), `ws` one packed panel
/// `width` wide (a multiple of 16 up to `NR`: a weight's panels, or attention's V).
///
/// # Safety
/// AVX2 and FMA must be present; `t.rows` rows of `kc` floats at `xs`, `ldx` apart; `ws`
/// holds `kc * width` floats; `t.cols` ≤ `width` and `t` describes a writable region (with
/// `bias`, `cols` readable floats; with `addend`, readable like `c`).
pub(super) unsafe fn tile_f32_width(
    width: usize,
    kc: usize,
    xs: *const f32,
    ldx: usize,
    ws: *const f32,
    t: &Tile,
) {
    // SAFETY: prefetches never fault; the output lines arrive while the products run.
    unsafe { with_rows!(t.rows, R => prefetch_output::<R>(t)) };
    for s in 0..t.cols.div_ceil(STRIP) {
        let c0 = s * STRIP;
        let offset = |p: *const f32| {
            if p.is_null() {
                p
            } else {
                p.wrapping_add(c0)
            }
        };
        let strip = Tile {
            c: t.c.wrapping_add(c0),
            ldc: t.ldc,
            rows: t.rows,
            cols: (t.cols - c0).min(STRIP),
            accumulate: t.accumulate,
            bias: offset(t.bias),
            addend: offset(t.addend),
        };
        // SAFETY: the caller's contract; the strip is columns c0.. of the panel and the tile.
        unsafe { with_rows!(t.rows, R => rows_f32::<R>(kc, xs, ldx, ws.add(c0), width, &strip)) }
    }
}

/// `R` rows × 16 outputs of f32 products; `ws` is the strip's first column in a panel
/// `width` wide.
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_f32<const R: usize>(
    kc: usize,
    xs: *const f32,
    ldx: usize,
    ws: *const f32,
    width: usize,
    t: &Tile,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    // Each row's own pointer, indexed by k: no address arithmetic per step beyond the index.
    let x: [*const f32; R] = std::array::from_fn(|r| xs.wrapping_add(r * ldx));
    let step = |kk: usize| {
        // SAFETY: kk < kc and r < R = t.rows: inside the panel and the activation rows.
        unsafe {
            let w = ws.add(kk * width);
            // The strip's weights are one line every `width` floats: fetch ahead of the
            // hardware prefetcher, which trails such strides (about 10 % on Zen 4).
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(PREFETCH * width).cast());
            let w0 = _mm256_loadu_ps(w);
            let w1 = _mm256_loadu_ps(w.add(8));
            for (a, x) in acc.iter_mut().zip(x) {
                let b = _mm256_broadcast_ss(&*x.add(kk));
                a[0] = _mm256_fmadd_ps(w0, b, a[0]);
                a[1] = _mm256_fmadd_ps(w1, b, a[1]);
            }
        }
    };
    unrolled(kc, step);
    // SAFETY: the caller's contract on `t`.
    unsafe { store(&acc, t) }
}

/// Lanes `0..valid` of an 8-lane vector, as a `maskload`/`maskstore` mask.
#[inline(always)]
pub(super) unsafe fn lanes(valid: usize) -> __m256i {
    // SAFETY: register-only arithmetic (the caller has AVX2).
    unsafe {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(valid as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }
}

/// The first `valid` floats at `p` (the rest zero).
#[inline(always)]
pub(super) unsafe fn load_lanes(p: *const f32, valid: usize, mask: __m256i) -> __m256 {
    // SAFETY: the caller's `valid` floats are readable; the mask covers only them.
    unsafe {
        if valid == 8 {
            _mm256_loadu_ps(p)
        } else {
            _mm256_maskload_ps(p, mask)
        }
    }
}

/// Writes the first `valid` lanes of `v` at `p`.
#[inline(always)]
pub(super) unsafe fn store_lanes(p: *mut f32, valid: usize, mask: __m256i, v: __m256) {
    // SAFETY: the caller's `valid` floats are writable; the mask covers only them.
    unsafe {
        if valid == 8 {
            _mm256_storeu_ps(p, v)
        } else {
            _mm256_maskstore_ps(p, mask, v)
        }
    }
}

/// Adds the strip into (or writes it to) the output, masked to `t.cols` (≤ 16).
#[inline(always)]
pub(super) unsafe fn store<const R: usize>(acc: &[[__m256; 2]; R], t: &Tile) {
    for j in 0..2 {
        let valid = t.cols.saturating_sub(j * 8).min(8);
        if valid == 0 {
            break;
        }
        // SAFETY: masked accesses touch only the `valid` columns the caller owns; full
        // vectors only where all 8 are.
        unsafe {
            let mask = lanes(valid);
            let bias = (!t.bias.is_null()).then(|| load_lanes(t.bias.add(j * 8), valid, mask));
            for (r, a) in acc.iter().enumerate() {
                let p = t.c.add(r * t.ldc + j * 8);
                let mut v = a[j];
                if t.accumulate {
                    v = _mm256_add_ps(load_lanes(p, valid, mask), v);
                } else if !t.addend.is_null() {
                    v = _mm256_add_ps(load_lanes(t.addend.add(r * t.ldc + j * 8), valid, mask), v);
                }
                if let Some(b) = bias {
                    v = _mm256_add_ps(v, b);
                }
                store_lanes(p, valid, mask, v);
            }
        }
    }
}
