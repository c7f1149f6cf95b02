#!/usr/bin/env python3
"""Golden fixtures for a full Qwen Image 2.1 text-to-image run (tests/qwen_image_pipeline.rs).

Run from the repository root (after qwen_tokenizer_fixtures.py):
    python3 tests/reference/qwen_image_pipeline_fixtures.py

Builds a tiny random-weight `QwenImage21Pipeline` with the real diffusers/transformers classes:
the tiny Qwen3-VL text model + tiny Qwen tokenizer of qwen3_te_fixtures.py (hidden 32), a
`QwenImage21Transformer2DModel` (2 heads x 16, 2 layers, 64 latent channels, text dim 32, rope
axes [4, 6, 6] = sd-cli's default split of head size 16) and an `AutoencoderKLQwenImage21`
(tiny widths, the real 64-channel latent with the released latents_mean / latents_std). The
scheduler is `FlowMatchEulerDiscreteScheduler` configured like sd-cli's `euler` + the `flux`
schedule with the Qwen Image 2.1 parameters (mu from the token count, anchors (256, 0.5) -
(8192, 0.9), exponential time shift, terminal 0.02). It runs 4 steps at 96x64 with
true_cfg_scale 4 and a negative prompt (two separate calls, each with its own K/V cache), seed 42
on a CPU generator, `output_type="np"`.

Writes tests/fixtures/qwen_image_pipeline/ (components as users have them):
  diffusion_model.safetensors   transformer weights, diffusers names
  vae.safetensors               VAE weights, diffusers names (64-channel latent: released stats)
  llm.safetensors               the language model as transformers saves it (model.language_model.*)
  tokenizer.json                the tiny tokenizer, beside the LLM file
  reference.safetensors         cond / uncond prompt embeds [L, 32], latent (final, transformer
                                space) [64, 4, 6], image [4, 64, 96] (RGBA in [0, 1])
"""
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen3_te_fixtures as te_fx  # noqa: E402

from diffusers import (  # noqa: E402
    AutoencoderKLQwenImage21,
    FlowMatchEulerDiscreteScheduler,
    QwenImage21Pipeline,
)
from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21Transformer2DModel  # noqa: E402

CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "qwen_image_pipeline")
PROMPT = "a lovely cat holding a sign says 'qwen2.1.cpp'"
NEGATIVE = "blurry, low quality"
SEED, STEPS, CFG, W, H = 42, 4, 4.0, 96, 64


def transformer(text_dim):
    torch.manual_seed(1)
    m = QwenImage21Transformer2DModel(
        patch_size=1, in_channels=64, out_channels=64, num_layers=2, attention_head_dim=16,
        num_attention_heads=2, context_in_dim=text_dim, mlp_ratio=3, axes_dims_rope=(4, 6, 6),
    ).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            elif name.endswith("text_norm.weight"):
                p.copy_(0.2 * torch.randn_like(p))
            else:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return m


def vae():
    torch.manual_seed(2)
    v = AutoencoderKLQwenImage21(base_dim=2, decoder_base_dim=3, z_dim=64, dim_mult=[1, 2, 4, 8, 8],
                                 num_res_blocks=1, temperal_downsample=[False, True, True, True],
                                 in_channels=4, out_channels=4).eval()
    with torch.no_grad():
        for name, p in v.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif name.endswith("gamma"):
                p.copy_(1.0 + torch.randn_like(p) * 0.2)
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
        # Keep most pixels inside (-1, 1) so the PNG comparison is not hidden by clamping.
        v.decoder.conv_out.weight.mul_(0.3)
    return v


def main():
    proc, vocab = te_fx.processor()
    te = te_fx.model(vocab)
    dit = transformer(te.config.text_config.hidden_size)
    ae = vae()
    sched = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=8192,
        base_shift=0.5, max_shift=0.9, shift_terminal=0.02, time_shift_type="exponential")
    pipe = QwenImage21Pipeline(scheduler=sched, vae=ae, text_encoder=te, processor=proc, transformer=dit)

    captured = {}
    orig_decode = ae.decode

    def decode_hook(z, *a, **k):
        captured["raw_latent"] = z.detach().clone()
        return orig_decode(z, *a, **k)

    ae.decode = decode_hook
    with torch.no_grad():
        cond, _, _ = pipe.encode_prompt(prompt=PROMPT, device="cpu")
        uncond, _, _ = pipe.encode_prompt(prompt=NEGATIVE, device="cpu")
        image = pipe(PROMPT, negative_prompt=NEGATIVE, true_cfg_scale=CFG, height=H, width=W,
                     num_inference_steps=STEPS, generator=torch.Generator().manual_seed(SEED),
                     output_type="np").images[0]
        # The same run without the K/V cache must agree (the cache is exact).
        image_nc = pipe(PROMPT, negative_prompt=NEGATIVE, true_cfg_scale=CFG, height=H, width=W,
                        num_inference_steps=STEPS, generator=torch.Generator().manual_seed(SEED),
                        output_type="np", use_kv_cache=False).images[0]
    ae.decode = orig_decode
    print("cache on/off max diff", float(np.abs(image - image_nc).max()))
    print("sigmas", sched.sigmas.tolist())

    raw = captured["raw_latent"][0, :, 0]  # [64, h, w], raw VAE latent
    m = torch.tensor(ae.config.latents_mean).view(64, 1, 1)
    s = torch.tensor(ae.config.latents_std).view(64, 1, 1)
    latent = (raw - m) / s

    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in dit.state_dict().items()}, f"{OUT}/diffusion_model.safetensors")
    save_file({k: v.contiguous() for k, v in ae.state_dict().items()}, f"{OUT}/vae.safetensors")
    sd = {k: v.contiguous() for k, v in te.state_dict().items() if k.startswith("model.language_model.")}
    save_file(sd, f"{OUT}/llm.safetensors")
    shutil.copy(os.path.join(te_fx.TOK, "tokenizer.json"), f"{OUT}/tokenizer.json")
    img = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
    save_file({
        "cond": cond[0].float().contiguous(),
        "uncond": uncond[0].float().contiguous(),
        "latent": latent.float().contiguous(),
        "image": img,
    }, f"{OUT}/reference.safetensors")
    sat = float(((image <= 0) | (image >= 1)).mean())
    print("image", image.shape, float(image.min()), float(image.max()), "saturated", sat,
          "cond", tuple(cond.shape), "uncond", tuple(uncond.shape), "|latent| max", float(latent.abs().max()))


if __name__ == "__main__":
    main()
