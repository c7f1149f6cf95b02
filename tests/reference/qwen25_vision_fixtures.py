#!/usr/bin/env python3
"""Reference fixtures for the Qwen2.5-VL vision tower (tests/qwen25_vision_parity.rs).

A tiny random transformers `Qwen2_5_VLForConditionalGeneration` whose vision config is: depth 3,
hidden 32, 2 heads (head_dim 16), intermediate 40, out_hidden 24, patch 14, temporal patch 2,
merge 2, window_size 56 (windows of 2x2 merged units, so they split every test grid) and
fullatt_block_indexes [1] (blocks 0 and 2 are windowed). RMSNorm weights are randomised away
from 1. Images go through the real `Qwen2VLImageProcessorPil` configured like Qwen2.5-VL's
preprocessor_config.json (patch 14, CLIP mean/std, min_pixels 3136, max_pixels 12845056).

Cases (the processor keeps both sizes, already multiples of 28):
  tall  140x84 px -> grid 10x6 patches, 5x3 merged units: 3x2 windows, the last row and column
        of windows padded (uneven window sizes 4, 2, 4, 2, 2, 1)
  wide  56x112 px -> grid 4x8, 2x4 merged units: 1x2 full windows (transformers pads one more,
        empty, window row and column; they must change nothing)

Writes tests/fixtures/qwen25_vision/:
  hf/model.safetensors, hf/config.json  the vision weights as transformers 5 saves them
                                        (`model.visual.*`, f32) + the model config
  cases.safetensors  per case c: `{c}.rgb` (the u8 image minus 128 as i8 [h, w, 3]), `{c}.grid`
                     ([t, h, w] as f32),
                     `{c}.embeds` (pooler_output [n/4, 24], raster merge-block order);
                     for `wide` also `wide.pixel_values` (the processor's output in f16,
                     [32, 1176]: checks the patch order and normalisation, not bits)

Only the transformers layout is stored; the test derives the ComfyUI single-file layout
(`visual.*`, Conv3d kept 5-D) and a llama.cpp mmproj GGUF from it, to keep the fixtures small.

Needs: torch, transformers >= 5, pillow, numpy, safetensors.
Re-run: python3 tests/reference/qwen25_vision_fixtures.py
"""
import json
import os

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as qwen2_vl_pil

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "qwen25_vision")

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
CASES = [("tall", 140, 84), ("wide", 56, 112)]


def model():
    torch.manual_seed(0)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=64, hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                          "mrope_section": [2, 2, 2]}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=40, num_heads=2,
                           out_hidden_size=24, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1]),
    )
    m = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in m.model.visual.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn_like(p) / fan_in ** 0.5)
    return m


def processor():
    return qwen2_vl_pil.Qwen2VLImageProcessorPil(
        patch_size=14, temporal_patch_size=2, merge_size=2, image_mean=CLIP_MEAN,
        image_std=CLIP_STD, size={"shortest_edge": 3136, "longest_edge": 12845056})


def image(h, w, seed):
    rng = np.random.default_rng(seed)
    # Smooth gradients plus noise, so patches differ and the order matters.
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) % 256], axis=-1)
    noisy = base * 0.7 + rng.integers(0, 77, size=(h, w, 3))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def main():
    os.makedirs(os.path.join(OUT, "hf"), exist_ok=True)
    m = model()
    visual = m.model.visual
    vcfg = m.config.vision_config
    assert vcfg.rope_parameters["rope_theta"] == 10000.0, vcfg.rope_parameters

    sd = {k: v.contiguous() for k, v in m.state_dict().items() if k.startswith("model.visual.")}
    save_file(sd, os.path.join(OUT, "hf", "model.safetensors"))
    with open(os.path.join(OUT, "hf", "config.json"), "w") as f:
        json.dump(m.config.to_dict(), f, indent=1, default=str)

    proc = processor()
    out = {}
    for seed, (name, h, w) in enumerate(CASES):
        rgb = image(h, w, seed)
        feat = proc(images=[Image.fromarray(rgb)], return_tensors="pt")
        pv, grid = feat["pixel_values"], feat["image_grid_thw"]
        assert grid[0].tolist() == [1, h // 14, w // 14], grid
        with torch.no_grad():
            res = visual(pv, grid_thw=grid)
        # i8 (the store skips u8): value - 128.
        out[f"{name}.rgb"] = torch.from_numpy((rgb.astype(np.int16) - 128).astype(np.int8))
        out[f"{name}.grid"] = grid[0].float()
        out[f"{name}.embeds"] = res.pooler_output.contiguous()
        if name == "wide":
            out[f"{name}.pixel_values"] = pv.half().contiguous()
        print(name, (h, w), "grid", grid.tolist(), "max|embeds|", res.pooler_output.abs().max().item())
    save_file(out, os.path.join(OUT, "cases.safetensors"))


if __name__ == "__main__":
    main()
