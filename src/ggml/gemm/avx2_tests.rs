//! The AVX2 tiles and rows called directly, whatever `SD_CLI_CPU` says, so that a machine with
//! AVX-512 (whose products never take them) still checks them: against f64 references of the
//! same operands, over partial strips, partial rows and every panel width.

use super::avx2::{tile_f32_strips, STRIP};
use super::avx2_rows::{affine_row, geglu_row, gelu_tanh_row};
use super::fused_tests::erf_series;
use super::kernels::Tile;
use super::norm::Affine;
use super::pack::panel_at;
use super::tests::pseudo_random;
use super::{MR, NR};

fn have_avx2() -> bool {
    let ok = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    if !ok {
        eprintln!("this CPU lacks AVX2 + FMA; skipped");
    }
    ok
}

/// A `rows` × `cols` tile over `c` (rows `ldc` apart) in store mode `mode`: 0 writes, 1 adds
/// to what `c` holds, 2 adds `bias`, 3 adds `addend` (laid out like `c`).
pub(super) fn mode_tile(
    c: &mut [f32],
    (ldc, rows, cols): (usize, usize, usize),
    mode: usize,
    bias: &[f32],
    addend: &[f32],
) -> Tile {
    let pick = |on: bool, p: &[f32]| if on { p.as_ptr() } else { std::ptr::null() };
    Tile {
        c: c.as_mut_ptr(),
        ldc,
        rows,
        cols,
        accumulate: mode == 1,
        bias: pick(mode == 2, bias),
        addend: pick(mode == 3, addend),
    }
}

/// `rows` × `cols` tiles from a panel `width` wide in 16-output strips over `kc` steps, in each of the store
/// modes (write, accumulate, bias, addend), against f64.
#[test]
fn avx2_tiles_match_f64() {
    if !have_avx2() {
        return;
    }
    let kc = 37;
    for width in [16, 32, 48, NR] {
        for rows in 1..=MR {
            for cols in [1, 7, 8, 9, 15, 16, 17, width - 1, width] {
                if cols > width {
                    continue;
                }
                let ldx = kc + 3;
                let x = pseudo_random(rows * ldx, (width + rows) as u64);
                let w = pseudo_random(kc * width, (7 + cols) as u64);
                // The panel as the AVX2 tiles read it: 16-output strips, each k-major.
                let mut strips = vec![0f32; kc * width];
                for (i, &v) in w.iter().enumerate() {
                    strips[panel_at(kc, STRIP, i / width, i % width)] = v;
                }
                let bias = pseudo_random(cols, 3);
                let ldc = cols + 5;
                let start = pseudo_random(rows * ldc, 11);
                for mode in 0..4 {
                    let mut c = start.clone();
                    let tile = mode_tile(&mut c, (ldc, rows, cols), mode, &bias, &start);
                    let (xs, ws) = (x.as_ptr(), strips.as_ptr());
                    // SAFETY: AVX2 + FMA checked; `rows` rows of `kc` floats `ldx` apart, a
                    // panel of `kc * width` in strips, an output of `rows` rows `ldc` apart.
                    unsafe { tile_f32_strips(kc, xs, ldx, ws, kc * STRIP, &tile) };
                    for r in 0..rows {
                        for j in 0..ldc {
                            let got = c[r * ldc + j];
                            if j >= cols {
                                assert_eq!(got, start[r * ldc + j], "column {j} past the tile");
                                continue;
                            }
                            let mut want: f64 = (0..kc)
                                .map(|k| x[r * ldx + k] as f64 * w[k * width + j] as f64)
                                .sum();
                            if mode == 1 || mode == 3 {
                                want += start[r * ldc + j] as f64;
                            }
                            if mode == 2 {
                                want += bias[j] as f64;
                            }
                            assert!(
                                (got as f64 - want).abs() < 1e-5,
                                "width {width} rows {rows} cols {cols} mode {mode}: [{r}][{j}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// GEGLU rows (value · GELU(gate), erf form) against f64.
#[test]
fn avx2_geglu_matches_f64() {
    if !have_avx2() {
        return;
    }
    for half in [1, 8, 13, 45] {
        let x: Vec<f32> = pseudo_random(2 * half, half as u64)
            .iter()
            .map(|v| v * 8.0)
            .collect();
        let mut out = vec![0f32; half];
        // SAFETY: AVX2 + FMA checked; the row holds `2 · half` floats, the output `half`.
        unsafe { geglu_row(x.as_ptr(), out.as_mut_ptr(), half) };
        for j in 0..half {
            let g = x[half + j] as f64;
            let want = x[j] as f64 * 0.5 * g * (1.0 + erf_series(g / std::f64::consts::SQRT_2));
            assert!(
                (out[j] as f64 - want).abs() < 2e-6 * (1.0 + want.abs()),
                "half {half}: y[{j}] = {}, want {want}",
                out[j]
            );
        }
    }
}

/// PyTorch's tanh GELU in f64.
pub(super) fn gelu_tanh_f64(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

/// Inputs for the GELU checks: a spread over ±12, zeros, tails where the sigmoid saturates.
pub(super) fn gelu_inputs(n: usize) -> Vec<f32> {
    let mut x: Vec<f32> = pseudo_random(n, 77).iter().map(|v| v * 12.0).collect();
    x.extend([
        0.0,
        -0.0,
        1e-20,
        -1e-20,
        30.0,
        -30.0,
        1e20,
        -1e20,
        f32::MAX,
        -f32::MAX,
    ]);
    x
}

/// Checks GELU results against f64: relative to |x| (the sigmoid's rounding scaled by x).
pub(super) fn check_gelu(x: &[f32], y: &[f32]) {
    for (&v, &got) in x.iter().zip(y) {
        let want = gelu_tanh_f64(v as f64);
        let err = (got as f64 - want).abs();
        assert!(
            err <= 4e-7 * (v as f64).abs() || (want.is_infinite() && got as f64 == want),
            "gelu_tanh({v}) = {got}, want {want}"
        );
    }
}

/// tanh-GELU rows against f64, every tail length, and NaN kept.
#[test]
fn avx2_gelu_tanh_matches_f64() {
    if !have_avx2() {
        return;
    }
    let x = gelu_inputs(61);
    let mut y = vec![0f32; x.len()];
    // SAFETY: AVX2 + FMA checked; both hold x.len() floats.
    unsafe { gelu_tanh_row(x.as_ptr(), y.as_mut_ptr(), x.len()) };
    check_gelu(&x, &y);
    let nan = [f32::NAN; 3];
    let mut y = [0f32; 3];
    // SAFETY: as above, 3 floats.
    unsafe { gelu_tanh_row(nan.as_ptr(), y.as_mut_ptr(), 3) };
    assert!(y.iter().all(|v| v.is_nan()));
}

/// Norm rows: scalar and per-column affine, with and without SiLU, against f64.
#[test]
fn avx2_affine_rows_match_f64() {
    if !have_avx2() {
        return;
    }
    for n in [3, 8, 21] {
        let x: Vec<f32> = pseudo_random(n, n as u64).iter().map(|v| v * 6.0).collect();
        let w = pseudo_random(n, 5);
        let b = pseudo_random(n, 6);
        let (mean, scale) = (0.25f32, 1.7f32);
        for (affine, silu) in [
            (Affine::Scalar(0.8, -0.3), true),
            (Affine::Scalar(1.2, 0.1), false),
            (Affine::Vectors(Some(&w), Some(&b)), false),
            (Affine::Vectors(None, Some(&b)), true),
        ] {
            let mut out = vec![0f32; n];
            // SAFETY: AVX2 + FMA checked; the output and the vectors hold `n` floats.
            unsafe { affine_row(&x, out.as_mut_ptr(), (mean, scale), affine, silu) };
            for j in 0..n {
                let mut y = (x[j] as f64 - mean as f64) * scale as f64;
                y = match affine {
                    Affine::Scalar(sw, sb) => y * sw as f64 + sb as f64,
                    Affine::Vectors(vw, vb) => {
                        y * vw.map_or(1.0, |v| v[j] as f64) + vb.map_or(0.0, |v| v[j] as f64)
                    }
                };
                if silu {
                    y /= 1.0 + (-y).exp();
                }
                assert!(
                    (out[j] as f64 - y).abs() < 1e-5 * (1.0 + y.abs()),
                    "n {n} silu {silu}: y[{j}] = {}, want {y}",
                    out[j]
                );
            }
        }
    }
}
