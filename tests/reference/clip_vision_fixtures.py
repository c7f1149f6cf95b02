#!/usr/bin/env python3
"""Reference fixtures for the CLIP vision encoder (tests/clip_vision_parity.rs).

Two tiny random transformers towers, weights rounded to f16 and saved in f16 (the reference
runs in f32 on the rounded values, so loading them with `--type f32` is an exact f32 check;
loading them as they are is the f16 path real `clip_vision_h.safetensors` files take):

  h  `CLIPVisionModelWithProjection`: hidden 48, 3 heads (head size 16), 3 layers,
     intermediate 72, patch 4, image 32 (8x8 patches + class = 65 tokens), projection 24,
     hidden_act gelu (exact), layer_norm_eps 1e-5
  l  `CLIPVisionModel`: hidden 32, 2 heads, 2 layers, intermediate 40, patch 4, image 8
     (2x2 patches + class = 5 tokens), no projection, hidden_act quick_gelu,
     layer_norm_eps 1e-6

LayerNorm weights are randomised away from 1 and biases away from 0. Inputs are fixed random
pixel tensors (already normalised).

Writes tests/fixtures/clip_vision/:
  h/model.safetensors, h/config.json   tower h as `save_pretrained` names it (`vision_model.*`,
                                       `visual_projection.weight`), f16, + its config
  l/model.safetensors, l/config.json   tower l likewise (transformers 5 saves
                                       `CLIPVisionModel` without the `vision_model.` level)
  cases.safetensors:
    {t}.pixels        the input [1, 3, S, S] (f32)
    {t}.hidden_m2     `hidden_states[-2]`: after all layers but the last [tokens, hidden]
    {t}.last          `last_hidden_state` (= `hidden_states[-1]`, no post_layernorm)
    {t}.pooled        `pooler_output`: post_layernorm of the class token [hidden]
    h.image_embeds    `image_embeds`: the pooled output through `visual_projection` [24]
    pre.{c}.rgb       preprocessing case c: an 8-bit RGB image [h, w, 3] stored as i8 (value
                      - 128; the store skips u8)
    pre.{c}.pixels    stable-diffusion.cpp's `clip_preprocess` of it to 16x16, re-implemented
                      below in f32 numpy [3, 16, 16]

OpenCLIP: when `open_clip` imports (torchvision is stubbed if absent: only its
`FrozenBatchNorm2d` name is needed), tower h is also built as an `open_clip.VisionTransformer`
from the transformers weights renamed as `openclip_state_dict` below does, and its output must
equal transformers' `image_embeds`: that checks the OpenCLIP name map and the `x @ proj`
orientation the Rust test uses to derive its OpenCLIP-layout file (nothing more is stored).

Needs: torch, transformers >= 5, numpy, safetensors (open_clip_torch optional).
Re-run: python3 tests/reference/clip_vision_fixtures.py
"""
import json
import os
import sys
import types

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (CLIPVisionConfig, CLIPVisionModel,
                          CLIPVisionModelWithProjection)

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "clip_vision")

CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
PRE_SIZE = 16
# (name, width, height): wider (crop in x), tiny (upscaled), taller (crop in y), exact size.
PRE_CASES = [("wide", 50, 37), ("tiny", 7, 5), ("tall", 23, 61), ("square", 16, 16)]

TOWERS = {
    "h": dict(cls=CLIPVisionModelWithProjection,
              cfg=dict(hidden_size=48, intermediate_size=72, num_hidden_layers=3,
                       num_attention_heads=3, image_size=32, patch_size=4, projection_dim=24,
                       hidden_act="gelu", layer_norm_eps=1e-5)),
    "l": dict(cls=CLIPVisionModel,
              cfg=dict(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                       num_attention_heads=2, image_size=8, patch_size=4, hidden_act="quick_gelu",
                       layer_norm_eps=1e-6)),
}


def build(tag, seed):
    spec = TOWERS[tag]
    torch.manual_seed(seed)
    m = spec["cls"](CLIPVisionConfig(**spec["cfg"])).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "layer_norm" in name or "layrnorm" in name or "layernorm" in name:
                if name.endswith("weight"):
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
                else:
                    p.copy_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "class_embedding" in name or "position_embedding" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn_like(p) / fan_in ** 0.5)
            # The stored weights are f16; the reference runs on exactly those values.
            p.copy_(p.half().float())
    return m


def run(tag, m, pixels):
    with torch.no_grad():
        out = m(pixel_values=pixels, output_hidden_states=True)
        # `CLIPVisionModel` is the transformer itself; the projection model wraps one.
        vm = m.vision_model(pixel_values=pixels) if hasattr(m, "vision_model") else out
    hs = out.hidden_states
    assert len(hs) == m.config.num_hidden_layers + 1
    assert torch.equal(hs[-1], out.last_hidden_state)
    res = {
        f"{tag}.pixels": pixels,
        f"{tag}.hidden_m2": hs[-2][0],
        f"{tag}.last": out.last_hidden_state[0],
        f"{tag}.pooled": vm.pooler_output[0],
    }
    if hasattr(out, "image_embeds"):
        res[f"{tag}.image_embeds"] = out.image_embeds[0]
    return res


def upstream_preprocess(rgb, size):
    """stable-diffusion.cpp `clip_preprocess` (src/core/util.cpp) on `sd_image_to_tensor`'s
    [0, 1] floats: cover scale in f32, truncated sizes, nearest resize (input index
    o * in // out), centre crop at (resized - size) // 2, clamp, CLIP mean/std."""
    h, w, _ = rgb.shape
    img = rgb.astype(np.float32) / np.float32(255.0)
    s = np.float32(size)
    scale = max(s / np.float32(w), s / np.float32(h))
    rw, rh = int(np.float32(scale * np.float32(w))), int(np.float32(scale * np.float32(h)))
    assert rw >= size and rh >= size, (w, h, rw, rh)
    ys = np.arange(rh) * h // rh
    xs = np.arange(rw) * w // rw
    resized = img[ys][:, xs]
    y0, x0 = (rh - size) // 2, (rw - size) // 2
    crop = np.clip(resized[y0:y0 + size, x0:x0 + size], np.float32(0), np.float32(1))
    out = (crop - CLIP_MEAN) / CLIP_STD
    return np.ascontiguousarray(out.transpose(2, 0, 1).astype(np.float32))


def image(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x * 7 + y * 3) % 256],
                    axis=-1)
    return np.clip(base * 0.6 + rng.integers(0, 100, size=(h, w, 3)), 0, 255).astype(np.uint8)


def import_open_clip():
    """open_clip's `VisionTransformer` without the package's `__init__` (which needs
    torchvision and more): a bare package object stands in for it, and torchvision's one
    name that `open_clip.utils` imports is stubbed when torchvision is absent."""
    import importlib.util
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        print("open_clip not installed: OpenCLIP map not cross-checked")
        return None
    try:
        import torchvision  # noqa: F401
    except ImportError:
        misc = types.ModuleType("torchvision.ops.misc")
        misc.FrozenBatchNorm2d = torch.nn.BatchNorm2d
        ops = types.ModuleType("torchvision.ops")
        ops.misc = misc
        tv = types.ModuleType("torchvision")
        tv.ops = ops
        sys.modules.update({"torchvision": tv, "torchvision.ops": ops,
                            "torchvision.ops.misc": misc})
    pkg = types.ModuleType("open_clip")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules.setdefault("open_clip", pkg)
    try:
        from open_clip.transformer import VisionTransformer
        return VisionTransformer
    except Exception as e:  # noqa: BLE001
        print("open_clip unusable, OpenCLIP map not cross-checked:", e)
        return None


def openclip_state_dict(sd, layers):
    """transformers CLIPVisionModelWithProjection names → open_clip VisionTransformer names."""
    v = "vision_model."
    out = {
        "conv1.weight": sd[v + "embeddings.patch_embedding.weight"],
        "class_embedding": sd[v + "embeddings.class_embedding"],
        "positional_embedding": sd[v + "embeddings.position_embedding.weight"],
        "ln_pre.weight": sd[v + "pre_layrnorm.weight"],
        "ln_pre.bias": sd[v + "pre_layrnorm.bias"],
        "ln_post.weight": sd[v + "post_layernorm.weight"],
        "ln_post.bias": sd[v + "post_layernorm.bias"],
        "proj": sd["visual_projection.weight"].t().contiguous(),
    }
    for i in range(layers):
        hf = f"{v}encoder.layers.{i}."
        oc = f"transformer.resblocks.{i}."
        for leaf in ("weight", "bias"):
            out[oc + "attn.in_proj_" + leaf] = torch.cat(
                [sd[hf + f"self_attn.{p}_proj.{leaf}"] for p in "qkv"], 0)
            for a, b in (("layer_norm1", "ln_1"), ("layer_norm2", "ln_2"),
                         ("self_attn.out_proj", "attn.out_proj"), ("mlp.fc1", "mlp.c_fc"),
                         ("mlp.fc2", "mlp.c_proj")):
                out[f"{oc}{b}.{leaf}"] = sd[f"{hf}{a}.{leaf}"]
    return out


def check_openclip(m, pixels, want):
    VisionTransformer = import_open_clip()
    if VisionTransformer is None:
        return
    c = m.config
    oc = VisionTransformer(image_size=c.image_size, patch_size=c.patch_size, width=c.hidden_size,
                           layers=c.num_hidden_layers, heads=c.num_attention_heads,
                           mlp_ratio=c.intermediate_size / c.hidden_size,
                           output_dim=c.projection_dim, act_layer=torch.nn.GELU).eval()
    missing = oc.load_state_dict(openclip_state_dict(m.state_dict(), c.num_hidden_layers),
                                 strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    with torch.no_grad():
        got = oc(pixels)
    err = (got[0] - want).abs().max().item()
    print("open_clip VisionTransformer vs transformers image_embeds: max abs err", err)
    assert err < 1e-5, err


def save_tower(tag, m):
    d = os.path.join(OUT, tag)
    os.makedirs(d, exist_ok=True)
    sd = {k: v.half().contiguous() for k, v in m.state_dict().items()}
    save_file(sd, os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(m.config.to_dict(), f, indent=1, default=str)
    print(tag, "tensors:", sorted(sd)[:3], "...", len(sd))


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = {}
    for seed, tag in enumerate(TOWERS):
        m = build(tag, seed)
        save_tower(tag, m)
        s = m.config.image_size
        g = torch.Generator().manual_seed(100 + seed)
        pixels = torch.randn(1, 3, s, s, generator=g) * 1.5
        res = run(tag, m, pixels)
        for k, v in res.items():
            print(k, tuple(v.shape), "max|.|", v.abs().max().item())
        cases.update(res)
        if tag == "h":
            check_openclip(m, pixels, res["h.image_embeds"])

    for seed, (name, w, h) in enumerate(PRE_CASES):
        rgb = image(h, w, 10 + seed)
        cases[f"pre.{name}.rgb"] = torch.from_numpy((rgb.astype(np.int16) - 128).astype(np.int8))
        cases[f"pre.{name}.pixels"] = torch.from_numpy(upstream_preprocess(rgb, PRE_SIZE))
    save_file({k: v.contiguous() for k, v in cases.items()}, os.path.join(OUT, "cases.safetensors"))
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print("fixtures:", total, "bytes")


if __name__ == "__main__":
    main()
