//! AMX tiles for bf16 products (Sapphire Rapids and later Xeons): `tdpbf16ps` multiplies a
//! 16-token × 16-pair tile of activations by a 16-pair × 16-output tile of weights into a
//! 16 × 16 f32 tile, 8192 products per instruction where `vdpbf16ps` does 32.
//!
//! The operands are the ones the AVX-512 BF16 tiles read: packed activation rows of k-pairs
//! (`pack::rows_bf16`, row `ldx` words apart) and weight panels of [`NR`] outputs by k-pair
//! (`pack::panels_bf16`, a pair row is 256 bytes). A tile register of weights is then 16 pair
//! rows × 16 outputs read 256 bytes apart straight from the panel, and one of activations 16
//! rows × 16 pairs: no repacking. Each call covers [`AMX_ROWS`] tokens × one panel; the
//! accumulators go through a stack buffer into the output with the same bias / addend /
//! accumulate rules as the vector tiles.
//!
//! Linux hands out the 8 KiB of tile state only on request (`arch_prctl`), once per process.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::kernels::Tile;
use super::NR;

/// Tokens per AMX call: two 16-row activation tiles.
pub(super) const AMX_ROWS: usize = 32;
/// k-pairs per tile step: a 64-byte tile row.
const STEP: usize = 16;

/// Whether this process may run AMX-BF16 (CPUID says the CPU has it, and Linux granted the
/// tile data state). Asked once; the kernel choice also honours `SD_CLI_CPU`.
pub(crate) fn amx_bf16_granted() -> bool {
    cpuid_leaf7_edx() & (1 << 22) != 0 && tile_state_granted()
}

/// CPUID leaf 7's EDX: bit 22 AMX-BF16, 24 AMX-TILE.
fn cpuid_leaf7_edx() -> u32 {
    if __cpuid(0).eax >= 7 {
        __cpuid_count(7, 0).edx
    } else {
        0
    }
}

/// AMX-TILE is there and Linux granted this process the tile data state (asked once).
fn tile_state_granted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| cpuid_leaf7_edx() & (1 << 24) != 0 && request_tile_state())
}

#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, 18)` takes two integers and touches no memory
    // of ours; a kernel without AMX support answers an error.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// The tile configuration `ldtilecfg` reads (palette 1): every register 16 rows × 64 bytes.
/// tmm0–3 accumulate (2 × 2 tiles of 16 × 16 f32), tmm4–5 hold activations, tmm6–7 weights.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

static CONFIG: Config = Config {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// The f32 results of one call, [`AMX_ROWS`] × [`NR`], row-major.
#[repr(C, align(64))]
struct Results([[f32; NR]; AMX_ROWS]);

/// bf16 products of up to [`AMX_ROWS`] tokens × one panel over `depth` k-pairs: `xs` holds
/// [`AMX_ROWS`] packed rows `ldx` words apart (rows past `t.rows` are read and ignored), `ws`
/// one panel of `depth` pair rows `width` words wide (16, 32, 48 or 64: attention's V panels
/// may be narrower than [`NR`]).
///
/// # Safety
/// [`amx_bf16_granted`] answered true, and the CPU has AVX-512F and AVX-512 BF16 (every AMX
/// CPU does); `xs` has [`AMX_ROWS`] readable rows of `depth` words, `ldx` apart; `ws` holds
/// `depth * width` words and, where `width` is 16 or 48, 16 more readable ones (the last
/// 32-output half reads a 16-wide tile past the panel's columns; those outputs are dropped);
/// `t.rows` ≤ [`AMX_ROWS`], `t.cols` ≤ `width`, `t` as for the vector tiles.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn tile_bf16(
    width: usize,
    depth: usize,
    xs: *const u32,
    ldx: usize,
    ws: *const u32,
    t: &Tile,
) {
    let mut out = Results([[0.0; NR]; AMX_ROWS]);
    let steps = depth / STEP;
    if steps > 0 {
        let halves = t.cols.div_ceil(32);
        // SAFETY: AMX is granted (the contract) and the configuration is a valid palette-1
        // layout. Each activation load reads 16 rows of 64 bytes inside `xs`'s rows (pairs
        // q..q + 16 ≤ depth), each weight load 16 pair rows × 16 outputs of the panel (the
        // slack the contract names covers a narrow panel's last half); the stores write 2 × 2
        // tiles of 16 × 16 f32 inside `out` (rows of 64 floats, 256 bytes; the second half
        // starts 32 floats in). One block from configuration to release, so no tile state
        // outlives it.
        unsafe {
            asm!(
                "ldtilecfg [rip + {cfg}]",
                "2:",
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "mov {x0}, {xs}",
                "lea {x1}, [{xs} + {xst}*8]",
                "lea {x1}, [{x1} + {xst}*8]",
                "mov {w}, {ws}",
                "mov {n}, {steps}",
                "3:",
                "tileloadd tmm4, [{x0} + {xst}*1]",
                "tileloadd tmm6, [{w} + {row}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{w} + {row}*1 + 64]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{x1} + {xst}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {x0}, 64",
                "add {x1}, 64",
                "lea {w}, [{w} + {row}*8]",
                "lea {w}, [{w} + {row}*8]",
                "dec {n}",
                "jnz 3b",
                "tilestored [{o} + {ost}*1], tmm0",
                "tilestored [{o} + {ost}*1 + 64], tmm1",
                "tilestored [{o} + {ost}*1 + 4096], tmm2",
                "tilestored [{o} + {ost}*1 + 4160], tmm3",
                "add {ws}, 128",
                "add {o}, 128",
                "dec {halves}",
                "jnz 2b",
                "tilerelease",
                cfg = sym CONFIG,
                n = out(reg) _,
                xs = in(reg) xs,
                xst = in(reg) ldx * 4,
                ws = inout(reg) ws => _,
                o = inout(reg) out.0.as_mut_ptr() => _,
                ost = in(reg) NR * 4,
                halves = inout(reg) halves => _,
                steps = in(reg) steps,
                row = in(reg) width * 4,
                x0 = out(reg) _,
                x1 = out(reg) _,
                w = out(reg) _,
                options(nostack)
            );
        }
    }
    // SAFETY: the contract on `xs`, `ws` and `t`.
    unsafe {
        tail_pairs(width, steps * STEP..depth, xs, ldx, ws, t, &mut out);
        write(&out, t);
    }
}

/// The k-pairs after the last whole tile step (`depth` not a multiple of 16), through
/// `vdpbf16ps` into the results.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tail_pairs(
    width: usize,
    pairs: std::ops::Range<usize>,
    xs: *const u32,
    ldx: usize,
    ws: *const u32,
    t: &Tile,
    out: &mut Results,
) {
    if pairs.is_empty() {
        return;
    }
    for (r, row) in out.0.iter_mut().enumerate().take(t.rows) {
        for j in 0..t.cols.div_ceil(16) {
            // SAFETY: r < t.rows and q < depth: inside the rows and the panel (16 j <
            // t.cols ≤ width); `row` has NR floats, j < 4.
            unsafe {
                let mut acc = _mm512_loadu_ps(row.as_ptr().add(16 * j));
                for q in pairs.clone() {
                    let w = _mm512_loadu_si512(ws.add(q * width + 16 * j).cast());
                    let x = _mm512_set1_epi32(*xs.add(r * ldx + q) as i32);
                    acc = _mm512_dpbf16_ps(
                        acc,
                        std::mem::transmute::<__m512i, __m512bh>(w),
                        std::mem::transmute::<__m512i, __m512bh>(x),
                    );
                }
                _mm512_storeu_ps(row.as_mut_ptr().add(16 * j), acc);
            }
        }
    }
}

/// Adds the first `t.rows` rows of results into (or writes them to) the output, masked to
/// `t.cols`.
///
/// # Safety
/// AVX-512F must be present; `t` as for the vector tiles, with `t.rows` ≤ [`AMX_ROWS`] and
/// `t.cols` ≤ [`NR`].
#[target_feature(enable = "avx512f")]
unsafe fn write(out: &Results, t: &Tile) {
    for j in 0..t.cols.div_ceil(16) {
        let valid = (t.cols - 16 * j).min(16);
        let mask = super::kernels::lanes16(valid);
        // SAFETY: masked accesses touch only the `valid` columns of the caller's rows; the
        // results row holds NR ≥ 16 j + 16 floats.
        unsafe {
            let bias = (!t.bias.is_null()).then(|| _mm512_maskz_loadu_ps(mask, t.bias.add(16 * j)));
            for r in 0..t.rows {
                let p = t.c.add(r * t.ldc + 16 * j);
                let mut v = _mm512_loadu_ps(out.0[r].as_ptr().add(16 * j));
                if t.accumulate {
                    v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), v);
                } else if !t.addend.is_null() {
                    let a = t.addend.add(r * t.ldc + 16 * j);
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

#[cfg(test)]
mod tests {
    use super::super::kernels::Tile;
    use super::super::pack::bf16_bits;
    use super::super::NR;
    use super::{amx_bf16_granted, tile_bf16, AMX_ROWS};

    fn bf16(bits: u32) -> f64 {
        f32::from_bits(bits << 16) as f64
    }

    /// AMX results against f64 sums of the same bf16 pairs, for whole and partial tiles, k
    /// tails, narrow panels, and each way a tile meets the output (fresh with bias, onto an
    /// addend, added).
    #[test]
    fn amx_tiles_match_f64_sums_of_their_pairs() {
        if !amx_bf16_granted() || !std::arch::is_x86_feature_detected!("avx512bf16") {
            eprintln!("no AMX-BF16 here (or not granted); skipped");
            return;
        }
        let mut seed = 0x2545_f491_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let cases = [
            (64, 32, 64, 576),
            (64, 1, 5, 7),
            (64, 17, 40, 37),
            (64, 32, 32, 16),
            (64, 20, 64, 48),
            (16, 32, 8, 128),
            (48, 19, 40, 36),
            (32, 32, 32, 100),
        ];
        for (width, rows, cols, depth) in cases {
            let pair = |n: &mut dyn FnMut() -> f32| bf16_bits(n()) | (bf16_bits(n()) << 16);
            let ldx = depth + 3;
            let xs: Vec<u32> = (0..AMX_ROWS * ldx).map(|_| pair(&mut next)).collect();
            // 16 words of slack past the panel, as the contract asks of narrow panels.
            let ws: Vec<u32> = (0..depth * width + 16).map(|_| pair(&mut next)).collect();
            let bias: Vec<f32> = (0..NR).map(|_| next()).collect();
            let start: Vec<f32> = (0..rows * NR).map(|_| next()).collect();
            for mode in 0..3 {
                let mut c = start.clone();
                let tile = Tile {
                    c: c.as_mut_ptr(),
                    ldc: NR,
                    rows,
                    cols,
                    accumulate: mode == 2,
                    bias: if mode == 0 {
                        bias.as_ptr()
                    } else {
                        std::ptr::null()
                    },
                    addend: if mode == 1 {
                        start.as_ptr()
                    } else {
                        std::ptr::null()
                    },
                };
                // SAFETY: AMX and AVX-512 BF16 checked above; 32 rows of `depth` pairs
                // `ldx` apart, a panel with its slack, and a `rows` × NR output.
                unsafe { tile_bf16(width, depth, xs.as_ptr(), ldx, ws.as_ptr(), &tile) };
                for r in 0..rows {
                    for o in 0..NR {
                        let got = c[r * NR + o] as f64;
                        if o >= cols {
                            assert_eq!(
                                got,
                                start[r * NR + o] as f64,
                                "column {o} past {cols} written"
                            );
                            continue;
                        }
                        let (mut sum, mut mag) = (0f64, 0f64);
                        for q in 0..depth {
                            let (x, w) = (xs[r * ldx + q], ws[q * width + o]);
                            for (a, b) in [(x & 0xffff, w & 0xffff), (x >> 16, w >> 16)] {
                                sum += bf16(a) * bf16(b);
                                mag += (bf16(a) * bf16(b)).abs();
                            }
                        }
                        let base = match mode {
                            0 => bias[o] as f64,
                            _ => start[r * NR + o] as f64,
                        };
                        let err = (got - sum - base).abs() / (mag + base.abs());
                        assert!(
                            err < 1e-5,
                            "width {width} rows {rows} cols {cols} depth {depth} mode {mode}: [{r}][{o}] = {got}, reference {} ({err:.2e})",
                            sum + base
                        );
                    }
                }
            }
        }
    }
}
