"""Reference side of benches/wan_vae_decode.rs: writes a random Wan 2.1 VAE at the released size
(AutoencoderKLWan defaults: base 96, dim_mult [1, 2, 4, 4], 2 resnets per level, z 16) and times one
diffusers fp32 decode of a 480x832 latent with T latent frames (1 + 4(T - 1) frames) on the CPU, untiled and
with diffusers' own spatial tiling.

python3 benches/wan_vae_decode.py <dir> <latent frames> [threads]
  -> prints "diffusers_s <secs> tiled_s <secs> rss_mb <MB>"
"""
import os
import resource
import sys
import time

import torch
from diffusers import AutoencoderKLWan

out, frames = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
torch.manual_seed(0)
model = AutoencoderKLWan().eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("gamma"):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        elif p.ndim > 1:
            p.normal_(0, (1.0 / p[0].numel()) ** 0.5)
        else:
            p.normal_(0, 0.02)
if not os.path.exists(os.path.join(out, "diffusion_pytorch_model.safetensors")):
    model.save_pretrained(out, safe_serialization=True)
z = torch.randn(1, 16, frames, 60, 104)
with torch.no_grad():
    t0 = time.perf_counter()
    model.decode(z)
    untiled = time.perf_counter() - t0
    model.enable_tiling()
    t0 = time.perf_counter()
    model.decode(z)
    tiled = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"diffusers_s {untiled:.3f} tiled_s {tiled:.3f} rss_mb {rss:.0f}")
