"""Golden fixtures for the AutoencoderKL (tests/vae_parity.rs).

Run from the repository root:  python3 tests/reference/vae_fixtures.py
Writes, under tests/fixtures/vae/:
  diffusers.safetensors  tiny random diffusers `AutoencoderKL` weights, diffusers names (no prefix)
  ldm.safetensors        the same weights in the LDM single-file layout (`first_stage_model.` prefix,
                         `decoder.up.N` reversed, `nin_shortcut`, 1x1-conv attention weights), made by
                         inverting diffusers' own single-file conversion; checked by converting back
                         with `convert_ldm_vae_checkpoint`
  io.safetensors         inputs and reference outputs:
    decode.z [1, 4, 6, 8]          -> decode.y [1, 3, 24, 32]   (raw decoder output, before clamp)
    encode.x [1, 3, 27, 21]        -> encode.mean / encode.logvar [1, 4, 6, 5] (logvar clamped;
                                      odd sizes exercise the (0,1,0,1) downsample padding)
    encode.noise                   -> encode.sample = mean + exp(logvar / 2) * noise
Tensors keep PyTorch's row-major layout; the Rust side reads the shapes reversed (ggml order).
"""
import os
import re

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKL
from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

torch.manual_seed(20240607)
OUT = "tests/fixtures/vae"

# Three levels so the LDM up-block reversal is not a symmetric swap; every level changes width
# (so resnets need shortcut convs). Real VAEs use 32 groups; 8 keeps the fixture small.
CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 3,
    up_block_types=("UpDecoderBlock2D",) * 3,
    block_out_channels=(16, 24, 32),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=8,
    sample_size=32,
)
vae = AutoencoderKL(**CONFIG).eval()
with torch.no_grad():
    for name, p in vae.named_parameters():
        if name.endswith("bias"):
            p.copy_(torch.randn_like(p) * 0.1)
        elif p.ndim == 1:  # norm scales
            p.copy_(1.0 + torch.randn_like(p) * 0.2)
        else:
            fan_in = p[0].numel()
            p.copy_(torch.randn_like(p) / fan_in**0.5)

sd = {k: v.detach().contiguous().clone() for k, v in vae.state_dict().items()}
n_levels = len(CONFIG["block_out_channels"])


def to_ldm(key):
    """diffusers key -> LDM single-file key (inverse of diffusers' convert_ldm_vae_checkpoint)."""
    k = key
    k = re.sub(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.down.\1.block.\2.", k)
    k = re.sub(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", k)

    def up(m, what):
        return f"decoder.up.{n_levels - 1 - int(m.group(1))}.{what}"

    k = re.sub(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.",
               lambda m: up(m, f"block.{m.group(2)}."), k)
    k = re.sub(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", lambda m: up(m, "upsample."), k)
    k = re.sub(r"\.mid_block\.resnets\.(\d+)\.", lambda m: f".mid.block_{int(m.group(1)) + 1}.", k)
    k = k.replace(".mid_block.attentions.0.", ".mid.attn_1.")
    for old, new in (("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."), ("to_v.", "v."),
                     ("to_out.0.", "proj_out.")):
        k = k.replace(f".attn_1.{old}", f".attn_1.{new}")
    k = k.replace("conv_shortcut.", "nin_shortcut.")
    k = k.replace("conv_norm_out.", "norm_out.")
    return k


ldm = {}
for k, v in sd.items():
    lk = to_ldm(k)
    if ".attn_1." in lk and lk.endswith("weight") and v.ndim == 2:
        v = v[:, :, None, None].contiguous()  # LDM attention projections are 1x1 convs
    ldm["first_stage_model." + lk] = v

# Round trip through diffusers' own converter: every key and value must come back.
back = convert_ldm_vae_checkpoint(ldm, dict(vae.config))
assert sorted(back) == sorted(sd), set(back) ^ set(sd)
for k in sd:
    assert torch.equal(back[k], sd[k]), k
assert any(v.ndim == 4 for k, v in ldm.items() if ".attn_1.q." in k)

io = {}
with torch.no_grad():
    z = torch.randn(1, 4, 6, 8)  # latent 8 wide, 6 high -> image 32 x 24
    io["decode.z"] = z
    io["decode.y"] = vae.decode(z).sample

    x = torch.rand(1, 3, 27, 21) * 2 - 1  # image 21 wide, 27 high -> 10 x 13 -> latent 5 x 6
    post = vae.encode(x).latent_dist
    noise = torch.randn_like(post.mean)
    io["encode.x"] = x
    io["encode.mean"] = post.mean
    io["encode.logvar"] = post.logvar
    io["encode.noise"] = noise
    io["encode.sample"] = post.mean + post.std * noise

os.makedirs(OUT, exist_ok=True)
save_file(sd, f"{OUT}/diffusers.safetensors")
save_file(ldm, f"{OUT}/ldm.safetensors")
save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
n_params = sum(v.numel() for v in sd.values())
print(f"{len(sd)} weights ({n_params} values); decode.y max |y| = {io['decode.y'].abs().max():.3f}")
