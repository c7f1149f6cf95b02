//! What a product does to each output tile once its last k-block is in, while the tile is
//! still in L1: the tanh GELU of a feed-forward's first layer, or the residual sum
//! `residual + gate ⊙ y` of a block's output projection (adaLN's gated residual). Separately
//! each is one more pass over an output that has left the cache by then (PixArt XL's f32
//! step: GELU 0.11 s, the gate's products and the sums ~0.09 s of 8.8 s, `SD_CLI_PROFILE=1`).
//! The results are the separate ops' to the bit: the same GELU, the product then the sum.

use std::ops::Range;

use super::gelu::gelu_tanh_of;
use super::Tiles;

/// The finish of a product node (see `CpuKernels::linear_then`).
pub(super) enum Finish<'a> {
    None,
    GeluTanh,
    /// `residual + gate ⊙ y`; `residual` is laid out like the output, `gate` (if any) holds
    /// one row of `m` per `tokens_per_gate` consecutive tokens.
    Residual {
        residual: &'a [f32],
        gate: Option<&'a [f32]>,
        tokens_per_gate: usize,
    },
}

impl Finish<'_> {
    /// Finishes tokens `rows` × outputs `cols` of `y` (`m` outputs per token).
    ///
    /// # Safety
    /// The CPU has `tiles`' instructions (and AVX2, which every CPU with them has); `y` holds
    /// this product's output and the calling thread owns this part of it.
    pub(super) unsafe fn apply(
        &self,
        tiles: Tiles,
        y: *mut f32,
        m: usize,
        rows: Range<usize>,
        cols: Range<usize>,
    ) {
        for r in rows {
            let out = y.wrapping_add(r * m + cols.start);
            match self {
                Finish::None => return,
                // SAFETY: `cols` of row r lie inside the output (the caller's contract).
                Finish::GeluTanh => unsafe { gelu_tanh_of(tiles, out, out, cols.len()) },
                Finish::Residual {
                    residual,
                    gate,
                    tokens_per_gate,
                } => {
                    let res = &residual[r * m..][cols.clone()];
                    let gate = gate.map(|g| &g[r / tokens_per_gate * m..][cols.clone()]);
                    // SAFETY: as above; AVX2 is present.
                    unsafe { residual_row(out, res, gate) }
                }
            }
        }
    }
}

/// `out[j] = res[j] + gate[j] · out[j]` (or `res[j] + out[j]`), the product rounded before
/// the sum as ggml's `mul` then `add` (no FMA: Rust never contracts).
///
/// # Safety
/// AVX2 must be present; `out` holds `res.len()` floats no one else touches.
#[target_feature(enable = "avx2")]
unsafe fn residual_row(out: *mut f32, res: &[f32], gate: Option<&[f32]>) {
    // SAFETY: the caller's contract.
    let out = unsafe { std::slice::from_raw_parts_mut(out, res.len()) };
    match gate {
        Some(g) => {
            for ((o, &r), &g) in out.iter_mut().zip(res).zip(g) {
                *o = r + *o * g;
            }
        }
        None => {
            for (o, &r) in out.iter_mut().zip(res) {
                *o += r;
            }
        }
    }
}
