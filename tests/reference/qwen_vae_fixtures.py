"""Golden fixtures for the Qwen Image 2.1 VAE (tests/qwen_vae_parity.rs).

Run from the repository root:  python3 tests/reference/qwen_vae_fixtures.py
Writes, under tests/fixtures/qwen_vae/:
  diffusers.safetensors  tiny random diffusers `AutoencoderKLQwenImage21` weights, diffusers names
  original.safetensors   the same weights under the original single-file names
                         (`encoder.downsamples.N.downsamples.M.residual.K`, `middle.K`, `head.K`,
                         top-level `conv1`/`conv2`), every conv kernel stored as a Conv3d weight
                         [O, I, T, K, K]: T = 1 in general, T = 3 for a few convs whose first two
                         temporal slices are random (a causal single frame only meets the last
                         slice, so using any other slice fails the test); norm_out gammas flat [C]
  io.safetensors         inputs and reference outputs (batch of 2):
    decode.z [2, 8, 2, 3]   -> decode.y [2, 4, 32, 48]   raw decoder output (before the clamp)
                               decode.clamped = diffusers' vae.decode (== decode.y.clamp(-1, 1))
    encode.x [2, 4, 32, 48] -> encode.mean [2, 8, 2, 3]  posterior mean (diffusers' `mode()`)
    stats.z [1, 64, 2, 3]   -> stats.normalized = (z - latents_mean) / latents_std with the
                               released 64-channel statistics
The tiny config keeps the real structure: dim_mult [1, 2, 4, 8, 8] (five levels, 16x), two resnets
per encoder block, temporal flags [F, T, T, T], RGBA in and out, different encoder and decoder
base widths (2 and 3). Tensors keep PyTorch's row-major layout; Rust reads the shapes reversed.
"""
import os
import re

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLQwenImage21

torch.manual_seed(20260521)
OUT = "tests/fixtures/qwen_vae"
Z = 8
RES = 2
CONFIG = dict(
    base_dim=2,
    decoder_base_dim=3,
    z_dim=Z,
    dim_mult=[1, 2, 4, 8, 8],
    num_res_blocks=RES,
    temperal_downsample=[False, True, True, True],
    latents_mean=[0.0] * Z,
    latents_std=[1.0] * Z,
    in_channels=4,
    out_channels=4,
)
vae = AutoencoderKLQwenImage21(**CONFIG).eval()
with torch.no_grad():
    for name, p in vae.named_parameters():
        if name.endswith("bias"):
            p.copy_(torch.randn_like(p) * 0.1)
        elif name.endswith("gamma"):
            p.copy_(1.0 + torch.randn_like(p) * 0.2)
        else:
            fan_in = p[0].numel()
            p.copy_(torch.randn_like(p) / fan_in**0.5)

sd = {k: v.detach().contiguous().clone() for k, v in vae.state_dict().items()}


def to_original(key):
    """diffusers key -> original single-file key."""
    k = key
    if ".resnets." in k:
        for old, new in (("norm1", "residual.0"), ("conv1", "residual.2"), ("norm2", "residual.3"),
                         ("conv2", "residual.6"), ("conv_shortcut", "shortcut")):
            k = re.sub(rf"\.resnets\.(\d+)\.{old}\.", rf".resnets.\1.{new}.", k)
    k = re.sub(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.downsamples.\1.downsamples.\2.", k)
    k = re.sub(r"^encoder\.down_blocks\.(\d+)\.downsampler\.", rf"encoder.downsamples.\1.downsamples.{RES}.", k)
    k = re.sub(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.", r"decoder.upsamples.\1.upsamples.\2.", k)
    k = re.sub(r"^decoder\.up_blocks\.(\d+)\.upsampler\.", rf"decoder.upsamples.\1.upsamples.{RES + 1}.", k)
    k = re.sub(r"\.mid_block\.resnets\.0\.", ".middle.0.", k)
    k = re.sub(r"\.mid_block\.resnets\.1\.", ".middle.2.", k)
    k = k.replace(".mid_block.attentions.0.", ".middle.1.")
    k = k.replace(".conv_in.", ".conv1.").replace(".norm_out.", ".head.0.").replace(".conv_out.", ".head.2.")
    k = re.sub(r"^quant_conv\.", "conv1.", k)
    k = re.sub(r"^post_quant_conv\.", "conv2.", k)
    return k


# Convs stored with a 3-frame causal kernel (the true 2D kernel is the last slice).
DEEP = {
    "decoder.conv1.weight",
    "decoder.upsamples.2.upsamples.1.residual.2.weight",
    "decoder.upsamples.1.upsamples.3.resample.1.weight",
    "encoder.head.2.weight",
    "encoder.downsamples.3.downsamples.0.shortcut.weight",
}
original = {}
for k, v in sd.items():
    ok = to_original(k)
    if v.ndim == 4:
        if ok in DEEP:
            noise = torch.randn(v.shape[0], v.shape[1], 2, *v.shape[2:])
            v = torch.cat([noise, v[:, :, None]], dim=2)
        elif ".time_conv." in ok:
            v = torch.randn(v.shape[0], v.shape[1], 3, *v.shape[2:])  # unused on one frame
        else:
            v = v[:, :, None]
    if ok.endswith("head.0.gamma"):
        v = v.reshape(-1)
    assert ok not in original, ok
    original[ok] = v.contiguous()
assert len(original) == len(sd)
assert all(k in original for k in DEEP)
assert not any(".resnets." in k or "_blocks" in k or "conv_in" in k for k in original)

io = {}
with torch.no_grad():
    z = torch.randn(2, Z, 1, 2, 3)  # latent 3 wide, 2 high -> image 48 x 32
    vae.clear_cache()
    raw = vae.decoder(vae.post_quant_conv(z), feat_cache=vae._feat_map, feat_idx=[0], first_chunk=True)
    vae.clear_cache()
    clamped = vae.decode(z).sample
    assert torch.equal(raw.clamp(-1, 1), clamped)
    io["decode.z"] = z[:, :, 0]
    io["decode.y"] = raw[:, :, 0]
    io["decode.clamped"] = clamped[:, :, 0]

    x = torch.rand(2, 4, 1, 32, 48) * 2 - 1
    mean = vae.encode(x).latent_dist.mode()
    io["encode.x"] = x[:, :, 0]
    io["encode.mean"] = mean[:, :, 0]

    released = AutoencoderKLQwenImage21()  # default config: the released statistics
    m = torch.tensor(released.config.latents_mean).view(1, 64, 1, 1)
    s = torch.tensor(released.config.latents_std).view(1, 64, 1, 1)
    zs = torch.randn(1, 64, 2, 3) * 3
    io["stats.z"] = zs
    io["stats.normalized"] = (zs - m) / s
    del released

os.makedirs(OUT, exist_ok=True)
save_file(sd, f"{OUT}/diffusers.safetensors")
save_file(original, f"{OUT}/original.safetensors")
save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
n_params = sum(v.numel() for v in sd.values())
print(
    f"{len(sd)} weights ({n_params} values); |decode.y| max {io['decode.y'].abs().max():.3f}, "
    f"|encode.mean| max {io['encode.mean'].abs().max():.3f}"
)
