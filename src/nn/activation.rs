//! Activations built from exact ggml ops where ggml's fused kernel is approximate.

use crate::ggml::Tensor;
use crate::runner::GraphCtx;

/// √(2/π), the tanh-GELU input scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh-GELU.
const GELU_CUBIC: f32 = 0.044_715;

/// GELU with the tanh approximation, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, as PyTorch's
/// `gelu(approximate="tanh")`. ggml's fused `gelu` reads an f16 table on the CPU (about 1e-3
/// off), and its `tanh` is a scalar libm call per element (14% of a PixArt step), so this uses
/// `0.5·(1 + tanh(u)) = sigmoid(2u)`: with `q = 2√(2/π)·(1 + 0.044715·x²)` and `z = x·q`,
/// `gelu = x·sigmoid(z) = silu(z) / q` — no division by x, and ggml's silu is vectorised. On
/// the CPU the blocked kernels do the same in one pass.
pub fn gelu_tanh<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
    if let Some(y) = g.cpu_kernels().and_then(|k| k.gelu_tanh(g.ctx(), x)) {
        return y;
    }
    let k = 2.0 * SQRT_2_OVER_PI;
    let q = g.scale_bias(g.sqr(x), GELU_CUBIC * k, k);
    g.div(g.silu(g.mul(x, q)), q)
}

/// The sigmoid scale of the quick GELU.
const QUICK_GELU_SCALE: f32 = 1.702;

/// Quick GELU `x·sigmoid(1.702·x)` (OpenAI CLIP, transformers `quick_gelu`), exact in f32 as
/// `silu(1.702·x) / 1.702`: ggml's fused `gelu_quick` reads an f16 table on the CPU.
pub fn quick_gelu<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
    g.scale(g.silu(g.scale(x, QUICK_GELU_SCALE)), 1.0 / QUICK_GELU_SCALE)
}

/// GEGLU over the two halves of `ne[0]`: `value · gelu(gate)`, value first, with diffusers'
/// exact (erf) GELU. (stable-diffusion.cpp's ggml kernel uses the tanh form, at most 5e-4 away:
/// numerical noise, not behaviour; the reference is diffusers.)
pub fn geglu<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
    if let Some(y) = g.cpu_kernels().and_then(|k| k.geglu(g.ctx(), x)) {
        return y;
    }
    let [n0, n1, n2, n3] = x.ne();
    let nb = x.nb();
    let half = n0 / 2;
    let part = |i: usize| {
        g.view(
            x,
            [half, n1, n2, n3],
            [nb[1], nb[2], nb[3]],
            i * half * nb[0],
        )
    };
    g.mul(part(0), g.gelu_erf(g.cont(part(1))))
}
