#!/usr/bin/env python3
"""Golden fixtures for Qwen Image 2.1 editing with reference images (tests/qwen_edit_pipeline.rs).

Run from the repository root (after qwen_tokenizer_fixtures.py):
    python3 tests/reference/qwen_edit_pipeline_fixtures.py

A tiny random-weight `QwenImage21Pipeline` with the real diffusers/transformers classes: the tiny
Qwen3-VL of qwen3_te_fixtures.py (text hidden 32) with a real vision tower (depth 2, hidden 32,
2 heads, deepstack after blocks 0 and 1, 6x6 learned position grid, patch 16, merge 2), the
transformer and VAE of qwen_image_pipeline_fixtures.py, and a Qwen3-VL image processor
(patch 16, mean/std 0.5) whose min_pixels is lowered to 1024 so tiny references pass through
unchanged. References: `ref_rgb.png` (80x48 RGB) and `ref_rgba.png` (40x56 RGBA with varied alpha).
The target is W x H = 96 x 64 and the references are resized to that area
(`output_resolution` = sqrt(W*H)), as sd-cli does. Runs: one reference (`one`) and both
(`two`), each with true CFG 4 and a negative prompt, 4 Euler steps on the Qwen Image 2.1 flux
schedule, seed 42 on a CPU generator, `output_type="np"`.

Writes tests/fixtures/qwen_edit_pipeline/:
  diffusion_model.safetensors, vae.safetensors   (as qwen_image_pipeline)
  llm.safetensors          the language model (model.language_model.*)
  llm_vision/              the vision tower as transformers saves it (model.visual.*) with a
                           config.json holding its vision_config
  mmproj.gguf              the vision tower under llama.cpp's mmproj names
  tokenizer.json, preprocessor_config.json   beside the LLM file
  ref_rgb.png, ref_rgba.png
  reference.safetensors    per run r in (one, two): `{r}.cond` / `{r}.uncond` prompt embeds,
                           `{r}.cond_pads` image-slot mask, `{r}.ref{i}` normalised reference
                           latents [64, h, w], `{r}.latent` final latent [64, 4, 6],
                           `{r}.image` [4, 64, 96] RGBA in [0, 1]
                           `outres.image` [4, 32, 64]: ref_rgb.png, a 64x32 output with diffusers'
                           `output_resolution=96` (the reference resized to 96^2 pixels' area)
"""
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen3_te_fixtures as te_fx  # noqa: E402
import qwen_image_pipeline_fixtures as t2i_fx  # noqa: E402

from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline  # noqa: E402
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor  # noqa: E402
import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as qwen2_vl_pil  # noqa: E402

CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "qwen_edit_pipeline")
PROMPT = "change 'qwen2.1.cpp' to 'sd.cpp'"
NEGATIVE = "blurry, low quality"
SEED, STEPS, CFG, W, H = 42, 4, 4.0, 96, 64
OUTRES = 96
MIN_PIXELS, MAX_PIXELS = 1024, 16777216


def processor():
    from transformers import Qwen2Tokenizer
    tok = Qwen2Tokenizer.from_pretrained(te_fx.TOK)
    orig = Qwen3VLProcessor.check_argument_for_proper_class

    def check(self, name, arg):
        return None if arg is None else orig(self, name, arg)

    Qwen3VLProcessor.check_argument_for_proper_class = check
    ip = qwen2_vl_pil.Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})
    return Qwen3VLProcessor(image_processor=ip, tokenizer=tok, video_processor=None,
                            chat_template=te_fx.CHAT_TEMPLATE), len(tok)


def text_encoder(vocab, tok):
    torch.manual_seed(0)
    ids = {f"{k}_token_id": tok.convert_tokens_to_ids(t) for k, t in [
        ("image", "<|image_pad|>"), ("video", "<|video_pad|>"), ("vision_start", "<|vision_start|>"),
        ("vision_end", "<|vision_end|>")]}
    cfg = Qwen3VLConfig(
        **ids,
        text_config=dict(
            vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            # transformers' default sections, which a tiny model keeps unless told otherwise:
            # they cover more than head_dim/2 = 8 frequencies, the excess unused.
            rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                             "mrope_section": [24, 20, 20], "mrope_interleaved": True},
            max_position_embeddings=4096,
        ),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                           num_position_embeddings=36, deepstack_visual_indexes=[0, 1]),
    )
    m = Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "norm" in name and name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "language_model" in name:
                p.copy_(0.15 * torch.randn_like(p))
            elif "visual" in name and p.ndim >= 2:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
    return m


def make_refs():
    g = np.random.default_rng(7)
    yy, xx = np.mgrid[0:48, 0:80]
    rgb = np.stack([xx * 3, yy * 5, (xx + yy) * 2], -1) % 256
    rgb = np.clip(rgb + g.integers(-20, 20, rgb.shape), 0, 255).astype(np.uint8)
    yy, xx = np.mgrid[0:56, 0:40]
    rgba = np.stack([yy * 4, 255 - xx * 6, (xx * yy) % 256, np.clip(xx * 7 + yy * 2 - 40, 0, 255)], -1)
    rgba = np.clip(rgba + g.integers(-10, 10, rgba.shape) * (np.arange(4) < 3), 0, 255).astype(np.uint8)
    return Image.fromarray(rgb, "RGB"), Image.fromarray(rgba, "RGBA")


def main():
    proc, vocab = processor()
    te = text_encoder(vocab, proc.tokenizer)
    dit = t2i_fx.transformer(te.config.text_config.hidden_size)
    ae = t2i_fx.vae()
    sched = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=8192,
        base_shift=0.5, max_shift=0.9, shift_terminal=0.02, time_shift_type="exponential")
    pipe = QwenImage21Pipeline(scheduler=sched, vae=ae, text_encoder=te, processor=proc, transformer=dit)
    ref_rgb, ref_rgba = make_refs()

    captured = {}
    orig_decode, orig_encode_prompt, orig_prepare = ae.decode, pipe.encode_prompt, pipe.prepare_latents

    def decode_hook(z, *a, **k):
        captured["raw_latent"] = z.detach().clone()
        return orig_decode(z, *a, **k)

    def encode_prompt_hook(*a, **k):
        out = orig_encode_prompt(*a, **k)
        captured.setdefault("embeds", []).append(out)
        return out

    def prepare_hook(*a, **k):
        latents, image_latents = orig_prepare(*a, **k)
        captured["image_latents"] = image_latents
        return latents, image_latents

    ae.decode, pipe.encode_prompt, pipe.prepare_latents = decode_hook, encode_prompt_hook, prepare_hook
    out = {}
    for run, refs in {"one": [ref_rgb], "two": [ref_rgb, ref_rgba]}.items():
        captured.clear()
        with torch.no_grad():
            image = pipe(PROMPT, image=refs, negative_prompt=NEGATIVE, true_cfg_scale=CFG, height=H, width=W,
                         num_inference_steps=STEPS, generator=torch.Generator().manual_seed(SEED),
                         output_type="np", output_resolution=math.sqrt(W * H)).images[0]
            image_nc = pipe(PROMPT, image=refs, negative_prompt=NEGATIVE, true_cfg_scale=CFG, height=H,
                            width=W, num_inference_steps=STEPS, generator=torch.Generator().manual_seed(SEED),
                            output_type="np", output_resolution=math.sqrt(W * H), use_kv_cache=False).images[0]
        print(run, "cache on/off max diff", float(np.abs(image - image_nc).max()))
        (cond, _, cond_pads), (uncond, _, _) = captured["embeds"][:2]
        raw = captured["raw_latent"][0, :, 0]
        m = torch.tensor(ae.config.latents_mean).view(64, 1, 1)
        s = torch.tensor(ae.config.latents_std).view(64, 1, 1)
        out[f"{run}.cond"] = cond[0].float().contiguous()
        out[f"{run}.uncond"] = uncond[0].float().contiguous()
        out[f"{run}.cond_pads"] = cond_pads[0].float().contiguous()
        out[f"{run}.latent"] = ((raw - m) / s).float().contiguous()
        out[f"{run}.image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
        # Packed reference latents [1, sum(h*w), 64] back to [64, h, w] per reference.
        packed = captured["image_latents"][0]
        start = 0
        for i, ref in enumerate(refs):
            from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions
            rw, rh, _ = calculate_dimensions(W * H, ref.size[0] / ref.size[1])
            h, w = rh // 16, rw // 16
            out[f"{run}.ref{i}"] = packed[start:start + h * w].reshape(h, w, 64).permute(2, 0, 1).contiguous()
            start += h * w
        print(run, "cond", tuple(cond.shape), "pads", int(cond_pads.sum()), "image", image.shape,
              "range", float(image.min()), float(image.max()))

    # diffusers' own reference area: `output_resolution` (default 1024) squared whatever the output
    # size, where sd-cli takes the output's area (`--ref-image-args ref_resolution=N` reproduces it).
    with torch.no_grad():
        image = pipe(PROMPT, image=[ref_rgb], negative_prompt=NEGATIVE, true_cfg_scale=CFG, height=32, width=64,
                     num_inference_steps=STEPS, generator=torch.Generator().manual_seed(SEED),
                     output_type="np", output_resolution=OUTRES).images[0]
    out["outres.image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()

    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in dit.state_dict().items()}, f"{OUT}/diffusion_model.safetensors")
    save_file({k: v.contiguous() for k, v in ae.state_dict().items()}, f"{OUT}/vae.safetensors")
    sd = te.state_dict()
    save_file({k: v.contiguous() for k, v in sd.items() if k.startswith("model.language_model.")},
              f"{OUT}/llm.safetensors")
    # The vision tower as a folder with its config (head count and deepstack layers are not
    # in the weight shapes).
    os.makedirs(f"{OUT}/llm_vision", exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items() if k.startswith("model.visual.")},
              f"{OUT}/llm_vision/model.safetensors")
    with open(f"{OUT}/llm_vision/config.json", "w") as f:
        json.dump({"model_type": "qwen3_vl", "vision_config": te.config.vision_config.to_dict()}, f, indent=1,
                  default=str)
    shutil.copy(os.path.join(te_fx.TOK, "tokenizer.json"), f"{OUT}/tokenizer.json")
    with open(f"{OUT}/preprocessor_config.json", "w") as f:
        json.dump({"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                   "image_std": [0.5] * 3, "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
                   "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor"},
                  f, indent=1)
    # The same tower as a llama.cpp mmproj GGUF (names as qwen_vision_fixtures.py writes them).
    import qwen_vision_fixtures as vis_fx
    vis_fx.DEEPSTACK = list(te.config.vision_config.deepstack_visual_indexes)
    vis_fx.write_gguf({k: v.contiguous() for k, v in sd.items() if k.startswith("model.visual.")},
                      te.config.vision_config, f"{OUT}/mmproj.gguf")
    ref_rgb.save(f"{OUT}/ref_rgb.png")
    ref_rgba.save(f"{OUT}/ref_rgba.png")
    save_file(out, f"{OUT}/reference.safetensors")


if __name__ == "__main__":
    main()
