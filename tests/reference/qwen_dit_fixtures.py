"""Golden fixtures for the Qwen Image 2.1 transformer (tests/qwen_dit_parity.rs).

Run from the repository root:  python3 tests/reference/qwen_dit_fixtures.py
Builds a tiny random-weight diffusers `QwenImage21Transformer2DModel` (2 heads x 16, 2 layers,
16 latent channels, text dim 24, rope axes [4, 6, 6]), runs text-to-image forwards on CPU in
f32 and writes, under tests/fixtures/qwen_dit/:

- `weights.safetensors`: diffusers weights (split SwiGLU `img_mlp.proj` / `img_mlp.gate_layer`).
- `weights_fused.safetensors`: the same weights as a single-file checkpoint: prefix
  `model.diffusion_model.` and a fused `img_mlp.gate_up` = cat([gate_layer, proj]) (the
  layout stable-diffusion.cpp also loads).
- `cases.safetensors`: per case `<case>.x` latent [B, C, H, W] (ggml [W, H, C, B]),
  `<case>.text` [B, L, text_dim], `<case>.t` [B] (sigma in [0, 1]) and the reference velocity
  `<case>.out` [B, C, H, W]. Cases: `b1` (4x6 tokens, L=5, t=0.37), `b2` (batch 2, t=[0.37,
  0.81], same layout), `b1_late` (`b1` with only its last text token changed: the text
  queries are causal, so earlier text K/V are unchanged).

Packing (diffusers pipeline): tokens are the (h, w) raster of the latent, channels last.
"""
import os

import torch
from safetensors.torch import save_file
from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21Transformer2DModel

OUT_DIR = "tests/fixtures/qwen_dit"
H, W, L, C, TEXT_DIM = 4, 6, 5, 16, 24


def build():
    torch.manual_seed(0)
    model = QwenImage21Transformer2DModel(
        patch_size=1,
        in_channels=C,
        out_channels=C,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        context_in_dim=TEXT_DIM,
        mlp_ratio=3,
        axes_dims_rope=(4, 6, 6),
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            elif name.endswith("text_norm.weight"):
                p.copy_(0.2 * torch.randn_like(p))  # zero-centred: effective scale 1 + w
            else:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return model


def run(model, x, text, t):
    b = x.shape[0]
    tokens = x.permute(0, 2, 3, 1).reshape(b, H * W, C)  # raster (h, w), channels last
    img_mask = torch.tensor([[False] * L + [True] * (H * W // 4)] * b)
    with torch.no_grad():
        out = model(
            hidden_states=tokens,
            encoder_hidden_states=text,
            timestep=t,
            img_shapes=[[(1, H, W)]] * b,
            img_mask=img_mask,
            return_dict=False,
        )[0]
    out = out[:, -H * W :]  # the pipeline keeps the target-image rows
    return out.reshape(b, H, W, C).permute(0, 3, 1, 2).contiguous()


def run_refs(model, refs, x, text, pads, t, kv=None):
    """Edit layout: condition latents `refs` [(1, C, h, w)] whose 2x2 slots sit at the text
    rows flagged in `pads`, then the target `x`."""
    tokens = [r.permute(0, 2, 3, 1).reshape(1, -1, C) for r in refs + [x]]
    shapes = [(1, r.shape[2], r.shape[3]) for r in refs + [x]]
    img_mask = torch.tensor([pads + [True] * (x.shape[2] * x.shape[3] // 4)])
    with torch.no_grad():
        out = model(
            hidden_states=torch.cat(tokens, 1),
            encoder_hidden_states=text,
            timestep=t,
            img_shapes=[shapes],
            img_mask=img_mask,
            return_dict=False,
        )[0]
    n = x.shape[2] * x.shape[3]
    return out[:, -n:].reshape(1, x.shape[2], x.shape[3], C).permute(0, 3, 1, 2).contiguous()


def ref_cases(model, g):
    """`r1`: one 4x4 condition latent (4 slots) after 2 text rows, 3 text rows after it;
    `r2`: a 2x4 and a 4x2 condition latent (2 slots each) with text between; target 4x6."""
    out = {}
    x = torch.randn(1, C, H, W, generator=g)
    layouts = {
        "r1": ([(4, 4)], [False, False] + [True] * 4 + [False] * 3),
        "r2": ([(2, 4), (4, 2)], [False] + [True] * 2 + [False] * 2 + [True] * 2 + [False] * 2),
    }
    for name, (sizes, pads) in layouts.items():
        refs = [torch.randn(1, C, h, w, generator=g) for h, w in sizes]
        text = torch.randn(1, len(pads), TEXT_DIM, generator=g)
        t = torch.tensor([0.63])
        for i, r in enumerate(refs):
            out[f"{name}.ref{i}"] = r.clone()
        out[f"{name}.x"] = x.clone()
        out[f"{name}.text"] = text.clone()
        out[f"{name}.pads"] = torch.tensor([float(p) for p in pads])
        out[f"{name}.t"] = t
        out[f"{name}.out"] = run_refs(model, refs, x, text, pads, t)
        # Cached decode must agree with the full sequence (diffusers' own cache).
        from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache
        cache = QwenImage21KVCache(len(model.transformer_blocks))
        first = run_refs_kv(model, refs, x, text, pads, t, cache, "extract")
        second = run_refs_kv(model, refs, x, text, pads, torch.tensor([0.2]), cache, "cached")
        out[f"{name}.out_t02"] = run_refs(model, refs, x, text, pads, torch.tensor([0.2]))
        assert (first - out[f"{name}.out"]).abs().max() < 1e-4
        assert (second - out[f"{name}.out_t02"]).abs().max() < 1e-4
        print(name, "max |out|", out[f"{name}.out"].abs().max().item())
    return out


def run_refs_kv(model, refs, x, text, pads, t, cache, mode):
    tokens = [r.permute(0, 2, 3, 1).reshape(1, -1, C) for r in refs + [x]]
    shapes = [(1, r.shape[2], r.shape[3]) for r in refs + [x]]
    img_mask = torch.tensor([pads + [True] * (x.shape[2] * x.shape[3] // 4)])
    with torch.no_grad():
        out = model(hidden_states=torch.cat(tokens, 1), encoder_hidden_states=text, timestep=t,
                    img_shapes=[shapes], img_mask=img_mask, kv_cache=cache, kv_cache_mode=mode,
                    return_dict=False)[0]
    n = x.shape[2] * x.shape[3]
    return out[:, -n:].reshape(1, x.shape[2], x.shape[3], C).permute(0, 3, 1, 2).contiguous()


def fused(sd):
    out = {}
    for k, v in sd.items():
        if ".img_mlp.proj." in k or ".img_mlp.gate_layer." in k:
            continue
        out["model.diffusion_model." + k] = v
    layers = {k.split(".")[1] for k in sd if k.startswith("transformer_blocks.")}
    for i in layers:
        p = f"transformer_blocks.{i}.img_mlp."
        out["model.diffusion_model." + p + "gate_up.weight"] = torch.cat(
            [sd[p + "gate_layer.weight"], sd[p + "proj.weight"]], 0
        )
    return out


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    model = build()
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(sd, f"{OUT_DIR}/weights.safetensors")
    save_file(fused(sd), f"{OUT_DIR}/weights_fused.safetensors")

    g = torch.Generator().manual_seed(1)
    cases = {}
    x2 = torch.randn(2, C, H, W, generator=g)
    text2 = torch.randn(2, L, TEXT_DIM, generator=g)
    t2 = torch.tensor([0.37, 0.81])
    late = text2[:1].clone()
    late[:, -1] = torch.randn(TEXT_DIM, generator=g)
    for name, (x, text, t) in {
        "b1": (x2[:1], text2[:1], t2[:1]),
        "b2": (x2, text2, t2),
        "b1_late": (x2[:1], late, t2[:1]),
    }.items():
        cases[f"{name}.x"] = x.clone()
        cases[f"{name}.text"] = text.clone()
        cases[f"{name}.t"] = t.clone()
        cases[f"{name}.out"] = run(model, x, text, t)
    save_file(cases, f"{OUT_DIR}/cases.safetensors")
    save_file(ref_cases(model, g), f"{OUT_DIR}/cases_refs.safetensors")
    for k in ("b1", "b2", "b1_late"):
        print(k, "max |out|", cases[f"{k}.out"].abs().max().item())


if __name__ == "__main__":
    main()
