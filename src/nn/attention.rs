//! Multi-head scaled dot-product attention (PyTorch `F.scaled_dot_product_attention`).

use crate::dtype::DType;
use crate::ggml::Tensor;
use crate::runner::GraphCtx;

/// An additive mask over keys, `[n_kv, n_q]` (ggml order), broadcast over heads and batch;
/// entries are 0 (attend) or -inf (masked).
pub struct AttentionMask<'g>(pub Tensor<'g>);

/// q: [head_dim * heads, n_q, B], k/v: [head_dim * heads, n_kv, B] → [head_dim * heads, n_q, B].
///
/// On the CPU with AVX-512 or AVX2: the blocked kernels (`ggml::gemm`), exact in f32, or on
/// bf16 operands (f32 accumulation) where `g.attention_precision()` allows it (`--fa` with
/// bf16 or quantized weights) and the CPU has AVX-512 BF16.
/// Otherwise, with `g.flash_attn()` the fused kernel runs with K/V in f16 and f32
/// accumulation where the device has it, else softmax(q k^T * scale + mask) v in f32.
pub fn attention<'g>(
    g: &'g GraphCtx<'g>,
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    heads: usize,
    mask: Option<&AttentionMask<'g>>,
) -> Tensor<'g> {
    let [dim, n_q, batch, _] = q.ne();
    let n_kv = k.ne()[1];
    let head_dim = dim / heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    if let Some(kernels) = g.cpu_kernels() {
        // CPU: heads read in place by the blocked kernels (like `--fa`, no score matrix
        // beyond one query block per thread), when they take it. Faster than ggml's fused
        // kernel, so `--fa` takes this too: its reduced precision (upstream rounds Q, K and V
        // to f16) is bf16 operands here, for models whose products round already.
        let c = |t: Tensor<'g>| if t.is_contiguous() { t } else { g.cont(t) };
        let mask = mask.map(|m| m.0);
        let precision = g.attention_precision();
        if let Some(out) =
            kernels.attention(g.ctx(), c(q), c(k), c(v), heads, mask, scale, precision)
        {
            return out;
        }
    }
    // [d, H, n, B] -> [d, n, H, B]
    let split = |t: Tensor<'g>, n: usize| {
        g.permute(
            g.reshape(g.cont(t), [head_dim, heads, n, batch]),
            [0, 2, 1, 3],
        )
    };
    let q = split(q, n_q);
    let k = split(k, n_kv);

    if g.flash_attn() || g.fused_f32_attention() {
        // `--fa`: K/V in f16 as upstream. Otherwise (CPU) the same fused kernel with f32 K/V:
        // exact attention without a [n_kv, n_q, H] score matrix (PixArt XL: 7.5 s → 3.5 s per
        // step). The mask is 0 / −inf (or −1e4), exact in f16, which the kernel requires.
        let (k, v) = if g.flash_attn() {
            (g.cast(k, DType::F16), g.cast(split(v, n_kv), DType::F16))
        } else {
            (g.cont(k), g.cont(split(v, n_kv)))
        };
        let mask = mask.map(|m| g.cast(m.0, DType::F16));
        // result: [d, H, n_q, B]
        let out = g.flash_attn_ext(q, k, v, mask, scale);
        if g.device_supports(out) {
            return g.reshape(out, [dim, n_q, batch, 1]);
        }
        // As sd-cli does: a device without the fused kernel for this shape (Vulkan's needs
        // head sizes divisible by 8) computes the attention below on the same device.
        log::debug!("no fused attention kernel for head size {head_dim} on this device");
    }

    // Backends without the f32 fused kernel (GPUs without --fa): scores [n_kv, n_q, H, B].
    let scores = g.mul_mat(k, q);
    let probs = g.soft_max_ext(scores, mask.map(|m| m.0), scale);
    // v^T: [n_kv, d, H, B]
    let vt = g.cont(g.permute(
        g.reshape(g.cont(v), [head_dim, heads, n_kv, batch]),
        [1, 2, 0, 3],
    ));
    // [d, n_q, H, B] -> [d, H, n_q, B]
    let out = g.mul_mat(vt, probs);
    let out = g.cont(g.permute(out, [0, 2, 1, 3]));
    g.reshape(out, [dim, n_q, batch, 1])
}
