//! Rotary position embeddings over any number of position axes, from host-built tables.
//!
//! Each axis `a` owns `axes_dims[a] / 2` rotation pairs with frequencies
//! `theta^(-2i / axes_dims[a])` (diffusers `get_1d_rotary_pos_embed`); the pairs of all axes
//! are concatenated in order. Text-only models with standard rope can use ggml's fused
//! `rope` op instead.

use crate::ggml::Tensor;
use crate::runner::GraphCtx;

/// How the rotated pairs are laid out inside a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs are adjacent elements (x0, x1), (x2, x3)... (complex-number style).
    Interleaved,
    /// Pair i is (x_i, x_{i + d/2}) (`rotate_half`, GPT-NeoX style).
    Halves,
}

/// (cos, sin) tables, each `[d/2, n_pos]` row-major (pair index fastest), for positions with
/// `axes_dims.len()` coordinates each.
pub fn rope_table(positions: &[Vec<f32>], axes_dims: &[usize], theta: f32) -> (Vec<f32>, Vec<f32>) {
    let half: usize = axes_dims.iter().map(|d| d / 2).sum();
    let mut cos = Vec::with_capacity(half * positions.len());
    let mut sin = Vec::with_capacity(half * positions.len());
    for pos in positions {
        for (a, &d) in axes_dims.iter().enumerate() {
            let p = f64::from(pos.get(a).copied().unwrap_or(0.0));
            for i in 0..d / 2 {
                let freq = 1.0 / f64::from(theta).powf((2 * i) as f64 / d as f64);
                let angle = p * freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
    }
    (cos, sin)
}

/// Rotates x: [head_dim, heads, n, B] by tables cos/sin: [head_dim/2, 1, n, 1] (graph inputs
/// made from [`rope_table`]).
pub fn apply_rope<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    cos: Tensor<'g>,
    sin: Tensor<'g>,
    layout: RopeLayout,
) -> Tensor<'g> {
    let [d, heads, n, batch] = x.ne();
    let half = d / 2;
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    // One pass on the CPU instead of the ops below (bit-identical).
    if let Some(k) = g.cpu_kernels() {
        let interleaved = layout == RopeLayout::Interleaved;
        if let Some(y) = k.rope(g.ctx(), x, cos, sin, interleaved) {
            return y;
        }
    }
    let es = 4; // f32 bytes
    let (x0, x1) = match layout {
        RopeLayout::Interleaved => {
            // [2, d/2, heads, n*B]: element 0 / 1 of each pair.
            let nb = [2 * es, d * es, d * heads * es];
            let ne = [1, half, heads, n * batch];
            (g.view(x, ne, nb, 0), g.view(x, ne, nb, es))
        }
        RopeLayout::Halves => {
            // Each half as [1, d/2] with unit stride between pairs.
            let nb = [es, d * es, d * heads * es];
            let ne = [1, half, heads, n * batch];
            (g.view(x, ne, nb, 0), g.view(x, ne, nb, half * es))
        }
    };
    // Tables broadcast over heads (and batch, which shares positions).
    let cos = g.reshape(cos, [1, half, 1, n]);
    let sin = g.reshape(sin, [1, half, 1, n]);
    let (cos, sin) = if batch > 1 {
        let shape = g.new_tensor(crate::dtype::DType::F32, [1, half, 1, n * batch]);
        let rep = |t: Tensor<'g>| {
            let t = g.reshape(t, [1, half, n, 1]);
            let t = g.repeat(t, g.reshape(shape, [1, half, n, batch]));
            g.reshape(g.cont(t), [1, half, 1, n * batch])
        };
        (rep(cos), rep(sin))
    } else {
        (cos, sin)
    };
    let x0c = g.cont(x0);
    let x1c = g.cont(x1);
    let out0 = g.sub(g.mul(x0c, cos), g.mul(x1c, sin));
    let out1 = g.add(g.mul(x0c, sin), g.mul(x1c, cos));
    match layout {
        RopeLayout::Interleaved => {
            let out = g.concat(out0, out1, 0); // [2, d/2, heads, n*B]
            g.reshape(out, [d, heads, n, batch])
        }
        RopeLayout::Halves => {
            let out0 = g.reshape(out0, [half, heads, n * batch, 1]);
            let out1 = g.reshape(out1, [half, heads, n * batch, 1]);
            let out = g.concat(out0, out1, 0); // [d, heads, n*B]
            g.reshape(out, [d, heads, n, batch])
        }
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::ggml::Backend;
    use crate::runner::{RunOptions, Runner, RunnerError};

    /// Two position axes (d − 4 and 4 of the head) over n tokens.
    fn tables(d: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let positions: Vec<Vec<f32>> = (0..n).map(|p| vec![p as f32, (p % 3) as f32]).collect();
        rope_table(&positions, &[d - 4, 4], 100.0)
    }

    /// Rotates a [d, heads, n, batch] tensor given as a [d, n, heads, batch] input permuted
    /// (so the input is not contiguous) with the blocked kernels on or off.
    fn rotate(
        x: &[f32],
        [d, heads, n, batch]: [usize; 4],
        layout: RopeLayout,
        blocked: bool,
    ) -> Vec<f32> {
        let (cos, sin) = tables(d, n);
        let options = RunOptions {
            blocked_kernels: blocked,
            ..RunOptions::default()
        };
        let backend = Rc::new(Backend::cpu(3).expect("cpu backend"));
        let runner = Runner::new("rope", backend, None, options);
        runner
            .compute_one(|g| {
                let x = g.input_f32("x", [d, n, heads, batch], x.to_vec());
                let x = g.permute(x, [0, 2, 1, 3]);
                let cos = g.input_f32("cos", [d / 2, 1, n, 1], cos);
                let sin = g.input_f32("sin", [d / 2, 1, n, 1], sin);
                Ok::<_, RunnerError>(apply_rope(g, x, cos, sin, layout))
            })
            .expect("rope")
            .data
    }

    #[test]
    fn the_one_pass_rotation_equals_the_ops_bit_for_bit() {
        let backend = Backend::cpu(1).expect("cpu backend");
        if backend.cpu_kernels().is_none() {
            eprintln!("no blocked kernels on this CPU; skipped");
            return;
        }
        let shape = [12, 3, 7, 2];
        let x: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|i| ((i * 7919 % 1000) as f32 / 250.0 - 2.0) * 1.37)
            .collect();
        for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
            let fused = rotate(&x, shape, layout, true);
            let ops = rotate(&x, shape, layout, false);
            assert_eq!(fused.len(), x.len());
            let same = fused
                .iter()
                .zip(&ops)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{layout:?}: {fused:?} vs {ops:?}");
            // And the rotation itself (the input is [d, n, heads, batch]).
            let [d, heads, n, batch] = shape;
            let (cos, sin) = tables(d, n);
            for (b, p, h, i) in indices4(batch, n, heads, d / 2) {
                let at = |j: usize| x[((b * heads + h) * n + p) * d + j] as f64;
                let (j0, j1) = match layout {
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    RopeLayout::Halves => (i, i + d / 2),
                };
                let (c, s) = (cos[p * d / 2 + i] as f64, sin[p * d / 2 + i] as f64);
                let out = |j: usize| fused[((b * n + p) * heads + h) * d + j] as f64;
                let want0 = at(j0) * c - at(j1) * s;
                let want1 = at(j0) * s + at(j1) * c;
                assert!((out(j0) - want0).abs() < 1e-5, "{layout:?} {b} {p} {h} {i}");
                assert!((out(j1) - want1).abs() < 1e-5, "{layout:?} {b} {p} {h} {i}");
            }
        }
    }

    fn indices4(
        a: usize,
        b: usize,
        c: usize,
        d: usize,
    ) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        (0..a).flat_map(move |i| {
            (0..b).flat_map(move |j| (0..c).flat_map(move |k| (0..d).map(move |l| (i, j, k, l))))
        })
    }
}
