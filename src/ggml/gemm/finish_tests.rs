//! Products finished inside the op (`CpuKernels::linear_then`) against the same product
//! followed by the separate ops they replace: equal to the bit, for every weight type this
//! CPU multiplies, over several k-blocks, ragged panels and strips, and two batch items with
//! their own gates.

use super::tests::{pseudo_random, to_bytes};
use super::{blocked_gemm_available, Then};
use crate::dtype::DType;
use crate::ggml::{Arena, Backend, Context, Gallocr, Graph};

#[test]
fn finished_products_equal_the_separate_ops() {
    // k: three f32 k-blocks, whole q8_0 blocks; m: a ragged last panel; 37 tokens per item.
    let (k, m, tokens, batch) = (1216, 200, 37, 2);
    for ty in [DType::F32, DType::F16, DType::BF16, DType::Q8_0] {
        if !blocked_gemm_available(ty) {
            eprintln!(
                "{}: not multiplied by the blocked kernels here; skipped",
                ty.name()
            );
            continue;
        }
        let backend = Backend::cpu(2).expect("cpu backend");
        let arena = Arena::new(5).expect("arena");
        let wi = arena.add(ty, [k, m, 1, 1], "w").expect("room");
        let xi = arena
            .add(DType::F32, [k, tokens, batch, 1], "x")
            .expect("room");
        let bi = arena.add(DType::F32, [m, 1, 1, 1], "b").expect("room");
        let ri = arena
            .add(DType::F32, [m, tokens, batch, 1], "residual")
            .expect("room");
        let gi = arena
            .add(DType::F32, [m, 1, batch, 1], "gate")
            .expect("room");
        arena.allocate(&backend, "test").expect("alloc");
        let w = pseudo_random(k * m, 61);
        arena.get(wi).write_bytes(&to_bytes(&w, ty, k)).expect("w");
        // Large enough outputs that GELU's tails and both signs are met.
        let x: Vec<f32> = pseudo_random(k * tokens * batch, 62)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        arena.get(xi).write_f32(&x).expect("x");
        arena.get(bi).write_f32(&pseudo_random(m, 63)).expect("b");
        let residual = pseudo_random(m * tokens * batch, 64);
        arena.get(ri).write_f32(&residual).expect("residual");
        arena
            .get(gi)
            .write_f32(&pseudo_random(m * batch, 65))
            .expect("gate");
        let (wt, xt, bt) = (arena.get(wi), arena.get(xi), arena.get(bi));
        let (rt, gt) = (arena.get(ri), arena.get(gi));

        let ctx = Context::new(32, 32).expect("ctx");
        let graph = Graph::new(&ctx, 32);
        let kernels = backend
            .cpu_kernels()
            .expect("a CPU with the blocked kernels");
        let product = || kernels.linear(&ctx, wt, xt, Some(bt)).expect("taken");
        let then = |t| {
            kernels
                .linear_then(&ctx, wt, xt, Some(bt), t)
                .expect("taken")
        };
        let gelu = kernels.gelu_tanh(&ctx, product()).expect("f32");
        let pairs = [
            ("GELU", then(Then::GeluTanh), gelu),
            (
                "gated residual",
                then(Then::Residual(rt, Some(gt))),
                ctx.add(rt, ctx.mul(product(), gt)),
            ),
            (
                "residual",
                then(Then::Residual(rt, None)),
                ctx.add(rt, product()),
            ),
        ];
        // A gate must have one row per batch item.
        let wrong = ctx.new_tensor(DType::F32, [m, 1, 1, 1]);
        assert!(kernels
            .linear_then(&ctx, wt, xt, None, Then::Residual(rt, Some(wrong)))
            .is_none());
        for (_, a, b) in &pairs {
            assert_eq!(super::BlockedOp::of(*a), Some(super::BlockedOp::Linear));
            graph.expand(*a);
            graph.expand(*b);
        }
        let mut galloc = Gallocr::new(&backend).expect("gallocr");
        let _allocation = galloc.alloc(&graph).expect("alloc graph");
        backend.compute(&graph).expect("compute");
        for (what, a, b) in &pairs {
            let (a, b) = (a.read_f32().expect("read"), b.read_f32().expect("read"));
            let differ = a
                .iter()
                .zip(&b)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count();
            assert_eq!(
                differ,
                0,
                "{} {what}: {differ} of {} outputs differ",
                ty.name(),
                a.len()
            );
            // Not trivially equal: the finish changed the product.
            assert!(a.iter().zip(&residual).any(|(p, r)| p != r));
        }
    }
}
