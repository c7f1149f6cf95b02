//! The fused ops of the blocked kernels against references: attention against f64, matrix
//! convolutions against a direct f64 convolution, GEGLU against an erf series, the fused norms
//! against ggml's separate ops. (Products are in `tests.rs`.)

use super::blocked_gemm_available;
use super::tests::pseudo_random;
use crate::dtype::DType;
use crate::ggml::{Arena, Backend, Context, Gallocr, Graph};

/// softmax(q kᵀ · scale + mask) v in f64, per head; all-masked rows give zeros. With
/// `round`, q, k, v and the exponentials are rounded to bf16 where the bf16 path rounds them:
/// the exponentials chunk by chunk of keys against the running maximum, as its online
/// softmax computes them.
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    [dim, n_q, n_kv, batch, heads]: [usize; 5],
    round: bool,
) -> Vec<f64> {
    let r = |x: f32| {
        if round {
            f32::from_bits(super::pack::bf16_bits(x) << 16)
        } else {
            x
        }
    };
    let (q, k, v): (Vec<f32>, Vec<f32>, Vec<f32>) = (
        q.iter().map(|&x| r(x)).collect(),
        k.iter().map(|&x| r(x)).collect(),
        v.iter().map(|&x| r(x)).collect(),
    );
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
                // Chunks of keys with a running maximum: the whole row when not rounding.
                let chunk = if round {
                    super::attention::SCORE_CHUNK
                } else {
                    n_kv
                };
                let (mut top, mut sum) = (f64::NEG_INFINITY, 0.0);
                let mut acc = vec![0f64; hd];
                for c0 in (0..n_kv).step_by(chunk) {
                    let keys = c0..(c0 + chunk).min(n_kv);
                    let new_top = scores[keys.clone()].iter().fold(top, |a, &s| a.max(s));
                    if new_top == f64::NEG_INFINITY {
                        continue;
                    }
                    let alpha = (top - new_top).exp();
                    acc.iter_mut().for_each(|a| *a *= alpha);
                    sum *= alpha;
                    for j in keys {
                        let e = (scores[j] - new_top).exp();
                        sum += e;
                        let e = r(e as f32) as f64;
                        for (d, a) in acc.iter_mut().enumerate() {
                            *a += e * v[(b * n_kv + j) * dim + h * hd + d] as f64;
                        }
                    }
                    top = new_top;
                }
                if top == f64::NEG_INFINITY {
                    continue;
                }
                for (d, a) in acc.iter().enumerate() {
                    out[(b * n_q + i) * dim + h * hd + d] = a / sum;
                }
            }
        }
    }
    out
}

fn run_attention(
    dims: [usize; 5],
    masked: bool,
    threads: usize,
    precision: super::AttentionPrecision,
) -> (Vec<f32>, Vec<f64>) {
    let [dim, n_q, n_kv, batch, heads] = dims;
    let q = pseudo_random(dim * n_q * batch, 11);
    let k = pseudo_random(dim * n_kv * batch, 12);
    let v = pseudo_random(dim * n_kv * batch, 13);
    // Masks: row 0 entirely, row 1's first 600 keys (a whole first chunk of keys, then
    // some), and a scattering of other entries.
    let mask: Vec<f32> = (0..n_q * n_kv)
        .map(|i| {
            if i < n_kv || (i / n_kv == 1 && i % n_kv < 600) || (i * 7919) % 5 == 0 {
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
            precision,
        )
        .expect("the blocked attention takes these shapes");
    assert_eq!(super::BlockedOp::of(out), Some(super::BlockedOp::Attention));
    graph.expand(out);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc graph");
    backend.compute(&graph).expect("compute");
    let round = precision == super::AttentionPrecision::Bf16 && super::bf16_native();
    let reference = attention_reference(&q, &k, &v, masked.then_some(&mask[..]), dims, round);
    (out.read_f32().expect("read"), reference)
}

#[test]
fn blocked_attention_matches_f64() {
    if super::tiles().is_none() {
        eprintln!("this CPU lacks AVX-512F (or SD_CLI_CPU caps it); skipped");
        return;
    }
    // [dim, n_q, n_kv, batch, heads]: PixArt's head size 72 (two V panels, one 16 wide),
    // query counts off the 6-row and 192-row blocks, keys off the 16- and 64-lanes.
    for (dims, masked) in [
        ([144, 50, 77, 2, 2], false),
        ([144, 50, 77, 2, 2], true),
        ([60, 13, 130, 1, 3], true),
        ([256, 7, 300, 1, 2], false),
        // SD 1.x's head size 40 (one 48-wide V panel), and 24 and 100 (32- and 48-wide).
        ([80, 20, 70, 2, 2], true),
        ([48, 9, 33, 1, 2], false),
        ([200, 11, 40, 1, 2], false),
        // Keys past one 256-key chunk: the online softmax's rescaling.
        ([64, 20, 1100, 1, 2], true),
        ([128, 13, 1030, 1, 1], false),
        // More than one block of queries.
        ([64, 200, 300, 1, 2], true),
    ] {
        for threads in [1, 3] {
            let (got, want) =
                run_attention(dims, masked, threads, super::AttentionPrecision::Exact);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() < 2e-6,
                    "{dims:?} masked={masked} threads={threads}: out[{i}] = {g}, reference {w}"
                );
            }
        }
    }
}

/// Attention on bf16 operands (`--fa` on AVX-512 BF16): against a reference that rounds the
/// same operands at the same points (f32 accumulation, and an exponential a few f32 ulps
/// off that lands on the other side of a bf16 rounding boundary, are the differences left).
#[test]
fn bf16_attention_matches_its_rounding() {
    if !super::bf16_native() {
        eprintln!("this CPU lacks AVX-512 BF16 (or SD_CLI_CPU caps it); skipped");
        return;
    }
    for (dims, masked) in [
        ([144, 50, 77, 2, 2], true),
        ([80, 20, 70, 2, 2], true),
        ([48, 9, 33, 1, 2], false),
        ([64, 20, 1100, 1, 2], true),
        ([256, 13, 1031, 1, 2], false),
        ([64, 200, 300, 1, 2], true),
    ] {
        for threads in [1, 3] {
            let bf16 = super::AttentionPrecision::Bf16;
            let (got, want) = run_attention(dims, masked, threads, bf16);
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (*g as f64 - w).abs())
                .fold(0.0, f64::max);
            assert!(
                worst < 1e-5,
                "{dims:?} masked={masked} threads={threads}: worst error {worst}"
            );
            // And the bf16 products really ran: f32 would be within 2e-6 of the exact result
            // (bf16 lands 8e-5 to 3e-4 from it on these shapes).
            let (exact, _) = run_attention(dims, masked, threads, super::AttentionPrecision::Exact);
            let apart = got
                .iter()
                .zip(&exact)
                .map(|(g, e)| (g - e).abs())
                .fold(0.0, f32::max);
            assert!(
                apart > 1e-5,
                "{dims:?}: bf16 output equals f32's (apart {apart})"
            );
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
    let (got, ne) = run_row_op(super::BlockedOp::Geglu, &x, [2 * half, rows, 1, 1]);
    assert_eq!(ne, [half, rows, 1, 1]);
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
    let arena = Arena::new(6).expect("arena");
    let xi = arena.add(DType::F32, [w, h, c, n], "x").expect("room");
    let wi = arena.add(DType::F32, [c, 1, 1, 1], "w").expect("room");
    let bi = arena.add(DType::F32, [c, 1, 1, 1], "b").expect("room");
    let ri = arena.add(DType::F32, [c, 9, 2, 1], "rows").expect("room");
    // An adaptive norm's scale and shift: one vector per batch item.
    let si = arena.add(DType::F32, [c, 1, 2, 1], "scale").expect("room");
    let ti = arena.add(DType::F32, [c, 1, 2, 1], "shift").expect("room");
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
    arena
        .get(si)
        .write_f32(&pseudo_random(2 * c, 45))
        .expect("scale");
    arena
        .get(ti)
        .write_f32(&pseudo_random(2 * c, 46))
        .expect("shift");
    let (xt, wt, bt, rt) = (arena.get(xi), arena.get(wi), arena.get(bi), arena.get(ri));
    let (st, tt) = (arena.get(si), arena.get(ti));
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
    let fused = kernels
        .layer_norm(&ctx, rt, 1e-6, Some(st), Some(tt))
        .expect("per-item vectors");
    let y = ctx.add(ctx.mul(ctx.norm(rt, 1e-6), st), tt);
    pairs.push((
        "layer norm, a weight and bias per batch item".into(),
        fused,
        y,
    ));
    assert!(kernels
        .group_norm(&ctx, xt, 5, 1e-5, wt, bt, false)
        .is_none());
    // Vectors per item must match x's items.
    let three = ctx.new_tensor(DType::F32, [c, 1, 3, 1]);
    assert!(kernels
        .layer_norm(&ctx, rt, 1e-6, Some(three), None)
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

/// The one-pass tanh GELU (the tiles this CPU runs) against f64, through a graph.
#[test]
fn fused_gelu_tanh_matches_f64() {
    if super::tiles().is_none() {
        eprintln!("this CPU lacks the blocked kernels (or SD_CLI_CPU caps it); skipped");
        return;
    }
    // More than one claimed chunk of 16384, and a ragged end (40003 elements).
    let x = super::avx2_tests::gelu_inputs(39_993);
    let (got, _) = run_row_op(super::BlockedOp::Gelu, &x, [x.len(), 1, 1, 1]);
    super::avx2_tests::check_gelu(&x, &got);
}

/// Runs the row op `op` (GEGLU or GELU) of the blocked kernels on `x` of shape `ne` through a
/// graph; returns its output and shape.
fn run_row_op(op: super::BlockedOp, x: &[f32], ne: [usize; 4]) -> (Vec<f32>, [usize; 4]) {
    let backend = Backend::cpu(2).expect("cpu backend");
    let arena = Arena::new(1).expect("arena");
    let xi = arena.add(DType::F32, ne, "x").expect("room");
    arena.allocate(&backend, "test").expect("alloc");
    arena.get(xi).write_f32(x).expect("x");
    let ctx = Context::new(8, 8).expect("ctx");
    let graph = Graph::new(&ctx, 8);
    let kernels = backend
        .cpu_kernels()
        .expect("a CPU with the blocked kernels");
    let y = match op {
        super::BlockedOp::Geglu => kernels.geglu(&ctx, arena.get(xi)),
        _ => kernels.gelu_tanh(&ctx, arena.get(xi)),
    }
    .expect("f32 rows");
    assert_eq!(super::BlockedOp::of(y), Some(op));
    graph.expand(y);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc graph");
    backend.compute(&graph).expect("compute");
    (y.read_f32().expect("read"), y.ne())
}
