"""Reference side of benches/sd_unet_step.rs: writes a real-size random UNet in diffusers layout
(SD 1.5: 860 M parameters; SDXL base: 2.6 G) and times one diffusers fp32 forward with CFG
(batch 2, 77 text tokens) on the CPU: SD 1.5 at 512x512 (latent 64x64), SDXL at 1024x1024
(latent 128x128).

python3 benches/sd_unet_step.py <sd15|sdxl> <dir> [threads] [reps]
    -> prints "diffusers_s <secs> rss_mb <MB>"
"""
import os
import resource
import sys
import time

import torch
from diffusers import UNet2DConditionModel

CONFIGS = {
    # runwayml/stable-diffusion-v1-5 unet/config.json (sizes only).
    "sd15": dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280),
                 down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                 up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
                 cross_attention_dim=768, attention_head_dim=8),
    # stabilityai/stable-diffusion-xl-base-1.0 unet/config.json (sizes only).
    "sdxl": dict(sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280),
                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                 transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
                 cross_attention_dim=2048, use_linear_projection=True, addition_embed_type="text_time",
                 addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816),
}

kind, out = sys.argv[1], sys.argv[2]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 1
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = CONFIGS[kind]
if os.path.exists(os.path.join(out, "diffusion_pytorch_model.safetensors")):
    model = UNet2DConditionModel.from_pretrained(out).eval()
else:
    model = UNet2DConditionModel(**cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
side = 64 if kind == "sd15" else 128
x = torch.randn(2, 4, side, side)
ctx = torch.randn(2, 77, cfg["cross_attention_dim"])
t = torch.tensor([999.0, 999.0])
extra = {}
if kind == "sdxl":
    extra = {"added_cond_kwargs": {"text_embeds": torch.randn(2, 1280),
                                   "time_ids": torch.tensor([[1024.0, 1024, 0, 0, 1024, 1024]] * 2)}}
best = 1e9
with torch.no_grad():
    for _ in range(reps):
        t0 = time.perf_counter()
        model(x, t, encoder_hidden_states=ctx, **extra)
        best = min(best, time.perf_counter() - t0)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"diffusers_s {best:.3f} rss_mb {rss:.0f}")
