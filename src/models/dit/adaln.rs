//! Graph helpers the adaptive-norm DiTs (FLUX, SD3, PixArt) share: rows of a modulation output, the
//! `LN · (1 + scale) + shift` modulation, and row / column slices of [R, n, B] tensors.

use crate::ggml::Tensor;
use crate::nn::LayerNorm;
use crate::runner::GraphCtx;

/// f32 bytes.
const ES: usize = 4;

/// Rows of a modulation output [k·D, B], each [D, 1, B].
pub fn mod_rows<'g>(g: &'g GraphCtx<'g>, mods: Tensor<'g>, d: usize, k: usize) -> Vec<Tensor<'g>> {
    let b = mods.ne()[1];
    (0..k)
        .map(|i| {
            let v = g.view(
                mods,
                [d, b, 1, 1],
                [k * d * ES, k * d * b * ES, k * d * b * ES],
                i * d * ES,
            );
            g.reshape(g.cont(v), [d, 1, b, 1])
        })
        .collect()
}

/// `LN(x)·(1 + scale) + shift` (a layer norm without affine weights, epsilon `eps`; shift
/// and scale [D, 1, B] for x [D, n, B]). On the CPU one pass (the blocked LayerNorm with one
/// weight and bias per batch item), with the same roundings as the three ops.
pub fn modulate<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    shift: Tensor<'g>,
    scale: Tensor<'g>,
    eps: f32,
) -> Tensor<'g> {
    let scale = g.scale_bias(scale, 1.0, 1.0);
    if let Some(y) = g
        .cpu_kernels()
        .and_then(|k| k.layer_norm(g.ctx(), x, eps, Some(scale), Some(shift)))
    {
        return y;
    }
    let n = LayerNorm::plain(eps).forward(g, x);
    g.add(g.mul(n, scale), shift)
}

/// Rows `start .. start + len` of `t` [R, n, B] (a contiguous copy).
pub fn rows<'g>(g: &'g GraphCtx<'g>, t: Tensor<'g>, start: usize, len: usize) -> Tensor<'g> {
    let [r, n, b, _] = t.ne();
    g.cont(g.view(
        t,
        [len, n, b, 1],
        [r * ES, r * n * ES, r * n * b * ES],
        start * ES,
    ))
}

/// Columns `start .. start + len` of `t` [D, n, B] (a contiguous copy).
pub fn columns<'g>(g: &'g GraphCtx<'g>, t: Tensor<'g>, start: usize, len: usize) -> Tensor<'g> {
    let [d, n, b, _] = t.ne();
    g.cont(g.view(
        t,
        [d, len, b, 1],
        [d * ES, d * n * ES, d * n * b * ES],
        start * d * ES,
    ))
}
