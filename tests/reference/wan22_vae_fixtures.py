"""Golden fixtures for the Wan 2.2 VAE (tests/wan22_vae_parity.rs).

Run from the repository root:  python3 tests/reference/wan22_vae_fixtures.py
Builds one tiny random diffusers `AutoencoderKLWan` with `is_residual=True` and `patch_size=2`
(the Wan 2.2 VAE architecture: residual down/up blocks with the parameter-free AvgDown3D /
DupUp3D shortcuts, RGB patchified 2x2 into 12 channels) and writes, under
tests/fixtures/wan22_vae/:
  diffusers/config.json, diffusers/diffusion_pytorch_model.safetensors
        the model in diffusers folder form: base_dim 3, decoder_base_dim 2, dim_mult
        [1, 2, 2, 1] (four levels, 8x spatial in the blocks, 16x with the patch), one resnet
        per encoder block, temperal_downsample [False, True, True] (4x in time, the released
        pattern), z_dim 6 with its own latents_mean / latents_std in config.json
  original.safetensors
        the same weights under the original Wan 2.2 single-file names (`Wan2.2_VAE.pth`,
        ComfyUI `wan2.2_vae.safetensors`, stable-diffusion.cpp): `encoder.conv1`,
        `encoder.downsamples.I.downsamples.J.residual.{0,2,3,6}` / `shortcut`,
        `encoder.downsamples.I.downsamples.R.{resample.1,time_conv}`, `middle.{0,1,2}`,
        `head.{0,2}`, `decoder.upsamples.I.upsamples.J...`, top-level `conv1` / `conv2`.
        Every causal Conv3d stays whole ([O, I, 3, K, K]); a few gammas are stored flat [C].
  io.safetensors   inputs and reference outputs:
    image.decode.z [2, 6, 2, 2]          -> image.decode.out [2, 3, 32, 32]   (vae.decode)
    image.encode.x [2, 3, 32, 32]        -> image.encode.mean [2, 6, 2, 2]    (mode())
        a batch of two single frames, diffusers' [B, C, 1, H, W] with the frame axis dropped
    video.decode.z [6, 3, 2, 1]          -> video.decode.out [3, 9, 32, 16]   (vae.decode)
    video.encode.x [3, 9, 32, 16]        -> video.encode.mean [6, 3, 2, 1]    (mode())
        one clip, diffusers' [1, C, T, H, W] with the batch axis dropped (9 frames <-> 3
        latent frames: the first chunk, one whose causal history is a single frame, and one
        with full history)
diffusers decodes one latent frame per call (the first with `first_chunk=True`, whose DupUp3D
drops its leading frame) and encodes the first frame alone, then four frames per call,
carrying each causal conv's last input frames between calls; the clamp to [-1, 1] and the
unpatchify close `_decode`. Those are the behaviours these outputs pin. Tensors keep PyTorch's
row-major layout; Rust reads the shapes reversed.
"""
import json
import os
import re

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLWan

torch.manual_seed(20260703)
OUT = "tests/fixtures/wan22_vae"
Z = 6
RES = 1
CONFIG = dict(
    base_dim=3,
    decoder_base_dim=2,
    z_dim=Z,
    dim_mult=[1, 2, 2, 1],
    num_res_blocks=RES,
    temperal_downsample=[False, True, True],
    is_residual=True,
    patch_size=2,
    in_channels=12,
    out_channels=12,
    scale_factor_spatial=16,
    scale_factor_temporal=4,
    latents_mean=[round(0.3 * i - 0.8, 3) for i in range(Z)],
    latents_std=[round(0.6 + 0.2 * i, 3) for i in range(Z)],
)

LEAVES = (("norm1", "residual.0"), ("conv1", "residual.2"), ("norm2", "residual.3"),
          ("conv2", "residual.6"), ("conv_shortcut", "shortcut"))


def resnet_leaf(rest):
    for old, new in LEAVES:
        if rest.startswith(old + "."):
            return new + rest[len(old):]
    raise KeyError(rest)


def to_original(key):
    """diffusers key -> original Wan 2.2 single-file key."""
    if key.startswith("quant_conv."):
        return "conv1." + key[len("quant_conv."):]
    if key.startswith("post_quant_conv."):
        return "conv2." + key[len("post_quant_conv."):]
    part, rest = key.split(".", 1)
    for old, new in (("conv_in.", "conv1."), ("norm_out.", "head.0."), ("conv_out.", "head.2.")):
        if rest.startswith(old):
            return f"{part}.{new}{rest[len(old):]}"
    m = re.match(r"mid_block\.resnets\.(\d)\.(.*)", rest)
    if m:
        return f"{part}.middle.{2 * int(m[1])}.{resnet_leaf(m[2])}"
    if rest.startswith("mid_block.attentions.0."):
        return f"{part}.middle.1." + rest[len("mid_block.attentions.0."):]
    m = re.match(r"down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", rest)
    if m:
        return f"encoder.downsamples.{m[1]}.downsamples.{m[2]}.{resnet_leaf(m[3])}"
    m = re.match(r"down_blocks\.(\d+)\.downsampler\.(.*)", rest)
    if m:
        return f"encoder.downsamples.{m[1]}.downsamples.{RES}.{m[2]}"
    m = re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", rest)
    if m:
        return f"decoder.upsamples.{m[1]}.upsamples.{m[2]}.{resnet_leaf(m[3])}"
    m = re.match(r"up_blocks\.(\d+)\.upsampler\.(.*)", rest)
    if m:
        return f"decoder.upsamples.{m[1]}.upsamples.{RES + 1}.{m[2]}"
    raise KeyError(key)


# Gammas stored flat [C] in the original file (the loader accepts any single-axis shape).
FLAT = {"decoder.head.0.gamma", "encoder.middle.1.norm.gamma",
        "decoder.upsamples.1.upsamples.0.residual.3.gamma"}


def randomize(vae):
    """Seeded weights scaled so activations stay O(1); norms random so they matter."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif name.endswith("gamma"):
                p.copy_(1.0 + torch.randn_like(p) * 0.3)
            else:
                fan_in = p[0].numel()  # every temporal tap counts
                p.copy_(torch.randn_like(p) / fan_in**0.5)


def main():
    os.makedirs(OUT, exist_ok=True)
    vae = AutoencoderKLWan(**CONFIG).eval()
    randomize(vae)
    vae.save_pretrained(f"{OUT}/diffusers", safe_serialization=True)
    sd = {k: v.detach().contiguous().clone() for k, v in vae.state_dict().items()}
    original = {}
    for k, v in sd.items():
        ok = to_original(k)
        if ok in FLAT:
            v = v.reshape(-1)
        assert ok not in original, ok
        original[ok] = v.contiguous()
    assert len(original) == len(sd) and FLAT <= set(original), FLAT - set(original)
    assert sum(".time_conv." in k for k in original) == 8
    save_file(original, f"{OUT}/original.safetensors")

    io = {}
    with torch.no_grad():
        z = torch.randn(2, Z, 1, 2, 2)
        x = torch.rand(2, 3, 1, 32, 32) * 2 - 1
        mean = vae.encode(x).latent_dist.mode()
        assert mean.shape == z.shape
        io["image.decode.z"] = z[:, :, 0]
        io["image.decode.out"] = vae.decode(z).sample[:, :, 0]
        io["image.encode.x"] = x[:, :, 0]
        io["image.encode.mean"] = mean[:, :, 0]

        z = torch.randn(1, Z, 3, 2, 1)
        out = vae.decode(z).sample
        assert out.shape == (1, 3, 9, 32, 16)
        x = torch.rand(1, 3, 9, 32, 16) * 2 - 1
        mean = vae.encode(x).latent_dist.mode()
        assert mean.shape == z.shape
        # Causality: the first frame is the one-frame decode of the first latent frame.
        first = vae.decode(z[:, :, :1]).sample
        assert torch.allclose(first[:, :, 0], out[:, :, 0], atol=1e-6)
        io["video.decode.z"] = z[0]
        io["video.decode.out"] = out[0]
        io["video.encode.x"] = x[0]
        io["video.encode.mean"] = mean[0]

    for k in ("image.decode.out", "video.decode.out"):
        y = io[k]
        print(f"{k}: {(y.abs() >= 1).float().mean() * 100:.0f}% clamped")
    for k in ("image.encode.mean", "video.encode.mean"):
        print(f"{k}: |max| {io[k].abs().max():.3f}")

    with open(f"{OUT}/diffusers/config.json") as fh:
        assert len(json.load(fh)["latents_mean"]) == Z
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    n_params = sum(v.numel() for v in sd.values())
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"{len(sd)} weights ({n_params} values); fixtures: {total / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
