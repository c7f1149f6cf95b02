"""Reference side of benches/dit_step.rs: writes a random FLUX.1-dev, SD3.5-medium or Z-Image transformer at
the real widths with fewer blocks (so f32 fits beside the reference in 24 GiB) in diffusers layout,
and times one diffusers fp32 forward at 512x512 on the CPU.

  flux:  hidden 3072 (24 x 128), MLP 12288, T5 4096, pooled 768, guidance; 1 double + 2 single blocks
         of the released 19 + 38; batch 1 (guidance-distilled, no CFG), 256 text tokens
  sd35m: hidden 1536 (24 x 64), q/k norms, 6 blocks (3 dual) of the released 24 (13 dual);
         batch 2 (CFG), 154 text tokens
  zimage: Z-Image Turbo at 1024x1024: width 3840 (30 x 128), FFN 10240, captions 2560 wide; 1 + 1 refiner
         blocks and 2 main layers of the released 2 + 2 and 30; no CFG, 100 caption tokens (padded to 128)
  wan:   Wan 2.1 T2V 1.3B at 480x832, 33 frames (latent 9 x 60 x 104: 14040 patch tokens): width 1536
         (12 x 128), FFN 8960, umT5 states 4096 wide; 2 blocks of the released 30; one call (CFG's two calls
         are two of these), 512 text tokens

python3 benches/dit_step.py <flux|sd35m|zimage|wan> <dir> [threads]  -> prints "diffusers_s <secs> rss_mb <MB>"
"""
import os
import resource
import sys
import time

import torch

model_name, out = sys.argv[1], sys.argv[2]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
torch.set_num_threads(threads)
torch.manual_seed(0)
if model_name == "flux":
    from diffusers import FluxTransformer2DModel
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=2,
                                   attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                                   pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
    kwargs = dict(hidden_states=torch.randn(1, 1024, 64), encoder_hidden_states=torch.randn(1, 256, 4096),
                  pooled_projections=torch.randn(1, 768), timestep=torch.tensor([0.7]),
                  img_ids=torch.zeros(1024, 3), txt_ids=torch.zeros(256, 3), guidance=torch.tensor([3.5]))
elif model_name == "zimage":
    from diffusers import ZImageTransformer2DModel
    model = ZImageTransformer2DModel(dim=3840, n_layers=2, n_refiner_layers=1, n_heads=30, n_kv_heads=30,
                                     cap_feat_dim=2560, axes_dims=[32, 48, 48], axes_lens=[1024, 512, 512])
    # diffusers' forward takes lists of (C, F, H, W) latents and (L, C) captions; t = 1 - sigma.
    kwargs = dict(x=[torch.randn(16, 1, 128, 128)], t=torch.tensor([0.3]), cap_feats=[torch.randn(100, 2560)],
                  return_dict=False)
elif model_name == "wan":
    from diffusers import WanTransformer3DModel
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                                  in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960,
                                  num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
    kwargs = dict(hidden_states=torch.randn(1, 16, 9, 60, 104), timestep=torch.tensor([700.0]),
                  encoder_hidden_states=torch.randn(1, 512, 4096), return_dict=False)
else:
    from diffusers import SD3Transformer2DModel
    model = SD3Transformer2DModel(sample_size=128, patch_size=2, in_channels=16, num_layers=6, attention_head_dim=64,
                                  num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                                  pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384,
                                  qk_norm="rms_norm", dual_attention_layers=(0, 1, 2))
    kwargs = dict(hidden_states=torch.randn(2, 16, 64, 64), encoder_hidden_states=torch.randn(2, 154, 4096),
                  pooled_projections=torch.randn(2, 2048), timestep=torch.tensor([700.0, 700.0]))
model = model.eval()
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
if not os.path.exists(os.path.join(out, "diffusion_pytorch_model.safetensors")):
    model.save_pretrained(out, safe_serialization=True, max_shard_size="20GB")
with torch.no_grad():
    model(**kwargs)
    best = 1e9
    for _ in range(2):
        t0 = time.perf_counter()
        model(**kwargs)
        best = min(best, time.perf_counter() - t0)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"diffusers_s {best:.3f} rss_mb {rss:.0f}")
