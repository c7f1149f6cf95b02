"""Reference side of benches/pixart_step.rs: writes a real-size random PixArt-Σ transformer
(28 layers, hidden 1152, caption 4096) in diffusers layout and times one diffusers fp32
forward at 512x512 with CFG (batch 2, 300 caption tokens) on the CPU.

python3 benches/pixart_step.py <dir> [threads]   -> prints "diffusers_s <secs> rss_mb <MB>"
"""
import os
import resource
import sys
import time

import torch
from diffusers import PixArtTransformer2DModel

out = sys.argv[1]
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = dict(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=28,
           cross_attention_dim=1152, caption_channels=4096, sample_size=128, patch_size=2,
           norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
           use_additional_conditions=False)
model = PixArtTransformer2DModel(**cfg).eval()
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
if not os.path.exists(os.path.join(out, "diffusion_pytorch_model.safetensors")):
    model.save_pretrained(out, safe_serialization=True, max_shard_size="10GB")
x = torch.randn(2, 4, 64, 64)
ctx = torch.randn(2, 300, 4096)
t = torch.tensor([999.0, 999.0])
with torch.no_grad():
    model(x, encoder_hidden_states=ctx, timestep=t, added_cond_kwargs={"resolution": None, "aspect_ratio": None})
    best = 1e9
    for _ in range(2):
        t0 = time.perf_counter()
        model(x, encoder_hidden_states=ctx, timestep=t, added_cond_kwargs={"resolution": None, "aspect_ratio": None})
        best = min(best, time.perf_counter() - t0)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"diffusers_s {best:.3f} rss_mb {rss:.0f}")
