"""Golden fixtures for the shared nn blocks (tests/nn_parity.rs).

Run from the repository root:  python3 tests/reference/nn_fixtures.py
Writes tests/fixtures/nn/blocks.safetensors. Each case stores its PyTorch parameters under
`<case>.<param name>`, its inputs as `<case>.x` (and friends) and the reference output as
`<case>.y`. Tensors keep PyTorch's row-major layout; the Rust side reads shapes reversed
(ggml order), which is the same memory.
"""
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from diffusers.models.embeddings import (
    get_timestep_embedding,
    get_2d_sincos_pos_embed,
    get_1d_rotary_pos_embed,
    apply_rotary_emb,
)

torch.manual_seed(1234)
out = {}


def put(case, **tensors):
    for k, v in tensors.items():
        out[f"{case}.{k}"] = v.detach().to(torch.float32).contiguous().clone()


def module_case(case, module, x):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        y = module(x)
    put(case, x=x, y=y, **dict(module.state_dict()))


module_case("linear", torch.nn.Linear(24, 40), torch.randn(2, 5, 24))
module_case("linear_nobias", torch.nn.Linear(16, 8, bias=False), torch.randn(3, 16))
module_case("conv", torch.nn.Conv2d(4, 6, 3, stride=1, padding=1), torch.randn(2, 4, 9, 7))
module_case("conv_s2", torch.nn.Conv2d(3, 5, 3, stride=2, padding=1), torch.randn(1, 3, 10, 8))
module_case("conv_1x1", torch.nn.Conv2d(6, 4, 1), torch.randn(2, 6, 5, 5))
module_case("layernorm", torch.nn.LayerNorm(32, eps=1e-6), torch.randn(2, 7, 32) * 3 + 1)
ln_plain = torch.nn.LayerNorm(32, eps=1e-6, elementwise_affine=False)
x = torch.randn(2, 7, 32) * 2 - 0.5
put("layernorm_plain", x=x, y=ln_plain(x))
module_case("groupnorm", torch.nn.GroupNorm(4, 8, eps=1e-6), torch.randn(2, 8, 5, 3) * 2 + 0.3)

# RMS norm as T5LayerNorm / Qwen RMSNorm: x * rsqrt(mean(x^2) + eps) * w
x = torch.randn(3, 4, 48)
w = torch.randn(48)
y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
put("rmsnorm", x=x, y=y, weight=w)

# Activations
x = torch.randn(4, 33) * 3
put("gelu_tanh", x=x, y=F.gelu(x, approximate="tanh"))
put("gelu_erf", x=x, y=F.gelu(x))
put("silu", x=x, y=F.silu(x))

# Attention: q [B, nq, H*d], k/v [B, nk, H*d], additive key-padding mask
B, nq, nk, H, d = 2, 7, 5, 4, 8
q, k, v = torch.randn(B, nq, H * d), torch.randn(B, nk, H * d), torch.randn(B, nk, H * d)


def sdpa(q, k, v, mask):
    sh = lambda t: t.view(B, -1, H, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(sh(q), sh(k), sh(v), attn_mask=mask)
    return o.transpose(1, 2).reshape(B, -1, H * d)


mask = torch.zeros(nq, nk)
mask[:, 3:] = float("-inf")  # the last two keys are padding
put("attn", q=q, k=k, v=v, y=sdpa(q, k, v, None))
put("attn_mask", q=q, k=k, v=v, mask=mask, y=sdpa(q, k, v, mask))

# Timestep embeddings (PixArt/DiT style and SD UNet style)
t = torch.tensor([0.0, 1.0, 250.5, 999.0])
put("tembed_flip", t=t, y=get_timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=0))
put("tembed_sd", t=t, y=get_timestep_embedding(t, 64, flip_sin_to_cos=False, downscale_freq_shift=1))

# 2D sin-cos position embedding (PixArt PatchEmbed), non-square grid
put("sincos2d", y=get_2d_sincos_pos_embed(32, (3, 5), base_size=4, interpolation_scale=2.0, output_type="pt"))
put("sincos2d_sq", y=get_2d_sincos_pos_embed(64, (6, 6), base_size=64, interpolation_scale=2.0, output_type="pt"))

# Rope over 3 axes (frame, h, w), applied to x [B, H, N, D] (diffusers layout)
axes = [4, 6, 6]
pos = torch.stack(torch.meshgrid(torch.arange(1.0), torch.arange(2.0), torch.arange(3.0), indexing="ij"), -1).reshape(-1, 3)
pos = pos + torch.tensor([0.0, 1.0, 2.0])
Bq, Hq, N, D = 1, 2, pos.shape[0], sum(axes)
x = torch.randn(Bq, Hq, N, D)
for name, unbind, rir in (("rope_interleaved", -1, True), ("rope_halves", -2, False)):
    cos, sin = [], []
    for i, ad in enumerate(axes):
        c, s = get_1d_rotary_pos_embed(ad, pos[:, i], theta=10000.0, use_real=True, repeat_interleave_real=rir)
        cos.append(c)
        sin.append(s)
    cos, sin = torch.cat(cos, -1), torch.cat(sin, -1)
    if unbind == -2:
        # diffusers' halves layout expects each axis' [cos | cos]; rebuild per axis in halves order
        cos_h, sin_h = [], []
        for i, ad in enumerate(axes):
            c, s = get_1d_rotary_pos_embed(ad, pos[:, i], theta=10000.0, use_real=True, repeat_interleave_real=False)
            cos_h.append(c[:, : ad // 2])
            sin_h.append(s[:, : ad // 2])
        ch, sh_ = torch.cat(cos_h, -1), torch.cat(sin_h, -1)
        cos, sin = torch.cat([ch, ch], -1), torch.cat([sh_, sh_], -1)
    y = apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=unbind)
    put(name, x=x, y=y, pos=pos)

os.makedirs("tests/fixtures/nn", exist_ok=True)
save_file(out, "tests/fixtures/nn/blocks.safetensors")
print(f"wrote {len(out)} tensors")
