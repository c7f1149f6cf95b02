//! The AVX2 + FMA register tiles (CPUs without AVX-512: most desktops and laptops): panels of
//! [`NR`] outputs packed as four 16-output strips, each k-major and contiguous
//! (`pack::panel_at`), so a strip is one sequential stream (instead of the AVX-512 layout's
//! 256-byte stride: ~5 % of a capped product; packing by 8 × 8 transposes, `transpose_8x8`,
//! another ~5 %). Each strip is a 6-token × 16-output
//! tile (12 accumulators, two weight vectors and a broadcast: 15 of the 16 vector registers),
//! the shape BLIS uses on Haswell-class cores.

use std::arch::x86_64::*;

use super::kernels::{prefetch_output, unrolled, with_rows, Tile};
use super::{MR, NR};

/// Outputs per strip: two 8-lane vectors.
pub(super) const STRIP: usize = 16;

/// k-steps (one line each) ahead that a strip's weights are prefetched.
const PREFETCH: usize = 8;

const _: () = assert!(
    MR == 6 && NR.is_multiple_of(STRIP),
    "a tile holds 6 rows of two vectors per strip"
);

/// f32 products over `kc` k-steps, like [`super::kernels::tile_f32_width`]: `xs` is the
/// tile's first activation row (rows `ldx` apart, read in place), `ws` the first k-step of a
/// panel of 16-output strips, strip `s` starting `s * strip_step` floats after it.
///
/// # Safety
/// AVX2 and FMA must be present; `t.rows` rows of `kc` floats at `xs`, `ldx` apart; each of
/// the `t.cols.div_ceil(16)` strips holds `kc * 16` floats; `t` describes a writable region
/// (with `bias`, `cols` readable floats; with `addend`, readable like `c`).
pub(super) unsafe fn tile_f32_strips(
    kc: usize,
    xs: *const f32,
    ldx: usize,
    ws: *const f32,
    strip_step: usize,
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
        let ws = ws.wrapping_add(s * strip_step);
        // SAFETY: the caller's contract; the strip is columns c0.. of the tile.
        unsafe {
            // A strip of at most 8 outputs (attention's V past 64 columns for head size 72)
            // takes half the FMAs on one vector per row.
            if strip.cols <= 8 {
                with_rows!(t.rows, R => rows_f32::<R, 1>(kc, xs, ldx, ws, &strip))
            } else {
                with_rows!(t.rows, R => rows_f32::<R, 2>(kc, xs, ldx, ws, &strip))
            }
        }
    }
}

/// `R` rows × `8 * V` outputs of f32 products from one strip (`ws`: 16 floats per k-step,
/// the first `8 * V` read).
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_f32<const R: usize, const V: usize>(
    kc: usize,
    xs: *const f32,
    ldx: usize,
    ws: *const f32,
    t: &Tile,
) {
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    // Each row's own pointer, indexed by k: no address arithmetic per step beyond the index.
    let x: [*const f32; R] = std::array::from_fn(|r| xs.wrapping_add(r * ldx));
    let step = |kk: usize| {
        // SAFETY: kk < kc and r < R = t.rows: inside the panel and the activation rows.
        unsafe {
            let w = ws.add(kk * STRIP);
            // Fetch ahead of the hardware prefetcher, which trails a stream that starts in L2.
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(PREFETCH * STRIP).cast());
            let wv: [__m256; V] = std::array::from_fn(|j| _mm256_loadu_ps(w.add(8 * j)));
            for (a, x) in acc.iter_mut().zip(x) {
                let b = _mm256_broadcast_ss(&*x.add(kk));
                for (aj, wj) in a.iter_mut().zip(wv) {
                    *aj = _mm256_fmadd_ps(wj, b, *aj);
                }
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

/// Adds the strip into (or writes it to) the output, masked to `t.cols` (≤ 8 · V).
#[inline(always)]
pub(super) unsafe fn store<const R: usize, const V: usize>(acc: &[[__m256; V]; R], t: &Tile) {
    for j in 0..V {
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

/// An 8 × 8 block of 32-bit words transposed: word `j` of `src[i]` to `dst[j * dst_stride + i]`
/// (packing weight rows into strips).
///
/// # Safety
/// AVX2 must be present; each `src[i]` has 8 readable words, and the 8 destinations 8
/// writable words.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_8x8(src: &[*const u32; 8], dst: *mut u32, dst_stride: usize) {
    // SAFETY: the caller's contract on `src` and `dst`; the rest is register shuffling.
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src[i].cast()));
        // Rows interleaved by word within each 128-bit half: t[2i] holds words 0, 1 | 4, 5 of
        // rows 2i and 2i + 1, t[2i + 1] words 2, 3 | 6, 7.
        let t: [__m256; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_ps(a, b)
            } else {
                _mm256_unpackhi_ps(a, b)
            }
        });
        // Four rows' word e | e + 4: u[4h + e] for rows 4h..4h + 4.
        let u: [__m256; 8] = std::array::from_fn(|i| {
            let (h, e) = (i / 4, i % 4);
            let (a, b) = (t[4 * h + e / 2], t[4 * h + 2 + e / 2]);
            if e % 2 == 0 {
                _mm256_shuffle_ps::<0x44>(a, b)
            } else {
                _mm256_shuffle_ps::<0xee>(a, b)
            }
        });
        for e in 0..4 {
            let lo = _mm256_permute2f128_ps::<0x20>(u[e], u[4 + e]);
            let hi = _mm256_permute2f128_ps::<0x31>(u[e], u[4 + e]);
            _mm256_storeu_ps(dst.add(e * dst_stride).cast(), lo);
            _mm256_storeu_ps(dst.add((e + 4) * dst_stride).cast(), hi);
        }
    }
}
