//! Packing one k-block of the operands into the layouts the register tiles read in order.
//!
//! Weights → panels of [`NR`] outputs, k-major, in strips of the outputs the register tiles
//! read per k-step ([`panel_at`]: `panel[kk * NR + j]` for the AVX-512 tiles, four 16-output
//! strips one after the other for the AVX2 ones); outputs past the end of the last panel are
//! zero. For bf16 each element is a u32 holding a k-pair (even k in
//! the low half), the operand `vdpbf16ps` multiplies, and the activations are rounded into
//! the same pairs, row by row.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::q8::{BLOCK_BYTES, QK};
use super::NR;

/// Rows of a row-major matrix with `k` columns; `row(i)` is columns `k0..k0 + kc` of row `i`.
pub(super) struct Rows<'a, T> {
    pub data: &'a [T],
    pub k: usize,
}

impl<T> Rows<'_, T> {
    pub(super) fn block(&self, i: usize, k0: usize, kc: usize) -> &[T] {
        &self.data[i * self.k + k0..i * self.k + k0 + kc]
    }
}

/// Activation rows `rows`, columns `k0..k0 + kc`, as bf16 k-pairs rounded to nearest even
/// as ggml rounds them; row `i` lands at `out[i * kc.div_ceil(2)..]`. (f32 activations need
/// no packing: the tiles read them in place.)
pub(super) fn rows_bf16(
    x: &Rows<'_, f32>,
    rows: std::ops::Range<usize>,
    k0: usize,
    kc: usize,
    out: &mut [u32],
) {
    let kc2 = kc.div_ceil(2);
    let vector = is_x86_feature_detected!("avx512f");
    for (row, dst) in rows.zip(out.chunks_exact_mut(kc2)) {
        let src = x.block(row, k0, kc);
        let mut done = 0;
        if vector {
            // SAFETY: AVX-512F was just detected; 16 floats in, 8 words out per step.
            unsafe {
                while done + 16 <= kc {
                    bf16_pairs_16(&src[done..done + 16], &mut dst[done / 2..done / 2 + 8]);
                    done += 16;
                }
            }
        }
        let (src, dst) = (&src[done..], &mut dst[done / 2..]);
        let pairs = src.chunks_exact(2);
        let tail = pairs.remainder().first().map(|&v| bf16_bits(v));
        for (d, p) in dst.iter_mut().zip(pairs) {
            *d = bf16_bits(p[0]) | (bf16_bits(p[1]) << 16);
        }
        if let (Some(t), Some(last)) = (tail, dst.last_mut()) {
            *last = t;
        }
    }
}

/// [`bf16_bits`] on 16 floats, packed as 8 k-pairs.
///
/// # Safety
/// AVX-512F must be present; `src` holds 16 floats and `dst` 8 words.
#[target_feature(enable = "avx512f")]
unsafe fn bf16_pairs_16(src: &[f32], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    // SAFETY: the slices' lengths as the contract says; the rest is register arithmetic.
    unsafe {
        let v = _mm512_loadu_ps(src.as_ptr());
        let b = _mm512_castps_si512(v);
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
        let rounded = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), odd);
        let mut bits = _mm512_srli_epi32::<16>(rounded);
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40));
        bits = _mm512_mask_mov_epi32(bits, nan, quiet);
        _mm256_storeu_si256(dst.as_mut_ptr().cast(), _mm512_cvtepi32_epi16(bits));
    }
}

/// f32 → bf16 bits, round to nearest even; NaN stays NaN (ggml's `GGML_FP32_TO_BF16`).
pub(super) fn bf16_bits(v: f32) -> u32 {
    let b = v.to_bits();
    if v.is_nan() {
        (b >> 16) | 0x40
    } else {
        (b + 0x7fff + ((b >> 16) & 1)) >> 16
    }
}

/// Where k-step `kk`, output `j` of a panel `depth` steps deep lies when its outputs are
/// stored as k-major strips `strip` wide, one strip after the other: with `strip` the panel's
/// width, plain k-major rows (what the AVX-512 tiles read, a whole row per k-step); with 16,
/// one contiguous stream per 16 outputs (what the AVX2 tiles read, a strip at a time).
pub(super) fn panel_at(depth: usize, strip: usize, kk: usize, j: usize) -> usize {
    j / strip * depth * strip + kk * strip + j % strip
}

/// Weight rows `feats` (f32), columns `k0..k0 + kc`, into panels of strips `strip` wide.
///
/// # Safety
/// The CPU must support AVX-512F or AVX2 (whole blocks are transposed with the vector
/// instructions of the strip's tiles).
pub(super) unsafe fn panels_f32(
    w: &Rows<'_, f32>,
    feats: std::ops::Range<usize>,
    (k0, kc): (usize, usize),
    strip: usize,
    out: &mut [f32],
) {
    let done = FullPanels::new(&feats, kc, strip, out.len()).map_or((0, 0), |fast| {
        // SAFETY: `FullPanels::new` answers only where the transposes' instructions run.
        unsafe { fast.run(as_words_mut(out), |row| as_words(w.block(row, k0, kc))) }
    });
    for_panel_rows(feats, (kc, strip), out, done, |row, col, panel, d0| {
        scatter(&w.block(row, k0, kc)[d0..], (d0, col), (kc, strip), panel);
    });
}

/// Weight rows in f16 (bits), widened to f32 into panels of strips `strip` wide.
///
/// # Safety
/// As for [`panels_f32`].
pub(super) unsafe fn panels_f16(
    w: &Rows<'_, u16>,
    feats: std::ops::Range<usize>,
    (k0, kc): (usize, usize),
    strip: usize,
    out: &mut [f32],
) {
    // `half` converts slices with F16C when present.
    // SAFETY: the caller's contract, passed on.
    unsafe {
        panels_widened(feats, (kc, strip), out, |row, from, wide| {
            let halves: &[half::f16] = w.block(row, k0 + from, kc - from).reinterpret_cast();
            halves.convert_to_f32_slice(wide);
        })
    }
}

/// Weight rows in bf16 (bits), widened to f32 into panels of strips `strip` wide: exact (a
/// bf16 is the top half of an f32), so a CPU without bf16 products runs them at the f32 rate.
///
/// # Safety
/// As for [`panels_f32`].
pub(super) unsafe fn panels_bf16_wide(
    w: &Rows<'_, u16>,
    feats: std::ops::Range<usize>,
    (k0, kc): (usize, usize),
    strip: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        panels_widened(feats, (kc, strip), out, |row, from, wide| {
            for (d, &b) in wide.iter_mut().zip(w.block(row, k0 + from, kc - from)) {
                *d = f32::from_bits(u32::from(b) << 16);
            }
        })
    }
}

/// q8_0 weight rows (`k` elements each, as ggml stores them) dequantized to f32 into panels of
/// strips `strip` wide: `scale · q` as ggml's `dequantize_row_q8_0` computes it, exactly. `k0`
/// and `kc` are whole blocks.
///
/// # Safety
/// As for [`panels_f32`].
pub(super) unsafe fn panels_q8_wide(
    (bytes, k): (&[u8], usize),
    feats: std::ops::Range<usize>,
    (k0, kc): (usize, usize),
    strip: usize,
    out: &mut [f32],
) {
    debug_assert!(k0.is_multiple_of(QK) && kc.is_multiple_of(QK));
    let row_bytes = k / QK * BLOCK_BYTES;
    // SAFETY: the caller's contract, passed on.
    unsafe {
        panels_widened(feats, (kc, strip), out, |row, from, wide| {
            let first = k0 + from;
            let b0 = first / QK;
            let skip = first - b0 * QK;
            let blocks = &bytes[row * row_bytes + b0 * BLOCK_BYTES
                ..row * row_bytes + (k0 + kc) / QK * BLOCK_BYTES];
            let mut at = 0;
            for (i, block) in blocks.chunks_exact(BLOCK_BYTES).enumerate() {
                let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                let quants = &block[2 + if i == 0 { skip } else { 0 }..];
                for (dst, &q) in wide[at..at + quants.len()].iter_mut().zip(quants) {
                    *dst = f32::from(q as i8) * d;
                }
                at += quants.len();
            }
        })
    }
}

/// Weight rows widened to f32 into panels of strips `strip` wide: `widen(row, from, wide)`
/// writes columns `from..kc` of the k-block of weight row `row` into `wide` (`kc - from`
/// long).
///
/// # Safety
/// As for [`panels_f32`].
unsafe fn panels_widened(
    feats: std::ops::Range<usize>,
    (kc, strip): (usize, usize),
    out: &mut [f32],
    widen: impl Fn(usize, usize, &mut [f32]),
) {
    let row_from = |row: usize, from: usize, wide: &mut [f32]| {
        widen(row, from, &mut wide[..kc - from]);
    };
    let done = FullPanels::new(&feats, kc, strip, out.len()).map_or((0, 0), |fast| {
        // SAFETY: `FullPanels::new` answers only where the transposes' instructions run.
        unsafe {
            fast.run_staged(as_words_mut(out), kc, |first, staged| {
                for (i, dst) in staged.chunks_exact_mut(kc).enumerate() {
                    row_from(first + i, 0, as_floats_mut(dst));
                }
            })
        }
    });
    let mut wide = vec![0f32; kc];
    for_panel_rows(feats, (kc, strip), out, done, |row, col, panel, d0| {
        row_from(row, d0, &mut wide);
        scatter(&wide[..kc - d0], (d0, col), (kc, strip), panel);
    });
}

/// Weight rows in bf16 (bits) into panels of k-pairs.
///
/// # Safety
/// The CPU must support AVX-512F or AVX2 (full panels are filled by AVX-512 transposes where
/// the CPU has them).
pub(super) unsafe fn panels_bf16(
    w: &Rows<'_, u16>,
    feats: std::ops::Range<usize>,
    k0: usize,
    kc: usize,
    out: &mut [u32],
) {
    let kc2 = kc.div_ceil(2);
    // Whole pairs at a 4-byte boundary are read as words directly.
    let pairs = |row: usize| -> Option<&[u32]> {
        // SAFETY: `align_to` only yields the aligned middle; u32 has no invalid bit patterns.
        match unsafe { w.block(row, k0, kc).align_to::<u32>() } {
            ([], mid, []) => Some(mid),
            _ => None,
        }
    };
    let aligned = kc.is_multiple_of(2) && feats.clone().all(|r| pairs(r).is_some());
    let done = FullPanels::new(&feats, kc2, NR, out.len())
        .filter(|_| aligned)
        .map_or((0, 0), |fast| {
            // SAFETY: `FullPanels::new` answers only where AVX-512F runs.
            unsafe { fast.run(out, |row| pairs(row).unwrap_or(&[])) }
        });
    for_panel_rows(feats, (kc2, NR), out, done, |row, col, panel, q0| {
        let tail = w.block(row, k0 + 2 * q0, kc - 2 * q0);
        for (q, pair) in tail.chunks(2).enumerate() {
            let hi = pair.get(1).copied().unwrap_or(0) as u32;
            panel[(q0 + q) * NR + col] = pair[0] as u32 | (hi << 16);
        }
    });
}

/// The panels whose 64 columns are all weight rows, filled by block transposes: 16 × 16 with
/// AVX-512 into whole-panel strips, 8 × 8 with AVX2 into 16-output strips (the scalar fill
/// then only handles a partial last panel and the depth's tail). `None` where neither runs.
struct FullPanels {
    first: usize,
    panels: usize,
    depth: usize,
    /// Depth covered by whole blocks.
    full: usize,
    /// Outputs per strip of the panels.
    strip: usize,
    /// Rows (and k-steps) per transposed block: 16 or 8.
    block: usize,
}

impl FullPanels {
    fn new(
        feats: &std::ops::Range<usize>,
        depth: usize,
        strip: usize,
        out_len: usize,
    ) -> Option<Self> {
        let block = if strip == NR && super::avx512_kernels() {
            16
        } else if strip == super::avx2::STRIP && super::tiles().is_some() {
            8
        } else {
            return None;
        };
        let panels = feats.len() / NR;
        let full = depth / block * block;
        let fits = panels > 0 && full > 0 && out_len >= panels * depth * NR;
        fits.then_some(Self {
            first: feats.start,
            panels,
            depth,
            full,
            strip,
            block,
        })
    }

    /// `row(r)` gives weight row `r`'s `depth` words. Returns (panels, depth) filled.
    ///
    /// # Safety
    /// The CPU must support the block's transposes (AVX-512F for 16, AVX2 for 8).
    unsafe fn run<'a>(self, out: &mut [u32], row: impl Fn(usize) -> &'a [u32]) -> (usize, usize) {
        for p in 0..self.panels {
            for g in 0..NR / self.block {
                let first = self.first + p * NR + g * self.block;
                let rows: [&[u32]; 16] = std::array::from_fn(|i| row(first + i % self.block));
                // SAFETY: this function's own requirement.
                unsafe { self.block_rows(out, p, g, &rows) };
            }
        }
        (self.panels, self.full)
    }

    /// Like `run`, for rows produced a block at a time into a staging buffer of `block ×
    /// width` words.
    ///
    /// # Safety
    /// As for `run`.
    unsafe fn run_staged(
        self,
        out: &mut [u32],
        width: usize,
        mut stage: impl FnMut(usize, &mut [u32]),
    ) -> (usize, usize) {
        let mut staged = vec![0u32; self.block * width];
        for p in 0..self.panels {
            for g in 0..NR / self.block {
                stage(self.first + p * NR + g * self.block, &mut staged);
                let rows: [&[u32]; 16] = std::array::from_fn(|i| &staged[i % self.block * width..]);
                // SAFETY: this function's own requirement.
                unsafe { self.block_rows(out, p, g, &rows) };
            }
        }
        (self.panels, self.full)
    }

    /// Outputs `block·g..block·(g + 1)` of panel `p` from that many rows (the first `block` of
    /// `rows`), over the whole blocks of depth.
    ///
    /// # Safety
    /// As for `run`.
    unsafe fn block_rows(&self, out: &mut [u32], p: usize, g: usize, rows: &[&[u32]; 16]) {
        let (b, strip) = (self.block, self.strip);
        let panel = &mut out[p * self.depth * NR..(p + 1) * self.depth * NR];
        for d0 in (0..self.full).step_by(b) {
            let at = panel_at(self.depth, strip, d0, g * b);
            // The block's b destinations, `strip` apart.
            let dst = panel[at..at + (b - 1) * strip + b].as_mut_ptr();
            // SAFETY: the instructions are this function's requirement; every source holds `b`
            // words (sliced here) and `dst` spans the `b` strided destinations.
            unsafe {
                if b == 16 {
                    let src = std::array::from_fn(|i| rows[i][d0..d0 + 16].as_ptr());
                    super::kernels::transpose_16x16(&src, dst, strip);
                } else {
                    let src = std::array::from_fn(|i| rows[i][d0..d0 + 8].as_ptr());
                    super::avx2::transpose_8x8(&src, dst, strip);
                }
            }
        }
    }
}

fn as_words(s: &[f32]) -> &[u32] {
    // SAFETY: f32 and u32 have the same size and alignment; every bit pattern is a u32.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) }
}

fn as_floats_mut(s: &mut [u32]) -> &mut [f32] {
    // SAFETY: as `as_words`; every u32 bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

fn as_words_mut(s: &mut [f32]) -> &mut [u32] {
    // SAFETY: as `as_words`; every u32 bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

/// Calls `fill(row, column in panel, panel, from)` for each weight row, to fill its column
/// from depth `from` on, and zeroes the columns of the last panel past `feats.end`. A panel
/// is `depth * NR` elements in strips `strip` wide ([`panel_at`]); `done = (panels, depth)`:
/// the first `panels` panels already hold their first `depth` rows (the transposed blocks).
fn for_panel_rows<T: Copy + Default>(
    feats: std::ops::Range<usize>,
    (depth, strip): (usize, usize),
    out: &mut [T],
    done: (usize, usize),
    mut fill: impl FnMut(usize, usize, &mut [T], usize),
) {
    for (p, first) in feats.clone().step_by(NR).enumerate() {
        let panel = &mut out[p * depth * NR..(p + 1) * depth * NR];
        let valid = NR.min(feats.end - first);
        let from = if p < done.0 { done.1 } else { 0 };
        if from < depth {
            for col in 0..valid {
                fill(first + col, col, panel, from);
            }
        }
        for col in valid..NR {
            for d in 0..depth {
                panel[panel_at(depth, strip, d, col)] = T::default();
            }
        }
    }
}

/// Column `col` of a panel `depth` deep in strips `strip` wide, from k-step `from` on: `src`.
fn scatter(
    src: &[f32],
    (from, col): (usize, usize),
    (depth, strip): (usize, usize),
    panel: &mut [f32],
) {
    let at = panel_at(depth, strip, from, col);
    for (kk, &v) in src.iter().enumerate() {
        panel[at + kk * strip] = v;
    }
}

/// Row segments `rows` × columns `c0..c0 + width` of a row-major f32 matrix with row stride
/// `ld`, copied as one panel `width` wide and `rows` deep in strips of `strip.min(width)`
/// columns ([`panel_at`]): the layout of a matrix whose outputs are its columns (attention's
/// V). Columns past `cols` are zero.
pub(super) fn panel_of_columns(
    data: &[f32],
    (ld, rows): (usize, usize),
    (c0, cols, width): (usize, usize, usize),
    strip: usize,
    out: &mut [f32],
) {
    let strip = strip.min(width);
    let valid = cols.min(width);
    for (s, part) in out
        .chunks_exact_mut(rows * strip)
        .take(width / strip)
        .enumerate()
    {
        let (from, to) = ((s * strip).min(valid), ((s + 1) * strip).min(valid));
        for (r, dst) in part.chunks_exact_mut(strip).enumerate() {
            let at = r * ld + c0;
            dst[..to - from].copy_from_slice(&data[at + from..at + to]);
            dst[to - from..].fill(0.0);
        }
    }
}

/// Rows `feats` of a row-major f32 matrix (attention's K: a row per key), columns
/// `k0..k0 + kc`, rounded to bf16 k-pairs as [`rows_bf16`] rounds activations, into panels of
/// [`NR`] rows (`panel[pair * NR + j]`); rows past the end of the last panel are zero.
pub(super) fn panels_bf16_of_f32(
    x: &Rows<'_, f32>,
    feats: std::ops::Range<usize>,
    k0: usize,
    kc: usize,
    out: &mut [u32],
) {
    let kc2 = kc.div_ceil(2);
    let mut pairs = vec![0u32; kc2];
    for (p, panel) in out
        .chunks_exact_mut(kc2 * NR)
        .take(feats.len().div_ceil(NR))
        .enumerate()
    {
        for col in 0..NR {
            let row = feats.start + p * NR + col;
            if row < feats.end {
                rows_bf16(x, row..row + 1, k0, kc, &mut pairs);
            } else {
                pairs.fill(0);
            }
            for (q, &pair) in pairs.iter().enumerate() {
                panel[q * NR + col] = pair;
            }
        }
    }
}

/// Like [`panel_of_columns`] with the rows rounded to bf16 and paired (row `2i` in the low
/// half of `panel[i * width + j]`, row `2i + 1` in the high half; a missing last odd row is
/// zero): attention's V as the k-pairs of a P V product over keys.
pub(super) fn pair_panel_of_columns(
    data: &[f32],
    ld: usize,
    rows: usize,
    (c0, cols, width): (usize, usize, usize),
    out: &mut [u32],
) {
    let valid = cols.min(width);
    for (i, dst) in out
        .chunks_exact_mut(width)
        .take(rows.div_ceil(2))
        .enumerate()
    {
        let lo = &data[2 * i * ld + c0..][..valid];
        let hi = (2 * i + 1 < rows).then(|| &data[(2 * i + 1) * ld + c0..][..valid]);
        for (j, d) in dst[..valid].iter_mut().enumerate() {
            *d = bf16_bits(lo[j]) | hi.map_or(0, |h| bf16_bits(h[j]) << 16);
        }
        dst[valid..].fill(0);
    }
}
