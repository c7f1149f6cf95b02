//! The AVX-512 register tiles: up to [`MR`] tokens × [`NR`] outputs, accumulated over one
//! k-block (weight panels as `pack.rs` lays them out), then added into the output.

use std::arch::x86_64::*;

use super::approx::{EXP2_MIN, EXP2_POLY, EXP_MIN, EXP_TAYLOR, LN2_HI, LN2_LO};
use super::{MR, NR};

const _: () = assert!(
    MR == 6 && NR == 64,
    "the tiles below hold 6 rows of four vectors"
);

/// Evaluates `$call` with the const `$r` set to `$rows` (1..=MR): each row count of a tile
/// is its own monomorphized kernel, so its accumulators stay in registers.
macro_rules! with_rows {
    ($rows:expr, $r:ident => $call:expr) => {
        match $rows {
            1 => {
                const $r: usize = 1;
                $call
            }
            2 => {
                const $r: usize = 2;
                $call
            }
            3 => {
                const $r: usize = 3;
                $call
            }
            4 => {
                const $r: usize = 4;
                $call
            }
            5 => {
                const $r: usize = 5;
                $call
            }
            _ => {
                const $r: usize = $crate::ggml::gemm::MR;
                $call
            }
        }
    };
}
pub(super) use with_rows;

/// Where a tile's results go: `rows` × `cols` of the row-major output at `c`.
pub(in crate::ggml) struct Tile {
    pub c: *mut f32,
    pub ldc: usize,
    pub rows: usize,
    pub cols: usize,
    /// Add to what the output holds (every k-block after the first).
    pub accumulate: bool,
    /// The bias for these `cols`, added on the last k-block; null for none.
    pub bias: *const f32,
    /// Values the output starts from (added on the first k-block), laid out like `c`
    /// (`ldc` apart); null for none.
    pub addend: *const f32,
}

/// k-steps ahead that the f32 tiles prefetch their panel's lines.
const PREFETCH: usize = 4;

/// k-steps per pass of the f32 tiles' loop.
const UNROLL: usize = 4;

/// Calls `step` with 0..kc, [`UNROLL`] steps per pass of the loop: its count and branch are
/// then shared by that many steps' FMAs and leave the FMA ports to them (on Golden Cove the
/// integer ports include both; the AVX2 tile on one Sapphire Rapids core went 89-93 ->
/// 94-101 GFLOP/s, the AVX-512 one +3-4 %).
#[inline(always)]
pub(super) fn unrolled(kc: usize, mut step: impl FnMut(usize)) {
    let whole = kc - kc % UNROLL;
    for kk in (0..whole).step_by(UNROLL) {
        for u in 0..UNROLL {
            step(kk + u);
        }
    }
    for kk in whole..kc {
        step(kk);
    }
}

/// `R` rows of `V` 16-lane f32 accumulators.
pub(super) type Acc<const R: usize, const V: usize> = [[__m512; V]; R];

/// f32 products over `kc` k-steps: `xs` is the tile's first activation row (rows `ldx`
/// apart, read directly: six rows of one k-block stay in L1), `ws` one packed panel.
///
/// # Safety
/// AVX-512F must be present; `t.rows` rows of `kc` floats at `xs`, `ldx` apart; `ws` holds
/// `kc * NR` floats; `t` describes a writable region (with `bias`, `cols` readable floats).
pub(super) unsafe fn tile_f32(kc: usize, xs: *const f32, ldx: usize, ws: *const f32, t: &Tile) {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { with_rows!(t.rows, R => rows_f32::<R, 4>(kc, xs, ldx, ws, t)) }
}

/// Like [`tile_f32`] from a panel `width` wide (16, 32, 48 or 64; `ws` holds `kc * width`):
/// attention's V when its head size is not a multiple of 64 (SD 1.x: 40 = one 48-wide panel).
///
/// # Safety
/// As for [`tile_f32`], with the narrower panel and `t.cols` ≤ `width`.
pub(super) unsafe fn tile_f32_width(
    width: usize,
    kc: usize,
    xs: *const f32,
    ldx: usize,
    ws: *const f32,
    t: &Tile,
) {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe {
        match width {
            16 => with_rows!(t.rows, R => rows_f32::<R, 1>(kc, xs, ldx, ws, t)),
            32 => with_rows!(t.rows, R => rows_f32::<R, 2>(kc, xs, ldx, ws, t)),
            48 => with_rows!(t.rows, R => rows_f32::<R, 3>(kc, xs, ldx, ws, t)),
            _ => with_rows!(t.rows, R => rows_f32::<R, 4>(kc, xs, ldx, ws, t)),
        }
    }
}

/// Tokens per call of [`tile_f32_column`].
pub(super) const COLUMN_ROWS: usize = 4 * MR;

/// Like [`tile_f32`] from a panel 16 wide, up to [`COLUMN_ROWS`] tokens at a time: one
/// vector per token leaves registers for 24, where six tokens a step would wait on their
/// loads (PixArt's head size 72 = a 64-wide panel and this one).
///
/// # Safety
/// As for [`tile_f32`], with `ws` holding `kc * 16` floats and `t.cols` ≤ 16.
pub(super) unsafe fn tile_f32_column(
    kc: usize,
    xs: *const f32,
    ldx: usize,
    ws: *const f32,
    t: &Tile,
) {
    let mut done = 0;
    while done < t.rows {
        let rows = match t.rows - done {
            24.. => 24,
            18.. => 18,
            12.. => 12,
            r => r.min(MR),
        };
        let sub = Tile {
            c: t.c.wrapping_add(done * t.ldc),
            ldc: t.ldc,
            rows,
            cols: t.cols,
            accumulate: t.accumulate,
            bias: t.bias,
            addend: match t.addend.is_null() {
                true => t.addend,
                false => t.addend.wrapping_add(done * t.ldc),
            },
        };
        let xs = xs.wrapping_add(done * ldx);
        // SAFETY: the caller's contract, for `rows` of its rows from `done` on.
        unsafe {
            match rows {
                24 => rows_f32::<24, 1>(kc, xs, ldx, ws, &sub),
                18 => rows_f32::<18, 1>(kc, xs, ldx, ws, &sub),
                12 => rows_f32::<12, 1>(kc, xs, ldx, ws, &sub),
                r => with_rows!(r, R => rows_f32::<R, 1>(kc, xs, ldx, ws, &sub)),
            }
        }
        done += rows;
    }
}

/// bf16 products over `kc2` k-pairs (`vdpbf16ps`: two products per lane per step); `xs`
/// rows hold activation k-pairs, `ldx` apart.
///
/// # Safety
/// AVX-512F and AVX-512 BF16 must be present; `t.rows` rows of `kc2` pairs at `xs`, `ldx`
/// apart; `ws` holds `kc2 * NR` pairs; `t` as for [`tile_f32`].
pub(super) unsafe fn tile_bf16(kc2: usize, xs: *const u32, ldx: usize, ws: *const u32, t: &Tile) {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { with_rows!(t.rows, R => rows_bf16::<R, 4>(kc2, xs, ldx, ws, t)) }
}

/// Like [`tile_bf16`] from a panel of pairs `width` wide (16, 32, 48 or 64; `ws` holds
/// `kc2 * width`): attention's V in bf16 when its head size is not a multiple of 64.
///
/// # Safety
/// As for [`tile_bf16`], with the narrower panel and `t.cols` ≤ `width`.
pub(super) unsafe fn tile_bf16_width(
    width: usize,
    kc2: usize,
    xs: *const u32,
    ldx: usize,
    ws: *const u32,
    t: &Tile,
) {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe {
        match width {
            16 => with_rows!(t.rows, R => rows_bf16::<R, 1>(kc2, xs, ldx, ws, t)),
            32 => with_rows!(t.rows, R => rows_bf16::<R, 2>(kc2, xs, ldx, ws, t)),
            48 => with_rows!(t.rows, R => rows_bf16::<R, 3>(kc2, xs, ldx, ws, t)),
            _ => with_rows!(t.rows, R => rows_bf16::<R, 4>(kc2, xs, ldx, ws, t)),
        }
    }
}

/// `R` rows × `V` vectors of f32 products; the panel is `16 * V` wide.
#[target_feature(enable = "avx512f")]
unsafe fn rows_f32<const R: usize, const V: usize>(
    kc: usize,
    xs: *const f32,
    ldx: usize,
    ws: *const f32,
    t: &Tile,
) {
    // SAFETY: prefetches never fault; the output lines arrive while the products run.
    unsafe { prefetch_output::<R>(t) };
    let mut acc: Acc<R, V> = [[_mm512_setzero_ps(); V]; R];
    // Each row's own pointer, indexed by k: no address arithmetic per step beyond the index.
    let x: [*const f32; R] = std::array::from_fn(|r| xs.wrapping_add(r * ldx));
    let step = |kk: usize| {
        // SAFETY: kk < kc and r < R = t.rows: inside the panel and the activation rows.
        unsafe {
            let w = ws.add(kk * 16 * V);
            // The panel's lines PREFETCH k-steps ahead: a few % on a Sapphire Rapids core,
            // where the L2 streamer trails the 256-byte rows; no change on Zen 4.
            for j in 0..V {
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(PREFETCH * 16 * V + 16 * j).cast());
            }
            let mut wv = [_mm512_setzero_ps(); V];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(w.add(16 * j));
            }
            for (a, x) in acc.iter_mut().zip(x) {
                let b = _mm512_set1_ps(*x.add(kk));
                for (aj, wj) in a.iter_mut().zip(wv) {
                    *aj = _mm512_fmadd_ps(wj, b, *aj);
                }
            }
        }
    };
    unrolled(kc, step);
    // SAFETY: the caller's contract on `t`.
    unsafe { store(&acc, t) }
}

/// `R` rows × `V` vectors of bf16 pair products; the panel is `16 * V` pairs wide.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows_bf16<const R: usize, const V: usize>(
    kc2: usize,
    xs: *const u32,
    ldx: usize,
    ws: *const u32,
    t: &Tile,
) {
    // SAFETY: prefetches never fault; the output lines arrive while the products run.
    unsafe { prefetch_output::<R>(t) };
    let mut acc: Acc<R, V> = [[_mm512_setzero_ps(); V]; R];
    for q in 0..kc2 {
        // SAFETY: q < kc2 and r < R = t.rows: inside the panel and the activation rows;
        // bf16 vectors are 64-byte bit patterns like the integer vectors loaded.
        unsafe {
            let w = ws.add(q * 16 * V);
            let mut wv = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); V];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    w.add(16 * j).cast(),
                ));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let b = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                    *xs.add(r * ldx + q) as i32,
                ));
                for (aj, wj) in a.iter_mut().zip(wv) {
                    *aj = _mm512_dpbf16_ps(*aj, wj, b);
                }
            }
        }
    }
    // SAFETY: the caller's contract on `t`.
    unsafe { store(&acc, t) }
}

/// Asks for the tile's output lines (to be read or written at the end) ahead of time: the
/// output is too large to stay cached between k-blocks.
#[inline(always)]
pub(super) unsafe fn prefetch_output<const R: usize>(t: &Tile) {
    for r in 0..R {
        for j in 0..t.cols.div_ceil(16) {
            let p = t.c.wrapping_add(r * t.ldc + j * 16);
            // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
        }
    }
}

/// The mask of the first `valid` (≤ 16) lanes of a 16-lane vector.
#[inline(always)]
pub(super) fn lanes16(valid: usize) -> __mmask16 {
    if valid >= 16 {
        0xffff
    } else {
        (1u16 << valid) - 1
    }
}

/// Adds the tile into (or writes it to) the output, masked to `t.cols`.
#[inline(always)]
pub(super) unsafe fn store<const R: usize, const V: usize>(acc: &Acc<R, V>, t: &Tile) {
    for j in 0..V {
        let valid = t.cols.saturating_sub(j * 16).min(16);
        if valid == 0 {
            break;
        }
        let mask = lanes16(valid);
        // SAFETY: masked accesses touch only the `valid` columns the caller owns.
        unsafe {
            let bias = (!t.bias.is_null()).then(|| _mm512_maskz_loadu_ps(mask, t.bias.add(j * 16)));
            for (r, a) in acc.iter().enumerate() {
                let p = t.c.add(r * t.ldc + j * 16);
                let mut v = a[j];
                if t.accumulate {
                    v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), v);
                } else if !t.addend.is_null() {
                    let a = t.addend.add(r * t.ldc + j * 16);
                    v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, a), v);
                }
                if let Some(b) = bias {
                    v = _mm512_add_ps(v, b);
                }
                _mm512_mask_storeu_ps(p, mask, v);
            }
        }
    }
}

/// e^x for x ≤ 0 (softmax after subtracting the row maximum): x = n·ln2 + r with
/// |r| ≤ ln2/2, e^r by its degree-7 Taylor polynomial (error < 1e-8 relative), scaled by 2^n.
/// Inputs below −87 (e^x < 2e−38, nothing next to the row's maximum of 1) give exactly 0.
#[inline(always)]
pub(super) unsafe fn exp_nonpositive(x: __m512) -> __m512 {
    // SAFETY: register-only arithmetic (the caller has AVX-512F).
    unsafe {
        let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP_MIN));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_TAYLOR[0]);
        for &c in &EXP_TAYLOR[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n))
    }
}

/// 2^x for x ≤ 0 (or a rounding above it): x = n + f with n the nearest integer, 2^f from
/// [`EXP2_POLY`] scaled by 2^n; below [`EXP2_MIN`] (and for −∞) exactly 0. Attention's
/// softmax folds its scale and log2 e into one FMA before it, so this is e^x's work less the
/// Cody–Waite split and a degree of the polynomial.
#[inline(always)]
pub(super) unsafe fn pow2_nonpositive(x: __m512) -> __m512 {
    // SAFETY: register-only arithmetic (the caller has AVX-512F).
    unsafe {
        let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP2_MIN));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let f = _mm512_sub_ps(x, n);
        let mut p = _mm512_set1_ps(EXP2_POLY[0]);
        for &c in &EXP2_POLY[1..] {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
        }
        _mm512_maskz_scalef_ps(keep, p, n)
    }
}

/// Transposes a 16 × 16 block of 32-bit words: row `i` is the 16 words at `src[i]`; column
/// `c` (word `c` of every row, in row order) is stored at `dst + c * dst_stride`.
///
/// # Safety
/// AVX-512F must be present; each `src[i]` has 16 readable words, and the 16 destinations 16
/// writable words.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose_16x16(src: &[*const u32; 16], dst: *mut u32, dst_stride: usize) {
    // SAFETY: the caller's contract on `src` and `dst`; the rest is register shuffling.
    unsafe {
        let mut r = [_mm512_setzero_si512(); 16];
        for (v, &p) in r.iter_mut().zip(src) {
            *v = _mm512_loadu_si512(p.cast());
        }
        // Within each 128-bit lane: pairs of rows interleaved by word, then by word pair, so
        // u[4g + e] holds word e of the lane for rows 4g..4g+4.
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        let mut u = [_mm512_setzero_si512(); 16];
        for g in 0..4 {
            let (a, b, c, d) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            u[4 * g] = _mm512_unpacklo_epi64(a, c);
            u[4 * g + 1] = _mm512_unpackhi_epi64(a, c);
            u[4 * g + 2] = _mm512_unpacklo_epi64(b, d);
            u[4 * g + 3] = _mm512_unpackhi_epi64(b, d);
        }
        // Gather lane L of the four row groups: column 4L + e.
        for e in 0..4 {
            let v = _mm512_shuffle_i32x4::<0x88>(u[e], u[4 + e]);
            let w = _mm512_shuffle_i32x4::<0xdd>(u[e], u[4 + e]);
            let v2 = _mm512_shuffle_i32x4::<0x88>(u[8 + e], u[12 + e]);
            let w2 = _mm512_shuffle_i32x4::<0xdd>(u[8 + e], u[12 + e]);
            let cols = [
                _mm512_shuffle_i32x4::<0x88>(v, v2),
                _mm512_shuffle_i32x4::<0x88>(w, w2),
                _mm512_shuffle_i32x4::<0xdd>(v, v2),
                _mm512_shuffle_i32x4::<0xdd>(w, w2),
            ];
            for (lane, col) in cols.into_iter().enumerate() {
                _mm512_storeu_si512(dst.add((4 * lane + e) * dst_stride).cast(), col);
            }
        }
    }
}
