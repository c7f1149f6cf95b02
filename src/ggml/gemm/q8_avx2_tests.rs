//! The 256-bit VNNI q8_0 kernel called directly (whatever `SD_CLI_CPU` says), against a scalar
//! model of its arithmetic: the integer sums are exact, and each block's sum is converted,
//! scaled and added with the same f32 operations, so the results must agree bit for bit.

use super::avx2_tests::mode_tile;
use super::q8::{pack_panels, quantize_rows, quantize_rows_on, BLOCK_BYTES, NR8, QK};
use super::q8_avx2::tile;
use super::tests::pseudo_random;
use super::MR;
use crate::cpu_info::{vnni256, Vnni256};

/// `m` rows of `nb` ggml q8_0 blocks: f16 scales and bytes in −127..=127.
fn q8_rows(m: usize, nb: usize, seed: u64) -> Vec<u8> {
    let v = pseudo_random(m * nb * (QK + 1), seed);
    let mut out = Vec::with_capacity(m * nb * BLOCK_BYTES);
    for block in v.chunks_exact(QK + 1) {
        let d = half::f16::from_f32(0.01 + block[0].abs() * 0.02);
        out.extend_from_slice(&d.to_le_bytes());
        out.extend(block[1..].iter().map(|x| ((x * 254.0).round() as i8) as u8));
    }
    out
}

/// The kernel's arithmetic in scalar f32: per block the exact integer sum, converted, times
/// (weight scale × activation scale), fused into the accumulator; then the store's adds.
#[allow(clippy::too_many_arguments)]
fn model(
    w: &[u8],
    nb: usize,
    xq: &[u32],
    xd: &[f32],
    (r, j): (usize, usize),
    start: f32,
    mode: usize,
    bias: f32,
) -> f32 {
    let row = &w[j * nb * BLOCK_BYTES..];
    let mut acc = 0f32;
    for b in 0..nb {
        let blk = &row[b * BLOCK_BYTES..];
        let dw = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let isum: i32 = (0..QK)
            .map(|i| {
                let x = (xq[r * nb * 8 + b * 8 + i / 4] >> (8 * (i % 4))) as u8 as i32 - 128;
                x * blk[2 + i] as i8 as i32
            })
            .sum();
        acc = (isum as f32).mul_add(dw * xd[r * nb + b], acc);
    }
    let mut v = acc;
    if mode == 1 || mode == 3 {
        v += start;
    }
    if mode == 2 {
        v += bias;
    }
    v
}

#[test]
fn vnni256_q8_tiles_match_their_scalar_model() {
    let Some(vnni) = vnni256() else {
        eprintln!(
            "this CPU has neither AVX-VNNI nor AVX-512 VNNI + VL (or SD_CLI_CPU caps it); skipped"
        );
        return;
    };
    if vnni == Vnni256::Evex {
        eprintln!("running the EVEX twin of the AVX-VNNI kernel");
    }
    let nb = 3;
    let k = nb * QK;
    for rows in 1..=MR {
        for cols in [1, 5, 8, 9, 16, 17, 31, NR8] {
            let w = q8_rows(cols, nb, (rows * 40 + cols) as u64);
            let mut panel = vec![0u32; nb * super::q8::PANEL_BLOCK_WORDS];
            pack_panels(&w, k, 0..cols, 0, nb, &mut panel);
            let x = pseudo_random(rows * k, (rows + 7 * cols) as u64);
            let (mut xq, mut xd) = (vec![0u32; rows * nb * 8], vec![0f32; rows * nb]);
            let xr = super::pack::Rows { data: &x, k };
            quantize_rows(&xr, 0..rows, 0, nb, &mut xq, &mut xd);
            let bias = pseudo_random(cols, 3);
            let ldc = cols + 3;
            let start = pseudo_random(rows * ldc, 5);
            for mode in 0..4 {
                let mut c = start.clone();
                let t = mode_tile(&mut c, (ldc, rows, cols), mode, &bias, &start);
                // SAFETY: `vnni256` found the encoding's instructions (and AVX2 + FMA, which
                // every such CPU has); the operands are sized as `q8::tile` requires.
                unsafe {
                    tile(
                        vnni,
                        nb,
                        xq.as_ptr(),
                        nb * 8,
                        xd.as_ptr(),
                        nb,
                        panel.as_ptr(),
                        &t,
                    )
                };
                for r in 0..rows {
                    for j in 0..ldc {
                        let got = c[r * ldc + j];
                        let first = start[r * ldc + j];
                        if j >= cols {
                            assert_eq!(got, first, "column {j} past the tile");
                            continue;
                        }
                        let want = model(&w, nb, &xq, &xd, (r, j), first, mode, bias[j]);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "rows {rows} cols {cols} mode {mode}: c[{r}][{j}] = {got}, model {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Activations quantized on either vector width this CPU can run (whatever `SD_CLI_CPU`
/// says) match the scalar loop bit for bit: scales, and quants where a product lands exactly
/// half-way (127 · 0.5 / 127 blocks), on zeros and on a block of zeros.
#[test]
fn quantized_activations_match_the_scalar_loop() {
    use super::pack::Rows;
    use super::Tiles;
    let (rows, nb) = (5, 4);
    let k = nb * QK;
    let mut x: Vec<f32> = pseudo_random(rows * k, 17)
        .iter()
        .map(|v| v * 6.0)
        .collect();
    // Row 1: block 0 all zeros; block 1 with amax 127 and halves (ties to even).
    x[k..k + QK].fill(0.0);
    for (j, v) in x[k + QK..k + 2 * QK].iter_mut().enumerate() {
        *v = if j == 0 { 127.0 } else { j as f32 - 15.5 };
    }
    let xr = Rows { data: &x, k };
    let run = |tiles: Option<Tiles>| {
        let (mut q, mut d) = (vec![0u32; rows * nb * 8], vec![0f32; rows * nb]);
        // SAFETY: `None` or a width `runnable_tiles` found on this CPU.
        unsafe { quantize_rows_on(tiles, &xr, 0..rows, 0, nb, &mut q, &mut d) };
        (q, d)
    };
    let scalar = run(None);
    for tiles in super::tests::runnable_tiles() {
        let vector = run(Some(tiles));
        assert_eq!(vector.1, scalar.1, "{tiles:?}: scales");
        assert_eq!(vector.0, scalar.0, "{tiles:?}: quants");
    }
}
