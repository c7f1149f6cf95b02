"""Golden fixtures for the MiniMax-H3 video VAE (tests/minimax_h3_vae_parity.rs).

Run from the repository root:  python3 tests/reference/minimax_h3_vae_fixtures.py
Builds one tiny random diffusers `AutoencoderKLMiniMaxH3` and writes, under
tests/fixtures/minimax_h3_vae/:
  vae/config.json, vae/diffusion_pytorch_model.safetensors
        the diffusers folder: encoder widths [32, 32] (one resnet per level, 32 groups),
        spatial factors [2, 2] and temporal factors [2, 2] (4x space, 4x time), 24 latent
        channels, a ViT decoder of width 64 (2 heads of 32, 2 blocks, SwiGLU inner 64,
        4 register tokens), random latents_mean / latents_std.
  original.safetensors
        the same weights under the original MiniMax-H3 names (what the Comfy-Org single file
        and stable-diffusion.cpp use), made by inverting the diffusers conversion: `to_q/k/v`
        fused back per head ([q k v] of head 0, then head 1, ...), the SwiGLU halves swapped
        back to [gate; up], `proj_in` -> `x_embedder`, `down_blocks.i.resnets.j` ->
        `down.i.block.j`, plus the all-zero `decoder.mask_token` the original file carries.
  io.safetensors   (PyTorch layout [B, C, T, H, W]; ImageNet-normalised pixel space)
    encode.x [1, 3, 22, 16, 24]  -> encode.mean [1, 24, 7, 4, 6]   (two 17-frame clips)
    encode1.x [1, 3, 1, 16, 24]  -> encode1.mean [1, 24, 1, 4, 6]  (a single frame)
    decode.z [1, 24, 12, 3, 4]   -> decode.x [1, 3, 39, 12, 16]    (vae.decode: two chunks
        cross-faded over 5 frames, then the second chunk's tail)
    decode1.z [1, 24, 1, 3, 4]   -> decode1.x [1, 3, 1, 12, 16]    (one latent frame: the last
        of its four decoded frames, stable-diffusion.cpp's rule; diffusers has no 1-frame path)
Weights are rounded to float16 and stored as float16 (both files); the reference runs in float32
on those values. Spatial tiling is off (the Rust tests compare tiling against their own untiled
decode: stable-diffusion.cpp's tile grid is not diffusers').
"""
import json
import os

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLMiniMaxH3

torch.manual_seed(20261203)
OUT = "tests/fixtures/minimax_h3_vae"

CONFIG = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=24,
    block_out_channels=[32, 32],
    layers_per_block=1,
    spatial_downsample_factors=[2, 2],
    temporal_downsample_factors=[2, 2],
    norm_num_groups=32,
    decoder_num_layers=2,
    decoder_num_attention_heads=2,
    decoder_attention_head_dim=32,
    decoder_num_register_tokens=4,
    decoder_ffn_mult=1,
    latents_mean=[round(0.1 * i - 1.0, 3) for i in range(24)],
    latents_std=[round(0.5 + 0.07 * i, 3) for i in range(24)],
)


def randomize(vae):
    """Seeded weights scaled so activations stay O(1), rounded to float16 values."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("bias"):
                v = torch.randn_like(p) * 0.1
            elif "norm" in name and name.endswith("weight"):
                v = 1.0 + torch.randn_like(p) * 0.2
            elif name.endswith(("scale1", "scale2")):
                v = 0.5 + torch.randn_like(p) * 0.2
            elif name.endswith("register_tokens"):
                v = torch.randn_like(p)
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                v = torch.randn_like(p) / fan_in**0.5
            p.copy_(v.half().float())


def to_original(sd, heads, head_dim):
    """diffusers names -> the original single-file names (inverse of the diffusers script)."""
    out = {}
    for key, t in sd.items():
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        if ".attn.to_q." in key:
            q = t
            k = sd[key.replace(".to_q.", ".to_k.")]
            v = sd[key.replace(".to_q.", ".to_v.")]
            per_head = [x.reshape(heads, head_dim, *x.shape[1:]) for x in (q, k, v)]
            fused = torch.cat(per_head, dim=1).reshape(3 * heads * head_dim, *q.shape[1:])
            out[key.replace(".attn.to_q.", ".attn.to_qkv.")] = fused
            continue
        new = key
        if new.startswith("encoder.down_blocks."):
            level, rest = new[len("encoder.down_blocks."):].split(".", 1)
            rest = rest.replace("resnets.", "block.", 1).replace("conv_shortcut.", "nin_shortcut.", 1)
            rest = rest.replace("downsamplers.0.", "downsample.", 1)
            new = f"encoder.down.{level}.{rest}"
        new = new.replace("decoder.proj_in.", "decoder.x_embedder.")
        new = new.replace(".attn.to_out.0.", ".attn.to_out.")
        new = new.replace(".ff.net.2.", ".ff.w2.")
        if ".ff.net.0.proj." in new:
            up, gate = t.chunk(2, dim=0)
            t = torch.cat([gate, up], dim=0)
            new = new.replace(".ff.net.0.proj.", ".ff.w1.")
        out[new] = t
    out["decoder.mask_token"] = torch.zeros(sd["decoder.proj_in.weight"].shape[0])
    return out


def main():
    os.makedirs(f"{OUT}/vae", exist_ok=True)
    vae = AutoencoderKLMiniMaxH3(**CONFIG).eval()
    randomize(vae)
    vae.disable_tiling()
    sd = {k: v.detach().contiguous() for k, v in vae.state_dict().items()}
    save_file({k: v.half() for k, v in sd.items()}, f"{OUT}/vae/diffusion_pytorch_model.safetensors")
    vae.save_config(f"{OUT}/vae")
    orig = to_original(sd, CONFIG["decoder_num_attention_heads"], CONFIG["decoder_attention_head_dim"])
    save_file({k: v.contiguous().half() for k, v in orig.items()}, f"{OUT}/original.safetensors")

    io = {}
    with torch.no_grad():
        # A smooth-ish video in ImageNet-normalised space.
        t = torch.linspace(0, 1, 22)[None, None, :, None, None]
        yy = torch.linspace(-1, 1, 16)[None, None, None, :, None]
        xx = torch.linspace(-1, 1, 24)[None, None, None, None, :]
        ch = torch.tensor([0.3, -0.5, 0.8])[None, :, None, None, None]
        x = ch + torch.sin(3 * xx + 2 * t + ch) * torch.cos(2 * yy - t) + 0.2 * torch.randn(1, 3, 22, 16, 24)
        io["encode.x"] = x
        io["encode.mean"] = vae.encode(x).latent_dist.mode()
        io["encode1.x"] = x[:, :, :1].contiguous()
        io["encode1.mean"] = vae.encode(io["encode1.x"]).latent_dist.mode()
        z = torch.randn(1, 24, 12, 3, 4)
        io["decode.z"] = z
        io["decode.x"] = vae.decode(z).sample
        z1 = z[:, :, :1].contiguous()
        io["decode1.z"] = z1
        io["decode1.x"] = vae._decode_clip(z1)[:, :, -1:].contiguous()
    for k, v in io.items():
        print(k, tuple(v.shape), float(v.abs().max()))
    save_file({k: v.contiguous().float() for k, v in io.items()}, f"{OUT}/io.safetensors")


if __name__ == "__main__":
    main()
