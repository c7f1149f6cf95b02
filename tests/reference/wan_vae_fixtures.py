"""Golden fixtures for the Wan 2.1 / Qwen Image VAE (tests/wan_vae_parity.rs).

Run from the repository root:  python3 tests/reference/wan_vae_fixtures.py
Builds two tiny random diffusers `AutoencoderKLQwenImage` models and writes, under
tests/fixtures/wan_vae/:
  a/config.json, a/diffusion_pytorch_model.safetensors
        model A in diffusers folder form: base_dim 4, dim_mult [1, 2, 3, 3] (four levels, 8x),
        one resnet per encoder block, z_dim 16 (so the built-in released statistics apply;
        config.json carries diffusers' default latents_mean/latents_std)
  b/config.json, b/diffusion_pytorch_model.safetensors
        model B: base_dim 5, dim_mult [1, 2, 2] (three levels, 4x), two resnets per encoder
        block, z_dim 8, random latents_mean/latents_std in config.json
  a_original.safetensors, b_original.safetensors
        the same weights under the original Wan 2.1 single-file names (`encoder.conv1`,
        flat `encoder.downsamples.K.residual.{0,2,3,6}` / `shortcut` / `resample.1`,
        `middle.{0,1,2}`, `head.{0,2}`, flat `decoder.upsamples.K`, top-level `conv1`/`conv2`).
        Causal Conv3d kernels are stored [O, I, T, K, K]: mostly T = 1 (the slice a single frame
        meets) to keep the files small, T = 3 with random earlier slices for a few. Model B's
        file also stores a few kernels as plain Conv2d [O, I, K, K] and every gamma flat [C].
  io.safetensors   inputs and reference outputs, per model M in {a, b}:
    M.decode.z [N, z, h, w]      -> M.decode.y [N, 3, h*f, w*f]  raw decoder output
                                    M.decode.clamped = diffusers' vae.decode (== y.clamp(-1, 1))
    M.encode.x [N, 3, H, W]      -> M.encode.mean [N, z, H/f, W/f]  posterior mean (`mode()`)
    (model A: batch 2, 6x5 latent <-> 48x40 image; model B: batch 1, 6x5 latent <-> 24x20)
Diffusers runs on 5-D tensors with one frame (B, C, 1, H, W); the frame axis is dropped here.
Tensors keep PyTorch's row-major layout; Rust reads the shapes reversed.
"""
import json
import os
import re

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLQwenImage

torch.manual_seed(20260602)
OUT = "tests/fixtures/wan_vae"

MODELS = {
    "a": dict(base_dim=4, z_dim=16, dim_mult=[1, 2, 3, 3], num_res_blocks=1,
              temperal_downsample=[False, True, True]),
    "b": dict(base_dim=5, z_dim=8, dim_mult=[1, 2, 2], num_res_blocks=2,
              temperal_downsample=[False, True],
              latents_mean=[round(0.5 * i - 1.7, 3) for i in range(8)],
              latents_std=[round(1.0 + 0.25 * i, 3) for i in range(8)]),
}
# Per model: batch, latent (h, w), spatial factor.
IO = {"a": (2, (5, 6), 8), "b": (1, (5, 6), 4)}

LEAVES = (("norm1", "residual.0"), ("conv1", "residual.2"), ("norm2", "residual.3"),
          ("conv2", "residual.6"), ("conv_shortcut", "shortcut"))


def resnet_leaf(rest):
    """`norm1.gamma` -> `residual.0.gamma` etc. (resample / time_conv / attention unchanged)."""
    for old, new in LEAVES:
        if rest.startswith(old + "."):
            return new + rest[len(old):]
    return rest


def to_original(key, res):
    """diffusers key -> original Wan 2.1 single-file key (inverse of diffusers' converter)."""
    k = key
    if k.startswith("quant_conv."):
        return "conv1." + k[len("quant_conv."):]
    if k.startswith("post_quant_conv."):
        return "conv2." + k[len("post_quant_conv."):]
    part, rest = k.split(".", 1)
    m = re.match(r"mid_block\.resnets\.(\d)\.(.*)", rest)
    if m:
        return f"{part}.middle.{2 * int(m[1])}.{resnet_leaf(m[2])}"
    if rest.startswith("mid_block.attentions.0."):
        return f"{part}.middle.1." + rest[len("mid_block.attentions.0."):]
    for old, new in (("conv_in.", "conv1."), ("norm_out.", "head.0."), ("conv_out.", "head.2.")):
        if rest.startswith(old):
            return f"{part}.{new}{rest[len(old):]}"
    m = re.match(r"down_blocks\.(\d+)\.(.*)", rest)
    if m:  # already a flat list of resnets and resamplers
        return f"encoder.downsamples.{m[1]}.{resnet_leaf(m[2])}"
    per_level = res + 2  # res + 1 resnets, then the upsampler
    m = re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", rest)
    if m:
        return f"decoder.upsamples.{int(m[1]) * per_level + int(m[2])}.{resnet_leaf(m[3])}"
    m = re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.(.*)", rest)
    if m:
        return f"decoder.upsamples.{int(m[1]) * per_level + res + 1}.{m[2]}"
    raise KeyError(key)


def randomize(vae):
    """Seeded weights scaled so activations stay O(1) through the tiny network."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif name.endswith("gamma"):
                p.copy_(1.0 + torch.randn_like(p) * 0.2)
            else:
                # A single frame only meets the last temporal slice: count K x K x I inputs.
                fan_in = p.shape[1] * p.shape[-1] * p.shape[-2]
                p.copy_(torch.randn_like(p) / fan_in**0.5)


def original_file(sd, res, deep, plain, flat_gamma):
    out = {}
    for k, v in sd.items():
        ok = to_original(k, res)
        if v.ndim == 5 and ".time_conv." not in ok:
            last = v[:, :, -1:]  # the slice a single frame meets
            if ok in deep:
                v = torch.cat([torch.randn_like(v[:, :, :2]), last], dim=2)
            elif ok in plain:
                v = last[:, :, 0]
            else:
                v = last
        if flat_gamma and ok.endswith("gamma"):
            v = v.reshape(-1)
        assert ok not in out, ok
        out[ok] = v.contiguous()
    assert len(out) == len(sd)
    assert all(k in out for k in deep | plain), (deep | plain) - set(out)
    return out


# Original-file kernels stored with three temporal slices / as plain Conv2d.
DEEP = {
    "a": {"decoder.conv1.weight", "encoder.head.2.weight", "decoder.upsamples.4.residual.2.weight",
          "encoder.downsamples.2.shortcut.weight", "conv2.weight"},
    "b": {"decoder.middle.2.residual.6.weight"},
}
PLAIN = {
    "a": set(),
    "b": {"encoder.conv1.weight", "decoder.upsamples.4.residual.2.weight", "conv1.weight",
          "decoder.head.2.weight"},
}

def main():
    os.makedirs(OUT, exist_ok=True)
    io = {}
    for name, cfg in MODELS.items():
        vae = AutoencoderKLQwenImage(**cfg).eval()
        randomize(vae)
        vae.save_pretrained(f"{OUT}/{name}", safe_serialization=True)
        sd = {k: v.detach().contiguous().clone() for k, v in vae.state_dict().items()}
        original = original_file(sd, cfg["num_res_blocks"], DEEP[name], PLAIN[name], name == "b")
        save_file(original, f"{OUT}/{name}_original.safetensors")

        n, (h, w), f = IO[name]
        z_dim = cfg["z_dim"]
        with torch.no_grad():
            z = torch.randn(n, z_dim, 1, h, w)
            vae.clear_cache()
            raw = vae.decoder(vae.post_quant_conv(z), feat_cache=vae._feat_map, feat_idx=[0])
            vae.clear_cache()
            clamped = vae.decode(z).sample
            assert torch.equal(raw.clamp(-1, 1), clamped)
            x = torch.rand(n, 3, 1, h * f, w * f) * 2 - 1
            mean = vae.encode(x).latent_dist.mode()
        io[f"{name}.decode.z"] = z[:, :, 0]
        io[f"{name}.decode.y"] = raw[:, :, 0]
        io[f"{name}.decode.clamped"] = clamped[:, :, 0]
        io[f"{name}.encode.x"] = x[:, :, 0]
        io[f"{name}.encode.mean"] = mean[:, :, 0]
        y = raw[:, :, 0]
        print(f"model {name}: {len(sd)} weights; |decode.y| max {y.abs().max():.3f} "
              f"({(y.abs() > 1).float().mean() * 100:.0f}% clamped), "
              f"|encode.mean| max {mean.abs().max():.3f}")

    with open(f"{OUT}/a/config.json") as fh:
        assert len(json.load(fh)["latents_mean"]) == 16
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"fixtures: {total / 1e6:.2f} MB")


if __name__ == "__main__":  # importable: wan_vae_video_fixtures.py reuses the name mapping
    main()
