//! q8_0 weights: activations quantized to q8_0 per 32-block exactly as ggml quantizes them
//! for its own q8_0 product, then integer dot products with AVX-512 VNNI (`vpdpbusd`, 64
//! byte products per instruction), scaled per block in f32 as ggml does.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, so the activations are stored offset by
//! +128 and each block's accumulator starts at −128 · Σ w (packed with the weights), which
//! leaves exactly Σ x·w.

use std::arch::x86_64::*;

use super::kernels::{prefetch_output, store, with_rows, Acc, Tile};
use super::pack::Rows;
use super::Tiles;

/// Elements per q8_0 block.
pub(super) const QK: usize = 32;
/// Outputs per q8_0 panel (two 16-lane vectors: 12 integer and 12 f32 accumulators fit).
pub(super) const NR8: usize = 32;
/// Bytes of one q8_0 block in ggml (f16 scale, 32 signed bytes).
pub(super) const BLOCK_BYTES: usize = 34;
/// u32 words per packed weight block of a panel: 8 k-quads × 32 outputs, then 32 f32
/// scales, then 32 i32 start values.
pub(super) const PANEL_BLOCK_WORDS: usize = 8 * NR8 + NR8 + NR8;

/// Quantizes activation rows `rows`, blocks `b0..b0 + nb`, as ggml's `quantize_row_q8_0`:
/// d = max|x| / 127, q = round-half-even(x · 127 / max|x|); the scale is kept as the f16
/// ggml stores, widened back. Row `i` lands at `quants[i * nb * 8..]` (u32 quads, +128
/// offset) and `scales[i * nb..]`.
pub(super) fn quantize_rows(
    x: &Rows<'_, f32>,
    rows: std::ops::Range<usize>,
    b0: usize,
    nb: usize,
    quants: &mut [u32],
    scales: &mut [f32],
) {
    // SAFETY: `tiles()` names what this CPU has (under the cap).
    unsafe { quantize_rows_on(super::tiles(), x, rows, b0, nb, quants, scales) }
}

/// [`quantize_rows`] with the vectors of `tiles` (the class `SD_CLI_CPU` allows: a capped run
/// quantizes as the lesser CPU would), or the scalar loop for `None`; all give the same bits.
///
/// # Safety
/// The CPU has the instructions of `tiles`.
pub(super) unsafe fn quantize_rows_on(
    tiles: Option<Tiles>,
    x: &Rows<'_, f32>,
    rows: std::ops::Range<usize>,
    b0: usize,
    nb: usize,
    quants: &mut [u32],
    scales: &mut [f32],
) {
    for (i, row) in rows.enumerate() {
        let src = x.block(row, b0 * QK, nb * QK);
        let q = &mut quants[i * nb * 8..(i + 1) * nb * 8];
        for (b, block) in src.chunks_exact(QK).enumerate() {
            let quads: &mut [u32; 8] = (&mut q[b * 8..b * 8 + 8]).try_into().expect("8 quads");
            // SAFETY: `tiles` are this CPU's (the contract); the block is 32 floats, the quads
            // 8 words.
            let vector = unsafe {
                match tiles {
                    Some(Tiles::Avx512) => Some(quantize_block(block, quads)),
                    Some(Tiles::Avx2) => Some(super::q8_avx2::quantize_block(block, quads)),
                    None => None,
                }
            };
            if let Some(scale) = vector {
                scales[i * nb + b] = scale;
                continue;
            }
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            scales[i * nb + b] = half::f16::from_f32(d).to_f32();
            for (w, quad) in q[b * 8..b * 8 + 8].iter_mut().zip(block.chunks_exact(4)) {
                let mut bytes = [0u8; 4];
                for (o, &v) in bytes.iter_mut().zip(quad) {
                    let n = (v * id).round_ties_even().clamp(-127.0, 127.0) as i32;
                    *o = (n + 128) as u8;
                }
                *w = u32::from_le_bytes(bytes);
            }
        }
    }
}

/// One block as the scalar loop above quantizes it (the same f32 product, rounded half to
/// even by `vcvtps2dq` under the default rounding mode), 32 lanes at a time; returns the
/// scale.
#[target_feature(enable = "avx512f")]
unsafe fn quantize_block(block: &[f32], quads: &mut [u32; 8]) -> f32 {
    // SAFETY: the block holds 32 floats (two vectors); the quads are 32 bytes.
    unsafe {
        let lo = _mm512_loadu_ps(block.as_ptr());
        let hi = _mm512_loadu_ps(block.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let id = _mm512_set1_ps(id);
        let offset = _mm512_set1_epi32(128);
        let qlo = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(lo, id)), offset);
        let qhi = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(hi, id)), offset);
        let out = quads.as_mut_ptr().cast::<__m128i>();
        _mm_storeu_si128(out, _mm512_cvtepi32_epi8(qlo));
        _mm_storeu_si128(out.add(1), _mm512_cvtepi32_epi8(qhi));
        half::f16::from_f32(amax / 127.0).to_f32()
    }
}

/// Weight rows `feats` (ggml q8_0 rows of `k / 32` blocks, as bytes), blocks `b0..b0 + nb`,
/// into panels of [`NR8`] outputs: per block, 8 quads × 32 outputs of bytes, the 32 scales,
/// the 32 start values −128 · Σ w. Outputs past `feats.end` are zero.
pub(super) fn pack_panels(
    w: &[u8],
    k: usize,
    feats: std::ops::Range<usize>,
    b0: usize,
    nb: usize,
    out: &mut [u32],
) {
    let row_bytes = k / QK * BLOCK_BYTES;
    let panel_words = nb * PANEL_BLOCK_WORDS;
    for (p, first) in feats.clone().step_by(NR8).enumerate() {
        let panel = &mut out[p * panel_words..(p + 1) * panel_words];
        panel.fill(0);
        for col in 0..NR8.min(feats.end - first) {
            let row = &w[(first + col) * row_bytes..(first + col + 1) * row_bytes];
            for b in 0..nb {
                let blk = &row[(b0 + b) * BLOCK_BYTES..(b0 + b + 1) * BLOCK_BYTES];
                let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let qs = &blk[2..];
                let dst = &mut panel[b * PANEL_BLOCK_WORDS..(b + 1) * PANEL_BLOCK_WORDS];
                for (quad, bytes) in qs.chunks_exact(4).enumerate() {
                    dst[quad * NR8 + col] =
                        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                }
                let sum: i32 = qs.iter().map(|&q| q as i8 as i32).sum();
                dst[8 * NR8 + col] = d.to_bits();
                dst[9 * NR8 + col] = (-128 * sum) as u32;
            }
        }
    }
}

/// `nb` blocks of products into one tile of up to 6 rows × 32 outputs.
///
/// # Safety
/// AVX-512F, BW and VNNI must be present; `xq` holds `t.rows` rows of `nb * 8` quads, `ldq`
/// apart, `xd` their `nb` scales, `ldd` apart; `wp` holds `nb * PANEL_BLOCK_WORDS` words;
/// `t` describes a writable region of at most 32 columns.
pub(super) unsafe fn tile(
    nb: usize,
    xq: *const u32,
    ldq: usize,
    xd: *const f32,
    ldd: usize,
    wp: *const u32,
    t: &Tile,
) {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { with_rows!(t.rows, R => rows::<R>(nb, xq, ldq, xd, ldd, wp, t)) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows<const R: usize>(
    nb: usize,
    xq: *const u32,
    ldq: usize,
    xd: *const f32,
    ldd: usize,
    wp: *const u32,
    t: &Tile,
) {
    // SAFETY: prefetches never fault.
    unsafe { prefetch_output::<R>(t) };
    let mut acc: Acc<R, 2> = [[_mm512_setzero_ps(); 2]; R];
    for b in 0..nb {
        // SAFETY: b < nb and r < R = t.rows: inside the packed panel and the quantized rows.
        unsafe {
            let blk = wp.add(b * PANEL_BLOCK_WORDS);
            let start = [
                _mm512_loadu_si512(blk.add(9 * NR8).cast()),
                _mm512_loadu_si512(blk.add(9 * NR8 + 16).cast()),
            ];
            let mut isum = [start; R];
            for quad in 0..8 {
                let w0 = _mm512_loadu_si512(blk.add(quad * NR8).cast());
                let w1 = _mm512_loadu_si512(blk.add(quad * NR8 + 16).cast());
                for (r, s) in isum.iter_mut().enumerate() {
                    let x = _mm512_set1_epi32(*xq.add(r * ldq + b * 8 + quad) as i32);
                    s[0] = _mm512_dpbusd_epi32(s[0], x, w0);
                    s[1] = _mm512_dpbusd_epi32(s[1], x, w1);
                }
            }
            let dw = [
                _mm512_loadu_ps(blk.add(8 * NR8).cast()),
                _mm512_loadu_ps(blk.add(8 * NR8 + 16).cast()),
            ];
            for (r, (a, s)) in acc.iter_mut().zip(isum).enumerate() {
                let dx = _mm512_set1_ps(*xd.add(r * ldd + b));
                for j in 0..2 {
                    let scale = _mm512_mul_ps(dw[j], dx);
                    a[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[j]), scale, a[j]);
                }
            }
        }
    }
    // SAFETY: the caller's contract on `t`.
    unsafe { store(&acc, t) }
}
