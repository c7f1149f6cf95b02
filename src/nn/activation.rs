//! Activations built from exact ggml ops where ggml's fused kernel is approximate.

use crate::ggml::Tensor;
use crate::runner::GraphCtx;

/// √(2/π), the tanh-GELU input scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU with the tanh approximation, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, as PyTorch's
/// `gelu(approximate="tanh")`. ggml's fused `gelu` reads an f16 table on the CPU (about 1e-3
/// off); this composes f32 ops instead and matches PyTorch to f32 rounding.
pub fn gelu_tanh<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
    // x·(1 + 0.044715·x²) = x + 0.044715·x³
    let inner = g.mul(x, g.scale_bias(g.sqr(x), 0.044_715, 1.0));
    let t = g.tanh(g.scale(inner, SQRT_2_OVER_PI));
    g.mul(x, g.scale_bias(t, 0.5, 0.5))
}
