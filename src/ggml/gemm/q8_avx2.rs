//! q8_0 weights on CPUs with AVX2 and 256-bit VNNI but no AVX-512 (Alder Lake and later):
//! the panels, quantized activations and per-block scaling of `q8.rs`, with `vpdpbusd` on
//! 8-lane vectors. Sixteen registers hold 3 rows × 16 outputs (six integer and six f32
//! accumulators, two weight vectors, a broadcast), so a 6 × 32 tile of the driver runs as up
//! to four such sub-tiles, each over its half of the panel.
//!
//! The kernel exists twice, identical but for the instruction's encoding: AVX-VNNI's (VEX)
//! and AVX-512 VNNI + VL's (EVEX), which lets an AVX-512 machine run and test the same
//! arithmetic (`SD_CLI_CPU=avxvnni`).

use std::arch::x86_64::*;

use super::avx2_rows::reduce_max;
use super::kernels::Tile;
use super::q8::{NR8, PANEL_BLOCK_WORDS};
use crate::cpu_info::Vnni256;

/// Rows per sub-tile (registers: 4 × 3 accumulators + 2 weights + 1 broadcast = 15).
const ROWS: usize = 3;
/// Outputs per sub-tile: two 8-lane vectors.
const COLS: usize = 16;

/// `nb` blocks of products into one tile of up to 6 rows × 32 outputs, as `q8::tile` does.
///
/// # Safety
/// AVX2, FMA and the VNNI encoding `vnni` must be present; the rest as for `q8::tile`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    vnni: Vnni256,
    nb: usize,
    xq: *const u32,
    ldq: usize,
    xd: *const f32,
    ldd: usize,
    wp: *const u32,
    t: &Tile,
) {
    for r0 in (0..t.rows).step_by(ROWS) {
        for c0 in (0..t.cols).step_by(COLS) {
            let shift = |p: *const f32, at: usize| {
                if p.is_null() {
                    p
                } else {
                    p.wrapping_add(at)
                }
            };
            let sub = Tile {
                c: t.c.wrapping_add(r0 * t.ldc + c0),
                ldc: t.ldc,
                rows: (t.rows - r0).min(ROWS),
                cols: (t.cols - c0).min(COLS),
                accumulate: t.accumulate,
                bias: shift(t.bias, c0),
                addend: shift(t.addend, r0 * t.ldc + c0),
            };
            let (xq, xd) = (xq.wrapping_add(r0 * ldq), xd.wrapping_add(r0 * ldd));
            // SAFETY: the caller's contract; the sub-tile is rows r0.. and columns c0.. of
            // the tile, its operands those rows of the quantized activations and that half
            // of the panel.
            unsafe {
                match (vnni, sub.rows) {
                    (Vnni256::Vex, 1) => rows_vex::<1>(nb, xq, ldq, xd, ldd, wp, c0, &sub),
                    (Vnni256::Vex, 2) => rows_vex::<2>(nb, xq, ldq, xd, ldd, wp, c0, &sub),
                    (Vnni256::Vex, _) => rows_vex::<3>(nb, xq, ldq, xd, ldd, wp, c0, &sub),
                    (Vnni256::Evex, 1) => rows_evex::<1>(nb, xq, ldq, xd, ldd, wp, c0, &sub),
                    (Vnni256::Evex, 2) => rows_evex::<2>(nb, xq, ldq, xd, ldd, wp, c0, &sub),
                    (Vnni256::Evex, _) => rows_evex::<3>(nb, xq, ldq, xd, ldd, wp, c0, &sub),
                }
            }
        }
    }
}

/// `R` rows × 16 outputs from columns `c0..c0 + 16` of the panel, through `$dot`.
macro_rules! vnni_rows {
    ($name:ident, $features:literal, $dot:ident) => {
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name<const R: usize>(
            nb: usize,
            xq: *const u32,
            ldq: usize,
            xd: *const f32,
            ldd: usize,
            wp: *const u32,
            c0: usize,
            t: &Tile,
        ) {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for b in 0..nb {
                // SAFETY: b < nb, r < R and c0 + 16 ≤ NR8: inside the packed panel and the
                // quantized rows (the caller's contract).
                unsafe {
                    let blk = wp.add(b * PANEL_BLOCK_WORDS + c0);
                    let load = |at: usize| _mm256_loadu_si256(blk.add(at).cast());
                    let start = [load(9 * NR8), load(9 * NR8 + 8)];
                    let mut isum = [start; R];
                    for quad in 0..8 {
                        let (w0, w1) = (load(quad * NR8), load(quad * NR8 + 8));
                        for (r, s) in isum.iter_mut().enumerate() {
                            let x = _mm256_set1_epi32(*xq.add(r * ldq + b * 8 + quad) as i32);
                            s[0] = $dot(s[0], x, w0);
                            s[1] = $dot(s[1], x, w1);
                        }
                    }
                    let dw = [
                        _mm256_loadu_ps(blk.add(8 * NR8).cast()),
                        _mm256_loadu_ps(blk.add(8 * NR8 + 8).cast()),
                    ];
                    for (r, (a, s)) in acc.iter_mut().zip(isum).enumerate() {
                        let dx = _mm256_set1_ps(*xd.add(r * ldd + b));
                        for j in 0..2 {
                            let scale = _mm256_mul_ps(dw[j], dx);
                            a[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), scale, a[j]);
                        }
                    }
                }
            }
            // SAFETY: the caller's contract on `t` (at most 16 columns).
            unsafe { super::avx2::store(&acc, t) }
        }
    };
}

vnni_rows!(rows_vex, "avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32);
vnni_rows!(
    rows_evex,
    "avx2,fma,avx512vl,avx512vnni",
    _mm256_dpbusd_epi32
);

/// One 32-float block of activations quantized as `q8::quantize_rows`' scalar loop does (the
/// same f32 product, rounded half to even by `vcvtps2dq`), on 8-lane vectors; returns the
/// scale. Without it the AVX-VNNI class quantized every k-block's activations one float at a
/// time.
///
/// # Safety
/// AVX2 must be present; `block` holds 32 floats.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_block(block: &[f32], quads: &mut [u32; 8]) -> f32 {
    // SAFETY: the block holds 32 floats (four vectors); the quads are 32 bytes.
    unsafe {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(block.as_ptr().add(8 * i)));
        let sign = _mm256_set1_ps(-0.0);
        let abs = |x| _mm256_andnot_ps(sign, x);
        let amax = reduce_max(_mm256_max_ps(
            _mm256_max_ps(abs(v[0]), abs(v[1])),
            _mm256_max_ps(abs(v[2]), abs(v[3])),
        ));
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let offset = _mm256_set1_epi32(128);
        let q = v.map(|x| _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x, id)), offset));
        // 1..=255 each, so neither pack saturates. Within each 128-bit half they interleave
        // the four vectors' quads (0..4 | 4..8 of each); the permute puts them in order.
        let bytes = _mm256_packus_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(quads.as_mut_ptr().cast(), ordered);
        half::f16::from_f32(amax / 127.0).to_f32()
    }
}
