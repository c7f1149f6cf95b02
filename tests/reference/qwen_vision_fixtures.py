#!/usr/bin/env python3
"""Reference fixtures for the Qwen3-VL vision tower (tests/qwen_vision_parity.rs).

A tiny random transformers `Qwen3VLForConditionalGeneration` whose vision config is: depth 3,
hidden 32, 2 heads (head_dim 16), intermediate 48, out_hidden 32, patch 16, temporal patch 2,
merge 2, 36 learned positions (a 6x6 grid, so the bilinear resampling is exercised),
deepstack layers [0, 2]. LayerNorm weights/biases are randomised away from 1/0. Images go
through the real `Qwen2VLImageProcessorPil` configured like Qwen3-VL's preprocessor_config.json
(patch 16, mean/std 0.5) except min_pixels = 1024 so tiny images stay tiny.

Writes tests/fixtures/qwen_vision/:
  hf/model.safetensors, hf/config.json  the vision weights as transformers 5 saves them
                                        (`model.visual.*`) + the model config
  mmproj.gguf     the same weights as llama.cpp's convert_hf_to_gguf.py writes a Qwen3-VL
                  mmproj (`v.blk.N.attn_qkv`, the Conv3d split into `v.patch_embd.weight` and
                  `v.patch_embd.weight.1`, `mm.0`/`mm.2`, `v.post_ln`, `v.deepstack.L.*` with the
                  absolute layer index L), all f32, with its `clip.vision.*` metadata
  cases.safetensors   per case c: `{c}.rgb` (the input image, u8 values as f16 [h, w, 3]; not
                      for the case that the processor resizes),
                      `{c}.pixel_values` [n, 1536], `{c}.grid` ([t, h, w] as f32),
                      `{c}.embeds` (pooler_output [n/4, 32]), `{c}.deepstack{j}` (deepstack
                      feature j [n/4, 32]), `{c}.hidden` (last_hidden_state [n, 32])
  smart_resize.json   [[h, w, min_pixels, max_pixels, out_h | null, out_w | null], ...] from
                      transformers' smart_resize (factor 32); null when it raises

Needs: torch, transformers >= 5, pillow, numpy, safetensors, gguf.
Re-run: python3 tests/reference/qwen_vision_fixtures.py
"""
import json
import os

import numpy as np
import torch
import gguf
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as qwen2_vl_pil

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "qwen_vision")

DEEPSTACK = [0, 2]
# (name, height, width): two sizes already at a multiple of 32 (patchify is checked on them), one
# that smart_resize has to round (the vision model still runs on the processor's output).
CASES = [("wide", 64, 96), ("tall", 96, 64), ("odd", 45, 100)]


def model():
    torch.manual_seed(0)
    cfg = Qwen3VLConfig(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                          "mrope_section": [4, 2, 2], "mrope_interleaved": True}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                           num_position_embeddings=36, deepstack_visual_indexes=DEEPSTACK),
    )
    m = Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in m.model.visual.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "norm" in name and name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "pos_embed" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn_like(p) / fan_in ** 0.5)
    return m


def processor():
    return qwen2_vl_pil.Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 1024, "longest_edge": 16777216})


def image(h, w, seed):
    rng = np.random.default_rng(seed)
    # Smooth gradients plus noise, so patches differ and the order matters.
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) % 256], axis=-1)
    noisy = base * 0.7 + rng.integers(0, 77, size=(h, w, 3))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def gguf_name(name):
    """llama.cpp mmproj names (convert_hf_to_gguf.py Qwen3VLVisionModel) of one `visual.*` tensor;
    returns a list of (name, fn(tensor) -> tensor)."""
    rest = name[len("model.visual."):]
    if rest == "patch_embed.proj.weight":
        return [("v.patch_embd.weight", lambda t: t[:, :, 0]), ("v.patch_embd.weight.1", lambda t: t[:, :, 1])]
    if rest == "patch_embed.proj.bias":
        return [("v.patch_embd.bias", None)]
    if rest == "pos_embed.weight":
        return [("v.position_embd.weight", None)]
    parts = rest.split(".")
    if parts[0] == "blocks":
        i, tail = parts[1], ".".join(parts[2:])
        short = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out",
                 "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down"}
        mod, leaf = tail.rsplit(".", 1)
        return [(f"v.blk.{i}.{short[mod]}.{leaf}", None)]
    if parts[0] == "merger":
        mod, leaf = parts[1], parts[2]
        return [({"norm": "v.post_ln", "linear_fc1": "mm.0", "linear_fc2": "mm.2"}[mod] + "." + leaf, None)]
    if parts[0] == "deepstack_merger_list":
        layer = DEEPSTACK[int(parts[1])]
        mod, leaf = parts[2], parts[3]
        return [(f"v.deepstack.{layer}." + {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}[mod]
                 + "." + leaf, None)]
    raise ValueError(name)


def write_gguf(sd, vcfg, path):
    w = gguf.GGUFWriter(path, "clip")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "qwen3vl_merger")
    w.add_uint32("clip.vision.image_size", int(vcfg.num_position_embeddings ** 0.5 * vcfg.patch_size))
    w.add_uint32("clip.vision.patch_size", vcfg.patch_size)
    w.add_uint32("clip.vision.embedding_length", vcfg.hidden_size)
    w.add_uint32("clip.vision.feed_forward_length", vcfg.intermediate_size)
    w.add_uint32("clip.vision.projection_dim", vcfg.out_hidden_size)
    w.add_uint32("clip.vision.block_count", vcfg.depth)
    w.add_uint32("clip.vision.attention.head_count", vcfg.num_heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.spatial_merge_size", vcfg.spatial_merge_size)
    w.add_array("clip.vision.is_deepstack_layers", [i in DEEPSTACK for i in range(vcfg.depth)])
    for name, t in sd.items():
        for new, fn in gguf_name(name):
            v = fn(t) if fn else t
            w.add_tensor(new, v.contiguous().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def smart_resize_cases():
    combos = [
        (64, 96, 1024, 16777216), (96, 64, 1024, 16777216), (45, 100, 1024, 16777216),
        (224, 224, 65536, 16777216), (480, 640, 65536, 16777216), (1080, 1920, 65536, 16777216),
        (4000, 3000, 65536, 16777216), (8192, 8192, 65536, 16777216), (10, 10, 65536, 16777216),
        (1, 150, 65536, 16777216), (1, 300, 65536, 16777216), (33, 47, 1024, 4096),
        (48, 48, 1024, 16777216), (80, 80, 1024, 16777216), (16, 16, 1024, 16777216),
        (1000, 7, 65536, 1048576), (333, 777, 200704, 1003520), (3840, 2160, 65536, 1048576),
        (500, 499, 3136, 12845056), (17, 3399, 65536, 16777216), (112, 80, 4096, 8192),
    ]
    out = []
    for h, w, lo, hi in combos:
        try:
            rh, rw = qwen2_vl_pil.smart_resize(h, w, factor=32, min_pixels=lo, max_pixels=hi)
        except ValueError:
            rh, rw = None, None
        out.append([h, w, lo, hi, rh, rw])
    return out


def main():
    os.makedirs(os.path.join(OUT, "hf"), exist_ok=True)
    m = model()
    visual = m.model.visual
    vcfg = m.config.vision_config
    inv = visual.rotary_pos_emb.inv_freq
    assert torch.allclose(inv, 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)), inv

    sd = {k: v.contiguous() for k, v in m.state_dict().items() if k.startswith("model.visual.")}
    save_file(sd, os.path.join(OUT, "hf", "model.safetensors"))
    with open(os.path.join(OUT, "hf", "config.json"), "w") as f:
        json.dump(m.config.to_dict(), f, indent=1, default=str)
    write_gguf(sd, vcfg, os.path.join(OUT, "mmproj.gguf"))

    proc = processor()
    out = {}
    for seed, (name, h, w) in enumerate(CASES):
        rgb = image(h, w, seed)
        feat = proc(images=[Image.fromarray(rgb)], return_tensors="pt")
        pv, grid = feat["pixel_values"], feat["image_grid_thw"]
        with torch.no_grad():
            res = visual(pv, grid_thw=grid)
        if name != "odd":
            # u8 values are exact in f16.
            out[f"{name}.rgb"] = torch.from_numpy(rgb.astype(np.float16))
        out[f"{name}.pixel_values"] = pv.float().contiguous()
        out[f"{name}.grid"] = grid[0].float()
        out[f"{name}.embeds"] = res.pooler_output.contiguous()
        out[f"{name}.hidden"] = res.last_hidden_state.contiguous()
        for j, d in enumerate(res.deepstack_features):
            out[f"{name}.deepstack{j}"] = d.contiguous()
        print(name, (h, w), "grid", grid.tolist(), "max|embeds|", res.pooler_output.abs().max().item())
    save_file(out, os.path.join(OUT, "cases.safetensors"))
    with open(os.path.join(OUT, "smart_resize.json"), "w") as f:
        json.dump(smart_resize_cases(), f)


if __name__ == "__main__":
    main()
