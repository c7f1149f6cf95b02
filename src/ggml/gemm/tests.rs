//! The blocked kernels against an f64 product of the same (rounded) operands, and against
//! ggml's `mul_mat`, over shapes that exercise every edge: partial strips, partial panels,
//! several weight chunks and k-blocks, odd k, batch dimensions, bias, thread splits.

use super::driver::partition;
use super::pack::bf16_bits;
use super::{blocked_gemm_available, MR, NR};
use crate::dtype::DType;
use crate::ggml::{dequantize_rows, quantize_rows, Arena, Backend, Context, Gallocr, Graph};

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

fn to_bytes(values: &[f32], ty: DType, k: usize) -> Vec<u8> {
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
    Outcome {
        blocked: blocked.read_f32().expect("read"),
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
    let xq = (ty == DType::Q8_0).then(|| quantized_activations(&x));
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
            if ty != DType::F16 && (ty != DType::BF16 || pairs) {
                // ggml rounds f16 (and bf16) products' activations; the others agree closely.
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
    for (k0, kc) in [(0, 200), (200, 190)] {
        let len = m.div_ceil(NR) * kc * NR;
        let (mut a, mut b) = (vec![0f32; len], vec![1f32; len]);
        // SAFETY: the blocked kernels run here (checked above).
        unsafe {
            panels_bf16_wide(&Rows { data: &bits, k }, 0..m, k0, kc, &mut a);
            panels_f32(&Rows { data: &wide, k }, 0..m, k0, kc, &mut b);
        }
        assert_eq!(a, b, "k-block {k0}..{}", k0 + kc);
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
fn partition_covers_each_output_once() {
    for (n, m) in [
        (2048, 1152),
        (600, 1152),
        (17, 70),
        (5000, 64),
        (16, 4608),
        (7, 7),
    ] {
        for nth in 1..=9 {
            let mut seen = vec![0u8; n * m];
            for ith in 0..nth {
                if let Some((rows, feats)) = partition(n, m, ith, nth) {
                    assert!(rows.start % MR == 0 && feats.start % NR == 0);
                    for r in rows {
                        for f in feats.clone() {
                            seen[r * m + f] += 1;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "n={n} m={m} nth={nth}");
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

/// softmax(q kᵀ · scale + mask) v in f64, per head; all-masked rows give zeros.
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    [dim, n_q, n_kv, batch, heads]: [usize; 5],
) -> Vec<f64> {
    let hd = dim / heads;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f64; dim * n_q * batch];
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..n_q {
                let qi = &q[(b * n_q + i) * dim + h * hd..][..hd];
                let scores: Vec<f64> = (0..n_kv)
                    .map(|j| {
                        let kj = &k[(b * n_kv + j) * dim + h * hd..][..hd];
                        let dot: f64 = qi.iter().zip(kj).map(|(&a, &c)| a as f64 * c as f64).sum();
                        dot * scale + mask.map_or(0.0, |m| m[i * n_kv + j] as f64)
                    })
                    .collect();
                let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if top == f64::NEG_INFINITY {
                    continue;
                }
                let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    out[(b * n_q + i) * dim + h * hd + d] = (0..n_kv)
                        .map(|j| e[j] / sum * v[(b * n_kv + j) * dim + h * hd + d] as f64)
                        .sum();
                }
            }
        }
    }
    out
}

fn run_attention(dims: [usize; 5], masked: bool, threads: usize) -> (Vec<f32>, Vec<f64>) {
    let [dim, n_q, n_kv, batch, heads] = dims;
    let q = pseudo_random(dim * n_q * batch, 11);
    let k = pseudo_random(dim * n_kv * batch, 12);
    let v = pseudo_random(dim * n_kv * batch, 13);
    // Masks: row 0 entirely, and a scattering of other entries.
    let mask: Vec<f32> = (0..n_q * n_kv)
        .map(|i| {
            if i < n_kv || (i * 7919) % 5 == 0 {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let backend = Backend::cpu(threads).expect("cpu backend");
    let arena = Arena::new(4).expect("arena");
    let qi = arena
        .add(DType::F32, [dim, n_q, batch, 1], "q")
        .expect("room");
    let ki = arena
        .add(DType::F32, [dim, n_kv, batch, 1], "k")
        .expect("room");
    let vi = arena
        .add(DType::F32, [dim, n_kv, batch, 1], "v")
        .expect("room");
    let mi = arena.add(DType::F32, [n_kv, n_q, 1, 1], "m").expect("room");
    arena.allocate(&backend, "test").expect("alloc");
    for (i, data) in [(qi, &q), (ki, &k), (vi, &v), (mi, &mask)] {
        arena.get(i).write_f32(data).expect("write");
    }
    let ctx = Context::new(8, 8).expect("ctx");
    let graph = Graph::new(&ctx, 8);
    let scale = 1.0 / ((dim / heads) as f32).sqrt();
    let m = masked.then(|| arena.get(mi));
    let kernels = backend
        .cpu_kernels()
        .expect("a CPU with the blocked kernels");
    let out = kernels
        .attention(
            &ctx,
            arena.get(qi),
            arena.get(ki),
            arena.get(vi),
            heads,
            m,
            scale,
        )
        .expect("the blocked attention takes these shapes");
    assert_eq!(super::BlockedOp::of(out), Some(super::BlockedOp::Attention));
    graph.expand(out);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc graph");
    backend.compute(&graph).expect("compute");
    let reference = attention_reference(&q, &k, &v, masked.then_some(&mask[..]), dims);
    (out.read_f32().expect("read"), reference)
}

#[test]
fn blocked_attention_matches_f64() {
    if super::tiles().is_none() {
        eprintln!("this CPU lacks AVX-512F (or SD_CLI_CPU caps it); skipped");
        return;
    }
    // [dim, n_q, n_kv, batch, heads]: PixArt's head size 72 (two V panels, one 16 wide),
    // query counts off the 6-row and 48-row blocks, keys off the 16- and 64-lanes.
    for (dims, masked) in [
        ([144, 50, 77, 2, 2], false),
        ([144, 50, 77, 2, 2], true),
        ([60, 13, 130, 1, 3], true),
        ([256, 7, 300, 1, 2], false),
        // SD 1.x's head size 40 (one 48-wide V panel), and 24 and 100 (32- and 48-wide).
        ([80, 20, 70, 2, 2], true),
        ([48, 9, 33, 1, 2], false),
        ([200, 11, 40, 1, 2], false),
    ] {
        for threads in [1, 3] {
            let (got, want) = run_attention(dims, masked, threads);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() < 2e-6,
                    "{dims:?} masked={masked} threads={threads}: out[{i}] = {g}, reference {w}"
                );
            }
        }
    }
}

/// A direct f64 convolution: x [W, H, C, N], kernel [KW, KH, C, OC] (ggml order) → [OW, OH,
/// OC, N].
fn conv_reference(
    x: &[f32],
    [w, h, c, n]: [usize; 4],
    kernel: &[f32],
    oc: usize,
    bias: &[f32],
    g: super::ConvGeometry,
) -> (Vec<f64>, [usize; 4]) {
    let (kw, kh) = g.kernel;
    let ow = (w + 2 * g.pad.0 - g.dilation.0 * (kw - 1) - 1) / g.stride.0 + 1;
    let oh = (h + 2 * g.pad.1 - g.dilation.1 * (kh - 1) - 1) / g.stride.1 + 1;
    let mut out = vec![0.0f64; ow * oh * oc * n];
    for b in 0..n {
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = bias[o] as f64;
                    for ch in 0..c {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * g.stride.1 + ky * g.dilation.1) as isize
                                    - g.pad.1 as isize;
                                let ix = (ox * g.stride.0 + kx * g.dilation.0) as isize
                                    - g.pad.0 as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xv = x[ix as usize + w * (iy as usize + h * (ch + c * b))];
                                let kv = kernel[kx + kw * (ky + kh * (ch + c * o))];
                                acc += xv as f64 * kv as f64;
                            }
                        }
                    }
                    out[ox + ow * (oy + oh * (o + oc * b))] = acc;
                }
            }
        }
    }
    (out, [ow, oh, oc, n])
}

/// `conv_2d_matrix` with and without the blocked kernels against the direct convolution, over
/// kernels, strides, paddings, dilations and sizes that leave partial tiles everywhere.
#[test]
fn matrix_convolutions_match_a_direct_convolution() {
    if !blocked_gemm_available(DType::F32) {
        eprintln!("this CPU lacks AVX-512F (or SD_CLI_CPU caps it); skipped");
        return;
    }
    use super::ConvGeometry;
    let cases: &[([usize; 4], usize, ConvGeometry)] = &[
        ([9, 7, 5, 2], 6, geometry((3, 3), (1, 1), (1, 1), (1, 1))),
        ([11, 6, 33, 1], 40, geometry((3, 3), (2, 2), (1, 1), (1, 1))),
        ([8, 8, 4, 1], 3, geometry((1, 1), (1, 1), (0, 0), (1, 1))),
        ([10, 9, 3, 2], 5, geometry((3, 2), (1, 2), (2, 0), (2, 1))),
        ([37, 5, 2, 1], 70, geometry((5, 5), (1, 1), (2, 2), (1, 1))),
        // Patches of 147 KiB per pixel: the fused conv works in chunks of ~220 pixels.
        (
            [20, 25, 4096, 1],
            3,
            geometry((3, 3), (1, 1), (1, 1), (1, 1)),
        ),
    ];
    for &(xne, oc, g) in cases {
        let [w, h, c, n] = xne;
        let (kw, kh) = g.kernel;
        let x = pseudo_random(w * h * c * n, 21);
        let kernel = pseudo_random(kw * kh * c * oc, 22);
        let bias = pseudo_random(oc, 23);
        // The matrix rows run channel fastest, then kernel column, then kernel row.
        let mut matrix = vec![0.0f32; kernel.len()];
        for o in 0..oc {
            for ch in 0..c {
                for ky in 0..kh {
                    for kx in 0..kw {
                        matrix[ch + c * (kx + kw * (ky + kh * o))] =
                            kernel[kx + kw * (ky + kh * (ch + c * o))];
                    }
                }
            }
        }
        let (want, out_ne) = conv_reference(&x, xne, &kernel, oc, &bias, g);
        let backend = Backend::cpu(2).expect("cpu backend");
        let arena = Arena::new(3).expect("arena");
        let xi = arena.add(DType::F32, xne, "x").expect("room");
        let mi = arena
            .add(DType::F32, [kw * kh * c, oc, 1, 1], "m")
            .expect("room");
        let bi = arena.add(DType::F32, [oc, 1, 1, 1], "b").expect("room");
        arena.allocate(&backend, "test").expect("alloc");
        arena.get(xi).write_f32(&x).expect("x");
        arena.get(mi).write_f32(&matrix).expect("m");
        arena.get(bi).write_f32(&bias).expect("b");
        let ctx = Context::new(64, 64).expect("ctx");
        let graph = Graph::new(&ctx, 64);
        let (xt, mt, bt) = (arena.get(xi), arena.get(mi), arena.get(bi));
        let kernels = backend
            .cpu_kernels()
            .expect("a CPU with the blocked kernels");
        let blocked = ctx.conv_2d_matrix(mt, xt, g, Some(bt), Some(kernels));
        let plain = ctx.conv_2d_matrix(mt, xt, g, Some(bt), None);
        // The fused op directly (conv_2d_matrix takes it only for large patch matrices).
        let pixels = kernels
            .transpose(&ctx, ctx.reshape(xt, [w * h, c, n, 1]))
            .expect("f32");
        let pixels = ctx.reshape(pixels, [c, w, h, n]);
        let fused = kernels
            .conv(&ctx, pixels, mt, Some(bt), g)
            .expect("f32 kernel");
        assert_eq!(super::BlockedOp::of(fused), Some(super::BlockedOp::Conv));
        let [_, ow, oh, _] = fused.ne();
        let fused = kernels
            .transpose(&ctx, ctx.reshape(fused, [oc, ow * oh, n, 1]))
            .expect("f32");
        let fused = ctx.reshape(fused, [ow, oh, oc, n]);
        graph.expand(blocked);
        graph.expand(plain);
        graph.expand(fused);
        let mut galloc = Gallocr::new(&backend).expect("gallocr");
        let _allocation = galloc.alloc(&graph).expect("alloc graph");
        backend.compute(&graph).expect("compute");
        for (what, t) in [("blocked", blocked), ("ggml", plain), ("fused", fused)] {
            assert_eq!(t.ne(), out_ne, "{what} {g:?}");
            let got = t.read_f32().expect("read");
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 - b).abs())
                .fold(0.0, f64::max);
            // ggml's own im2col rounds patches to f16 only for f16 kernels: f32 here (sums
            // of up to 36864 products of values below 0.5: ~1e-4 of f32 rounding).
            let tol = 2e-5 * ((kw * kh * c) as f64 / 200.0).sqrt().max(1.0);
            assert!(err < tol, "{what} {g:?} {xne:?}: max error {err}");
        }
    }
}

fn geometry(
    kernel: (usize, usize),
    stride: (usize, usize),
    pad: (usize, usize),
    dilation: (usize, usize),
) -> super::ConvGeometry {
    super::ConvGeometry {
        kernel,
        stride,
        pad,
        dilation,
    }
}

/// erf by its Maclaurin series in f64 (|x| ≤ 3 here: the terms peak near 200, leaving ~13
/// correct digits).
pub(super) fn erf_series(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..120 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn fused_geglu_matches_the_erf_gelu() {
    if super::tiles().is_none() {
        eprintln!("this CPU lacks AVX-512F (or SD_CLI_CPU caps it); skipped");
        return;
    }
    let (half, rows) = (45, 7);
    let x: Vec<f32> = pseudo_random(2 * half * rows, 31)
        .iter()
        .map(|v| v * 8.0)
        .collect();
    let backend = Backend::cpu(2).expect("cpu backend");
    let arena = Arena::new(1).expect("arena");
    let xi = arena
        .add(DType::F32, [2 * half, rows, 1, 1], "x")
        .expect("room");
    arena.allocate(&backend, "test").expect("alloc");
    arena.get(xi).write_f32(&x).expect("x");
    let ctx = Context::new(8, 8).expect("ctx");
    let graph = Graph::new(&ctx, 8);
    let kernels = backend
        .cpu_kernels()
        .expect("a CPU with the blocked kernels");
    let y = kernels.geglu(&ctx, arena.get(xi)).expect("f32 rows");
    assert_eq!(y.ne(), [half, rows, 1, 1]);
    assert_eq!(super::BlockedOp::of(y), Some(super::BlockedOp::Geglu));
    graph.expand(y);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc graph");
    backend.compute(&graph).expect("compute");
    let got = y.read_f32().expect("read");
    for r in 0..rows {
        for j in 0..half {
            let (v, g) = (
                x[2 * r * half + j] as f64,
                x[2 * r * half + half + j] as f64,
            );
            let want = v * 0.5 * g * (1.0 + erf_series(g / std::f64::consts::SQRT_2));
            let err = (got[r * half + j] as f64 - want).abs();
            // The erf approximation's 1.5e-7, scaled by |v · g| / 2, and f32 rounding.
            assert!(
                err <= 2e-7 * v.abs() * (1.0 + g.abs()),
                "row {r} col {j}: {} vs {want} (value {v}, gate {g})",
                got[r * half + j]
            );
        }
    }
}

/// The fused GroupNorm (with and without SiLU) and LayerNorm (with each affine part) against
/// ggml's separate norm, scale, shift and activation ops.
#[test]
fn fused_norms_match_ggml_ops() {
    if super::tiles().is_none() {
        eprintln!("this CPU lacks AVX-512F (or SD_CLI_CPU caps it); skipped");
        return;
    }
    let backend = Backend::cpu(2).expect("cpu backend");
    let kernels = backend
        .cpu_kernels()
        .expect("a CPU with the blocked kernels");
    let (w, h, c, n) = (7, 5, 12, 2);
    let x: Vec<f32> = pseudo_random(w * h * c * n, 41)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 6.0 + (i % 5) as f32)
        .collect();
    let arena = Arena::new(4).expect("arena");
    let xi = arena.add(DType::F32, [w, h, c, n], "x").expect("room");
    let wi = arena.add(DType::F32, [c, 1, 1, 1], "w").expect("room");
    let bi = arena.add(DType::F32, [c, 1, 1, 1], "b").expect("room");
    let ri = arena.add(DType::F32, [c, 9, 2, 1], "rows").expect("room");
    arena.allocate(&backend, "test").expect("alloc");
    arena.get(xi).write_f32(&x).expect("x");
    arena.get(wi).write_f32(&pseudo_random(c, 42)).expect("w");
    arena.get(bi).write_f32(&pseudo_random(c, 43)).expect("b");
    arena
        .get(ri)
        .write_f32(
            &pseudo_random(c * 18, 44)
                .iter()
                .map(|v| v * 3.0 + 1.0)
                .collect::<Vec<_>>(),
        )
        .expect("rows");
    let (xt, wt, bt, rt) = (arena.get(xi), arena.get(wi), arena.get(bi), arena.get(ri));
    let ctx = Context::new(64, 64).expect("ctx");
    let graph = Graph::new(&ctx, 64);
    let mut pairs = Vec::new();
    for silu in [false, true] {
        let fused = kernels
            .group_norm(&ctx, xt, 3, 1e-5, wt, bt, silu)
            .expect("f32, 3 groups of 4 channels");
        assert_eq!(super::BlockedOp::of(fused), Some(super::BlockedOp::Norm));
        let y = ctx.group_norm(xt, 3, 1e-5);
        let y = ctx.add(
            ctx.mul(y, ctx.reshape(wt, [1, 1, c, 1])),
            ctx.reshape(bt, [1, 1, c, 1]),
        );
        let y = if silu { ctx.silu(y) } else { y };
        pairs.push((format!("group norm, silu {silu}"), fused, y));
    }
    for (weight, bias) in [(true, true), (true, false), (false, true)] {
        let (w, b) = (weight.then_some(wt), bias.then_some(bt));
        let fused = kernels.layer_norm(&ctx, rt, 1e-6, w, b).expect("f32 rows");
        let mut y = ctx.norm(rt, 1e-6);
        if let Some(w) = w {
            y = ctx.mul(y, w);
        }
        if let Some(b) = b {
            y = ctx.add(y, b);
        }
        pairs.push((format!("layer norm, weight {weight} bias {bias}"), fused, y));
    }
    assert!(kernels
        .group_norm(&ctx, xt, 5, 1e-5, wt, bt, false)
        .is_none());
    for (_, a, b) in &pairs {
        graph.expand(*a);
        graph.expand(*b);
    }
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc graph");
    backend.compute(&graph).expect("compute");
    for (what, a, b) in &pairs {
        let (a, b) = (a.read_f32().expect("read"), b.read_f32().expect("read"));
        let err = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (p - q).abs() / q.abs().max(1.0))
            .fold(0.0f32, f32::max);
        // The same statistics and order of operations; only SiLU's exponential differs.
        assert!(err < 2e-6, "{what}: max error {err}");
    }
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
