"""Golden fixtures for Wan 2.1 VAE video encode/decode (tests/wan_vae_video_parity.rs).

Run from the repository root:  python3 tests/reference/wan_vae_video_fixtures.py
Builds two tiny random diffusers `AutoencoderKLWan` models (the Wan 2.1 VAE) and writes, under
tests/fixtures/wan_vae_video/:
  a/config.json, a/diffusion_pytorch_model.safetensors
        model A: base_dim 4, dim_mult [1, 1, 2, 2] (four levels, 8x spatial), one resnet per
        encoder block, z_dim 16, temperal_downsample [False, True, True] (4x in time, the
        released layout of temporal levels)
  b/config.json, b/diffusion_pytorch_model.safetensors
        model B: base_dim 3, dim_mult [1, 2, 2] (three levels, 4x spatial), z_dim 4,
        temperal_downsample [True, True] (both resamplers temporal, 4x in time), random
        latents_mean/latents_std in config.json
  a_original.safetensors, b_original.safetensors
        the same weights under the original Wan 2.1 single-file names (the mapping of
        wan_vae_fixtures.py), every causal Conv3d kept whole ([O, I, 3, K, K]) with its
        `time_conv` weights.
  io.safetensors   per model M in {a, b} (one batch element, PyTorch layout [B, C, T, H, W]):
    M.decode.z [1, z, 3, h, w]        -> M.decode.clamped [1, 3, 9, h*f, w*f]  (vae.decode)
    M.encode.x [1, 3, 9, h*f, w*f]    -> M.encode.mean [1, z, 3, h, w]  (posterior mode)
    (model A: 3x2 latent <-> 24x16 frames; model B: 2x3 latent <-> 8x12 frames)
diffusers decodes one latent frame per call and encodes the first frame alone, then four
frames per call, carrying each causal conv's last input frames between calls; that is the
behaviour these outputs pin. Tensors keep PyTorch's row-major layout; Rust reads the shapes
reversed.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLWan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wan_vae_fixtures import to_original  # noqa: E402  (the diffusers -> original names)

torch.manual_seed(20260611)
OUT = "tests/fixtures/wan_vae_video"

MODELS = {
    "a": dict(base_dim=4, z_dim=16, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
              temperal_downsample=[False, True, True]),
    "b": dict(base_dim=3, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1,
              temperal_downsample=[True, True],
              latents_mean=[round(0.4 * i - 0.6, 3) for i in range(4)],
              latents_std=[round(0.8 + 0.3 * i, 3) for i in range(4)]),
}
# Per model: latent frames, latent (h, w), spatial factor.
IO = {"a": (3, (2, 3), 8), "b": (3, (3, 2), 4)}


def randomize(vae):
    """Seeded weights scaled so activations stay O(1): every temporal tap counts as fan-in."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif name.endswith("gamma"):
                p.copy_(1.0 + torch.randn_like(p) * 0.2)
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn_like(p) / fan_in**0.5)


def main():
    os.makedirs(OUT, exist_ok=True)
    io = {}
    for name, cfg in MODELS.items():
        vae = AutoencoderKLWan(**cfg).eval()
        randomize(vae)
        vae.save_pretrained(f"{OUT}/{name}", safe_serialization=True)
        sd = {k: v.detach().contiguous().clone() for k, v in vae.state_dict().items()}
        original = {to_original(k, cfg["num_res_blocks"]): v for k, v in sd.items()}
        assert len(original) == len(sd)
        assert any(".time_conv." in k for k in original)
        save_file(original, f"{OUT}/{name}_original.safetensors")

        t, (h, w), f = IO[name]
        frames = 1 + 4 * (t - 1)
        with torch.no_grad():
            z = torch.randn(1, cfg["z_dim"], t, h, w)
            decoded = vae.decode(z).sample
            assert decoded.shape == (1, 3, frames, h * f, w * f), decoded.shape
            x = torch.rand(1, 3, frames, h * f, w * f) * 2 - 1
            mean = vae.encode(x).latent_dist.mode()
            assert mean.shape == z.shape, mean.shape
        io[f"{name}.decode.z"] = z
        io[f"{name}.decode.clamped"] = decoded
        io[f"{name}.encode.x"] = x
        io[f"{name}.encode.mean"] = mean
        print(f"model {name}: {len(sd)} weights; decode {tuple(decoded.shape)} "
              f"({(decoded.abs() >= 1).float().mean() * 100:.0f}% clamped), "
              f"|encode.mean| max {mean.abs().max():.3f}")

    with open(f"{OUT}/b/config.json") as fh:
        assert len(json.load(fh)["latents_mean"]) == 4
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"fixtures: {total / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
