//! The blocked kernels against an f64 product of the same (rounded) operands, and against
//! ggml's `mul_mat`, over shapes that exercise every edge: partial strips, partial panels,
//! several weight chunks and k-blocks, odd k, batch dimensions, bias, thread splits.

use super::driver::Grid;
use super::pack::bf16_bits;
use super::{blocked_gemm_available, MR, NR};
use crate::dtype::DType;
use crate::ggml::{dequantize_rows, quantize_rows, Arena, Backend, Context, Gallocr, Graph};

/// The register widths this CPU can run, whatever `SD_CLI_CPU` says (tests that call a
/// width's kernels directly).
pub(super) fn runnable_tiles() -> Vec<super::Tiles> {
    let mut tiles = Vec::new();
    if is_x86_feature_detected!("avx512f") {
        tiles.push(super::Tiles::Avx512);
    }
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        tiles.push(super::Tiles::Avx2);
    }
    tiles
}

pub(super) fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

pub(super) fn to_bytes(values: &[f32], ty: DType, k: usize) -> Vec<u8> {
    match ty {
        DType::Q8_0 => quantize_rows(ty, values, k).expect("quantize"),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| (bf16_bits(v) as u16).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// What the weight's stored elements are, as f32 (for q8_0: the activations too, which
/// ggml and the blocked kernel quantize the same way).
fn stored(values: &[f32], ty: DType, k: usize) -> Vec<f32> {
    match ty {
        DType::Q8_0 => dequantize_rows(ty, &to_bytes(values, ty, k), k).expect("dequantize"),
        DType::F16 => values
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect(),
        DType::BF16 => values.iter().map(|&v| bf16_value(v)).collect(),
        _ => values.to_vec(),
    }
}

fn bf16_value(v: f32) -> f32 {
    f32::from_bits(bf16_bits(v) << 16)
}

/// One product's outputs and operands.
struct Outcome {
    blocked: Vec<f32>,
    plain: Vec<f32>,
    /// The weight as stored (rounded to its type), the activations, the bias.
    w: Vec<f32>,
    x: Vec<f32>,
    b: Option<Vec<f32>>,
}

/// The blocked kernels' and `mul_mat` (+ `add`)'s outputs for one product.
fn run(ty: DType, k: usize, m: usize, xne: [usize; 3], bias: bool, threads: usize) -> Outcome {
    let n: usize = xne.iter().product();
    let w = pseudo_random(k * m, 1 + k as u64);
    let x = pseudo_random(k * n, 2 + m as u64);
    let b = pseudo_random(m, 3);
    let backend = Backend::cpu(threads).expect("cpu backend");
    let arena = Arena::new(3).expect("arena");
    let wi = arena.add(ty, [k, m, 1, 1], "w").expect("room");
    let xi = arena
        .add(DType::F32, [k, xne[0], xne[1], xne[2]], "x")
        .expect("room");
    let bi = arena.add(DType::F32, [m, 1, 1, 1], "b").expect("room");
    arena.allocate(&backend, "test").expect("alloc");
    arena.get(wi).write_bytes(&to_bytes(&w, ty, k)).expect("w");
    arena.get(xi).write_f32(&x).expect("x");
    arena.get(bi).write_f32(&b).expect("b");

    let ctx = Context::new(8, 8).expect("ctx");
    let graph = Graph::new(&ctx, 8);
    let (wt, xt, bt) = (arena.get(wi), arena.get(xi), arena.get(bi));
    let kernels = backend
        .cpu_kernels()
        .expect("a CPU with the blocked kernels");
    let blocked = kernels
        .linear(&ctx, wt, xt, bias.then_some(bt))
        .expect("this product is one the blocked kernels take");
    assert_eq!(blocked.ne(), [m, xne[0], xne[1], xne[2]]);
    let plain = ctx.mul_mat(wt, xt);
    let plain = if bias { ctx.add(plain, bt) } else { plain };
    assert_eq!(
        super::BlockedOp::of(blocked),
        Some(super::BlockedOp::Linear)
    );
    assert_eq!(super::BlockedOp::of(plain), None);
    graph.expand(blocked);
    graph.expand(plain);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc graph");
    backend.compute(&graph).expect("compute");
    let first = blocked.read_f32().expect("read");
    // A second evaluation of the same graph (a sampler's next step) must hand out every
    // piece again: the op's claim counters are back at zero.
    blocked
        .write_f32(&vec![f32::NAN; first.len()])
        .expect("clear");
    backend.compute(&graph).expect("compute again");
    let again = blocked.read_f32().expect("read");
    assert!(
        first
            .iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{} k={k} m={m} threads={threads}: the second evaluation differs",
        ty.name()
    );
    Outcome {
        blocked: first,
        plain: plain.read_f32().expect("read"),
        w: stored(&w, ty, k),
        x,
        b: bias.then_some(b),
    }
}

/// Activations as ggml's CPU backend quantizes them for a q8_0 product (its AVX path: scale
/// max|x| / 127 stored as f16, values rounded half to even; ggml's reference quantizer, used
/// for weights, rounds half away from zero), dequantized.
fn quantized_activations(x: &[f32]) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|block| {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = half::f16::from_f32(amax / 127.0).to_f32();
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            block.iter().map(move |&v| (v * id).round_ties_even() * d)
        })
        .collect()
}

/// Checks one product; returns the largest error relative to Σ|x·w| of its element.
fn check(ty: DType, k: usize, m: usize, xne: [usize; 3], bias: bool, threads: usize) -> f64 {
    let Outcome {
        blocked,
        plain,
        w,
        x,
        b,
    } = run(ty, k, m, xne, bias, threads);
    let n: usize = xne.iter().product();
    // q8_0 products quantize the activations only where they run as VNNI integer products;
    // widened (CPUs without AVX-512 VNNI) they stay f32.
    let q8_integer = ty == DType::Q8_0 && super::q8_native();
    let xq = q8_integer.then(|| quantized_activations(&x));
    // bf16 products round the activations to bf16 only where they run as bf16 pairs; widened
    // (CPUs without AVX-512 BF16, or `SD_CLI_CPU=avx512`) they stay f32.
    let pairs = super::bf16_native();
    let mut worst = 0f64;
    for t in 0..n {
        for o in 0..m {
            let (mut sum, mut mag) = (0f64, 0f64);
            for i in 0..k {
                let xv = match (&xq, ty) {
                    (Some(q), _) => q[t * k + i],
                    (None, DType::BF16) if pairs => bf16_value(x[t * k + i]),
                    _ => x[t * k + i],
                };
                let p = xv as f64 * w[o * k + i] as f64;
                sum += p;
                mag += p.abs();
            }
            if let Some(b) = &b {
                sum += b[o] as f64;
                mag += (b[o] as f64).abs();
            }
            let got = blocked[t * m + o] as f64;
            let err = (got - sum).abs() / mag.max(1e-30);
            assert!(
                err < 1e-5,
                "{} k={k} m={m} x={xne:?} bias={bias} threads={threads}: y[{t}][{o}] = {got}, reference {sum} (relative error {err:.2e})",
                ty.name()
            );
            worst = worst.max(err);
            let rounds_like_ggml = match ty {
                DType::F16 => false,
                DType::BF16 => pairs,
                DType::Q8_0 => q8_integer,
                _ => true,
            };
            if rounds_like_ggml {
                // ggml rounds f16, bf16 and q8_0 products' activations; where ours round them
                // the same way, the two agree closely.
                let theirs = plain[t * m + o] as f64;
                assert!(
                    (theirs - got).abs() / mag.max(1e-30) < 2e-5,
                    "{} k={k} m={m}: blocked {got} vs mul_mat {theirs}",
                    ty.name()
                );
            }
        }
    }
    worst
}

type Shape = (usize, usize, [usize; 3]);

const SHAPES: &[Shape] = &[
    // One partial panel, one partial strip, odd k.
    (7, 70, [17, 1, 1]),
    // Two k-blocks, two weight chunks, batch dimensions.
    (390, 300, [20, 3, 1]),
    // Three k-blocks, partial last panel, strips across a batch boundary.
    (1000, 200, [23, 2, 1]),
    // More outputs than tokens (the other split), a 4-D batch.
    (64, 520, [16, 1, 2]),
    // More rows per thread than one packing chunk (3072).
    (64, 70, [6200, 1, 1]),
];

/// q8_0 rows are whole 32-blocks: one block; three k-blocks (800, 800, 736); two weight
/// chunks; the other split; several packing chunks.
const Q8_SHAPES: &[Shape] = &[
    (32, 70, [17, 1, 1]),
    (2336, 300, [20, 3, 1]),
    (96, 200, [23, 2, 1]),
    (64, 520, [16, 1, 2]),
    (64, 70, [6200, 1, 1]),
];

fn shapes(ty: DType) -> &'static [Shape] {
    if ty == DType::Q8_0 {
        Q8_SHAPES
    } else {
        SHAPES
    }
}

fn each_type(f: impl Fn(DType)) {
    for ty in [DType::F32, DType::F16, DType::BF16, DType::Q8_0] {
        if blocked_gemm_available(ty) {
            f(ty);
        } else {
            eprintln!(
                "{}: this CPU lacks the blocked kernel's instructions; skipped",
                ty.name()
            );
        }
    }
}

#[test]
fn blocked_products_match_f64_and_mul_mat() {
    each_type(|ty| {
        for &(k, m, xne) in shapes(ty) {
            for bias in [false, true] {
                check(ty, k, m, xne, bias, 2);
            }
        }
    });
}

/// bf16 weights widened while packing give exactly the panels of their f32 values.
#[test]
fn widened_bf16_panels_equal_f32_panels() {
    if !blocked_gemm_available(DType::F32) {
        eprintln!("no blocked kernels on this CPU: skipped");
        return;
    }
    use super::pack::{panels_bf16_wide, panels_f32, Rows};
    let (k, m) = (390, 150);
    let values = pseudo_random(k * m, 7);
    let bits: Vec<u16> = values.iter().map(|&v| bf16_bits(v) as u16).collect();
    let wide: Vec<f32> = values.iter().map(|&v| bf16_value(v)).collect();
    for ((k0, kc), strip) in [(0, 200), (200, 190)].into_iter().zip([NR, 16]) {
        let len = m.div_ceil(NR) * kc * NR;
        let (mut a, mut b) = (vec![0f32; len], vec![1f32; len]);
        // SAFETY: the blocked kernels run here (checked above).
        unsafe {
            panels_bf16_wide(&Rows { data: &bits, k }, 0..m, (k0, kc), strip, &mut a);
            panels_f32(&Rows { data: &wide, k }, 0..m, (k0, kc), strip, &mut b);
        }
        assert_eq!(a, b, "k-block {k0}..{}, strips {strip} wide", k0 + kc);
    }
}

/// q8_0 weights dequantized while packing give exactly the panels of ggml's dequantized
/// values, for k-blocks that start past the first block.
#[test]
fn widened_q8_panels_equal_dequantized_f32_panels() {
    if !blocked_gemm_available(DType::F32) {
        eprintln!("no blocked kernels on this CPU: skipped");
        return;
    }
    use super::pack::{panels_f32, panels_q8_wide, Rows};
    let (k, m) = (320, 150);
    let values = pseudo_random(k * m, 11);
    let bytes = to_bytes(&values, DType::Q8_0, k);
    let wide = stored(&values, DType::Q8_0, k);
    for (k0, kc) in [(0, 320), (0, 160), (96, 224)] {
        for strip in [NR, 16] {
            let len = m.div_ceil(NR) * kc * NR;
            let (mut a, mut b) = (vec![0f32; len], vec![1f32; len]);
            // SAFETY: the blocked kernels run here (checked above).
            unsafe {
                panels_q8_wide((&bytes, k), 0..m, (k0, kc), strip, &mut a);
                panels_f32(&Rows { data: &wide, k }, 0..m, (k0, kc), strip, &mut b);
            }
            assert_eq!(a, b, "k-block {k0}..{}, strips {strip} wide", k0 + kc);
        }
    }
}

/// Packed weights land where `panel_at` says, in either strip width (whole blocks by the
/// AVX-512 or AVX2 transposes, the tails and the partial last panel by the scalar fill), with
/// zeros past the last weight row; V's column panels alike.
#[test]
fn panels_follow_their_strip_layout() {
    if !blocked_gemm_available(DType::F32) {
        eprintln!("no blocked kernels on this CPU: skipped");
        return;
    }
    use super::pack::{panel_at, panel_of_columns, panels_f16, panels_f32, Rows};
    let (k, m) = (203, 150);
    let values = pseudo_random(k * m, 5);
    let halves: Vec<u16> = values
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let widened: Vec<f32> = halves
        .iter()
        .map(|&h| half::f16::from_bits(h).to_f32())
        .collect();
    for strip in [NR, 16] {
        for (k0, kc) in [(0, 203), (8, 195), (40, 17)] {
            let len = m.div_ceil(NR) * kc * NR;
            let (mut a, mut b) = (vec![f32::NAN; len], vec![f32::NAN; len]);
            // SAFETY: the blocked kernels run here (checked above).
            unsafe {
                panels_f32(&Rows { data: &values, k }, 0..m, (k0, kc), strip, &mut a);
                panels_f16(&Rows { data: &halves, k }, 0..m, (k0, kc), strip, &mut b);
            }
            for (got, from) in [(&a, &values), (&b, &widened)] {
                for j in 0..m.next_multiple_of(NR) {
                    let (p, col) = (j / NR, j % NR);
                    for kk in 0..kc {
                        let want = if j < m { from[j * k + k0 + kk] } else { 0.0 };
                        let at = p * kc * NR + panel_at(kc, strip, kk, col);
                        assert_eq!(
                            got[at], want,
                            "strip {strip}, k0 {k0}: output {j}, step {kk}"
                        );
                    }
                }
            }
        }
    }
    // V: 11 rows of a 100-column matrix, columns 30..70 as a 48-wide panel.
    let (ld, rows, width, cols) = (100, 11, 48, 40);
    let data = pseudo_random(ld * rows, 9);
    for strip in [NR, 16] {
        let mut out = vec![f32::NAN; rows * width];
        panel_of_columns(&data, (ld, rows), (30, cols, width), strip, &mut out);
        for r in 0..rows {
            for j in 0..width {
                let want = if j < cols { data[r * ld + 30 + j] } else { 0.0 };
                assert_eq!(
                    out[panel_at(rows, strip.min(width), r, j)],
                    want,
                    "strip {strip}"
                );
            }
        }
    }
}

#[test]
fn every_thread_count_gives_the_same_result() {
    each_type(|ty| {
        let (k, m, _) = shapes(ty)[1];
        let one = run(ty, k, m, [41, 1, 1], true, 1).blocked;
        for threads in [2, 3, 5, 8] {
            let other = run(ty, k, m, [41, 1, 1], true, threads).blocked;
            assert_eq!(one, other, "{} with {threads} threads", ty.name());
        }
    });
}

#[test]
fn grid_pieces_cover_each_output_once() {
    for (n, m) in [
        (2048, 1152),
        (600, 1152),
        (17, 70),
        (5000, 64),
        (16, 4608),
        (7, 7),
    ] {
        for nth in 1..=9 {
            for packs_rows in [false, true] {
                let grid = Grid::new(n, m, nth, packs_rows);
                let mut seen = vec![0u8; n * m];
                for i in 0..grid.pieces() {
                    let (rows, feats) = grid.piece(i);
                    assert!(rows.start % MR == 0 && feats.start % NR == 0);
                    for r in rows {
                        for f in feats.clone() {
                            seen[r * m + f] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "n={n} m={m} nth={nth}");
                // Enough pieces to share out while a thread is descheduled.
                let most = (n.div_ceil(MR) * m.div_ceil(NR).div_ceil(2)).min(4 * nth);
                assert!(
                    nth == 1 || grid.pieces() >= most.min(2 * nth),
                    "n={n} m={m} nth={nth}"
                );
            }
        }
    }
}

#[test]
fn products_it_does_not_take_are_left_to_mul_mat() {
    let arena = Arena::new(4).expect("arena");
    let w = arena.add(DType::F32, [64, 64, 1, 1], "w").expect("room");
    let q = arena
        .add(DType::from_name("q4_0").expect("q4_0"), [64, 64, 1, 1], "q")
        .expect("room");
    let few = arena.add(DType::F32, [64, 4, 1, 1], "few").expect("room");
    let many = arena.add(DType::F32, [64, 32, 1, 1], "many").expect("room");
    let ctx = Context::new(8, 0).expect("ctx");
    let backend = Backend::cpu(1).expect("cpu backend");
    let Some(kernels) = backend.cpu_kernels() else {
        return; // no blocked kernels: nothing is ever taken
    };
    // Quantized weights, too few tokens, and a transposed (non-contiguous) input.
    assert!(kernels
        .linear(&ctx, arena.get(q), arena.get(many), None)
        .is_none());
    assert!(kernels
        .linear(&ctx, arena.get(w), arena.get(few), None)
        .is_none());
    let t = ctx.transpose(arena.get(many));
    assert!(kernels.linear(&ctx, arena.get(w), t, None).is_none());
}

/// `linear_add` equals the blocked product plus the addend (a run-time LoRA's up-projection
/// onto its layer's output), for every weight type, with and without bias, across k-blocks.
#[test]
fn linear_add_adds_its_addend_once() {
    if !blocked_gemm_available(DType::F32) {
        eprintln!("this CPU lacks AVX-512F (or SD_CLI_CPU caps it); skipped");
        return;
    }
    each_type(|ty| {
        for &(k, m, xne) in shapes(ty) {
            let n: usize = xne.iter().product();
            let backend = Backend::cpu(2).expect("cpu backend");
            let arena = Arena::new(4).expect("arena");
            let wi = arena.add(ty, [k, m, 1, 1], "w").expect("room");
            let xi = arena.add(DType::F32, [k, xne[0], xne[1], xne[2]], "x");
            let xi = xi.expect("room");
            let bi = arena.add(DType::F32, [m, 1, 1, 1], "b").expect("room");
            let ai = arena.add(DType::F32, [m, xne[0], xne[1], xne[2]], "a");
            let ai = ai.expect("room");
            arena.allocate(&backend, "test").expect("alloc");
            let w = pseudo_random(k * m, 7);
            arena.get(wi).write_bytes(&to_bytes(&w, ty, k)).expect("w");
            arena
                .get(xi)
                .write_f32(&pseudo_random(k * n, 8))
                .expect("x");
            arena.get(bi).write_f32(&pseudo_random(m, 9)).expect("b");
            let addend = pseudo_random(m * n, 10);
            arena.get(ai).write_f32(&addend).expect("a");
            let ctx = Context::new(8, 8).expect("ctx");
            let graph = Graph::new(&ctx, 8);
            let kernels = backend
                .cpu_kernels()
                .expect("a CPU with the blocked kernels");
            let (wt, xt, bt, at) = (arena.get(wi), arena.get(xi), arena.get(bi), arena.get(ai));
            let plain = kernels.linear(&ctx, wt, xt, Some(bt)).expect("taken");
            let sum = kernels.linear_add(&ctx, wt, xt, Some(bt), Some(at));
            let sum = sum.expect("taken with an addend");
            graph.expand(plain);
            graph.expand(sum);
            let mut galloc = Gallocr::new(&backend).expect("gallocr");
            let _allocation = galloc.alloc(&graph).expect("alloc graph");
            backend.compute(&graph).expect("compute");
            let (plain, sum) = (
                plain.read_f32().expect("read"),
                sum.read_f32().expect("read"),
            );
            let scale = plain.iter().fold(1.0f32, |a, v| a.max(v.abs()));
            for ((p, s), a) in plain.iter().zip(&sum).zip(&addend) {
                assert!(
                    (p + a - s).abs() <= 1e-5 * scale,
                    "{} k={k} m={m}: {p} + {a} vs {s}",
                    ty.name()
                );
            }
        }
    });
}
