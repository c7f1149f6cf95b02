//! Packing one k-block of the operands into the layouts the register tiles read in order.
//!
//! Weights → panels of [`NR`] outputs, k-major (`panel[kk * NR + j]`); outputs past the end
//! of the last panel are zero. For bf16 each element is a u32 holding a k-pair (even k in
//! the low half), the operand `vdpbf16ps` multiplies, and the activations are rounded into
//! the same pairs, row by row.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

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
    for (row, dst) in rows.zip(out.chunks_exact_mut(kc2)) {
        let src = x.block(row, k0, kc);
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

/// f32 → bf16 bits, round to nearest even; NaN stays NaN (ggml's `GGML_FP32_TO_BF16`).
pub(super) fn bf16_bits(v: f32) -> u32 {
    let b = v.to_bits();
    if v.is_nan() {
        (b >> 16) | 0x40
    } else {
        (b + 0x7fff + ((b >> 16) & 1)) >> 16
    }
}

/// Weight rows `feats` (f32), columns `k0..k0 + kc`, into panels.
pub(super) fn panels_f32(
    w: &Rows<'_, f32>,
    feats: std::ops::Range<usize>,
    k0: usize,
    kc: usize,
    out: &mut [f32],
) {
    for_panel_rows(feats, kc, NR, out, |row, col, panel| {
        scatter(w.block(row, k0, kc), col, panel);
    });
}

/// Weight rows in f16 (bits), widened to f32 into panels.
pub(super) fn panels_f16(
    w: &Rows<'_, u16>,
    feats: std::ops::Range<usize>,
    k0: usize,
    kc: usize,
    out: &mut [f32],
) {
    let mut wide = vec![0f32; kc];
    for_panel_rows(feats, kc, NR, out, |row, col, panel| {
        // `half` converts whole slices with F16C when the CPU has it.
        let halves: &[half::f16] = w.block(row, k0, kc).reinterpret_cast();
        halves.convert_to_f32_slice(&mut wide);
        scatter(&wide, col, panel);
    });
}

/// Weight rows in bf16 (bits) into panels of k-pairs.
pub(super) fn panels_bf16(
    w: &Rows<'_, u16>,
    feats: std::ops::Range<usize>,
    k0: usize,
    kc: usize,
    out: &mut [u32],
) {
    let kc2 = kc.div_ceil(2);
    for_panel_rows(feats, kc2, NR, out, |row, col, panel| {
        for (q, pair) in w.block(row, k0, kc).chunks(2).enumerate() {
            let hi = pair.get(1).copied().unwrap_or(0) as u32;
            panel[q * NR + col] = pair[0] as u32 | (hi << 16);
        }
    });
}

/// Calls `fill(row, column in panel, panel)` for each weight row, and zeroes the columns of
/// the last panel past `feats.end`. A panel is `depth * NR` elements.
fn for_panel_rows<T: Copy + Default>(
    feats: std::ops::Range<usize>,
    depth: usize,
    nr: usize,
    out: &mut [T],
    mut fill: impl FnMut(usize, usize, &mut [T]),
) {
    for (p, first) in feats.clone().step_by(nr).enumerate() {
        let panel = &mut out[p * depth * nr..(p + 1) * depth * nr];
        let valid = nr.min(feats.end - first);
        for col in 0..valid {
            fill(first + col, col, panel);
        }
        for col in valid..nr {
            for d in 0..depth {
                panel[d * nr + col] = T::default();
            }
        }
    }
}

fn scatter(src: &[f32], col: usize, panel: &mut [f32]) {
    for (kk, &v) in src.iter().enumerate() {
        panel[kk * NR + col] = v;
    }
}

/// Row segments `rows` × columns `c0..c0 + width` of a row-major f32 matrix with row stride
/// `ld`, copied as one panel `width` wide (`panel[row * width + j]`): the layout of a matrix
/// whose outputs are its columns (attention's V). Columns past `cols` are zero.
pub(super) fn panel_of_columns(
    data: &[f32],
    ld: usize,
    rows: usize,
    (c0, cols, width): (usize, usize, usize),
    out: &mut [f32],
) {
    for (r, dst) in out.chunks_exact_mut(width).take(rows).enumerate() {
        let valid = cols.min(width);
        dst[..valid].copy_from_slice(&data[r * ld + c0..r * ld + c0 + valid]);
        dst[valid..].fill(0.0);
    }
}
