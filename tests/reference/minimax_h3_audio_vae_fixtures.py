"""Golden fixtures for the MiniMax-H3 audio VAE (tests/minimax_h3_audio_vae_parity.rs).

Run from the repository root:  python3 tests/reference/minimax_h3_audio_vae_fixtures.py
Builds two tiny random diffusers `AutoencoderKLMiniMaxH3Audio` models and writes, under
tests/fixtures/minimax_h3_audio_vae/:
  a/config.json, a/diffusion_pytorch_model.safetensors
        model A as a diffusers folder: encoder_dim 4, encoder_rates (2, 3) (hop 6),
        latent_dim 48, latent_channels 8, 4 heads (head width 12 pooled adaptively to 8,
        uneven windows), decoder_dim 16, decoder_rates (3, 2) with kernels (7, 4), two AMP
        blocks per stage (kernels 3, 5; dilations (1, 2) and (1, 3)), random latent statistics.
        Heads and dilations are not in the weights: they come from config.json.
  b/config.json, b/diffusion_pytorch_model.safetensors
        model B: encoder_dim 2, encoder_rates (2, 2, 3) (hop 12), latent_dim 32,
        latent_channels 4, the released defaults for what the weights cannot say (8 heads,
        AMP kernels 3/7/11 with dilations 1/3/5), decoder_dim 16, decoder_rates (2, 3, 2) with
        kernels (4, 5, 4).
  a_original.safetensors, b_original.safetensors
        the same weights as the original single file (Comfy-Org `minimax_h3_audio_vae_fp32`,
        the names stable-diffusion.cpp reads): weight norm folded into `weight`
        (w = g * v / |v| per torch dim 0), and `latents_mean` / `latents_std` tensors.
  io.safetensors   inputs and reference outputs, per model M in {a, b}:
    M.encode.x [2, samples]             stereo waveform (not a multiple of the hop: diffusers
                                        right-pads it with zeros)
    M.encode.mean [2, C, T]             posterior mean (`latent_dist.mode()`), raw
    M.encode.normalized [2, C, T]       (mean - latents_mean) / latents_std, as the pipeline's
                                        reference-audio step
    M.decode.z [2, C, T]                normalized latent (transformer space)
    M.decode.y [2, T * hop]             the pipeline's audio decode: vae.decode(z * std + mean),
                                        clamped to [-1, 1]
  released_shapes.json   name -> PyTorch shape of every tensor of the released model (default
                         config) in the original layout (weight norm folded), for the
                         released-size smoke test (random weights, `cargo test -- --ignored`).
Tensors keep PyTorch's row-major layout; Rust reads the shapes reversed.
"""
import json
import os

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLMiniMaxH3Audio

torch.manual_seed(20261203)
OUT = "tests/fixtures/minimax_h3_audio_vae"

MODELS = {
    "a": dict(encoder_dim=4, encoder_rates=(2, 3), latent_dim=48, latent_channels=8,
              num_attention_heads=4, decoder_dim=16, decoder_rates=(3, 2),
              decoder_kernel_sizes=(7, 4), resblock_kernel_sizes=(3, 5),
              resblock_dilation_sizes=((1, 2), (1, 3))),
    "b": dict(encoder_dim=2, encoder_rates=(2, 2, 3), latent_dim=32, latent_channels=4,
              decoder_dim=16, decoder_rates=(2, 3, 2), decoder_kernel_sizes=(4, 5, 4)),
}
# Per model: waveform samples (stereo), decoder latent frames.
IO = {"a": (58, 7), "b": (70, 5)}


def randomize(vae):
    """Seeded parameters that keep activations O(1) through the tiny network."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("weight_g"):
                scale = 0.3 if name.startswith("decoder.conv_post") else 1.0
                p.copy_(scale * (1.0 + 0.2 * torch.randn_like(p)))
            elif name.endswith("weight_v"):
                p.copy_(torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif name.endswith(".alpha") and p.ndim == 3:  # Snake: linear alpha
                p.copy_(0.5 + torch.rand_like(p))
            elif name.endswith(".alpha") or name.endswith(".beta"):  # SnakeBeta: log scale
                p.copy_(torch.randn_like(p) * 0.3)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 2:  # linears
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            else:  # 1x1 convs without weight norm (mean_proj, logs_proj, dec_in_proj)
                p.copy_(torch.randn_like(p) / (p.shape[1] * p.shape[2]) ** 0.5)


def original_file(sd, cfg):
    """diffusers state dict -> original single file: weight norm folded, statistics added."""
    out = {}
    for k, v in sd.items():
        if k.endswith(".weight_g"):
            base = k[: -len("_g")]
            w = torch._weight_norm(sd[base + "_v"], v, 0)
            out[base] = w.contiguous()
        elif k.endswith(".weight_v"):
            continue
        else:
            out[k] = v.contiguous()
    out["latents_mean"] = torch.tensor(cfg["latents_mean"], dtype=torch.float32)
    out["latents_std"] = torch.tensor(cfg["latents_std"], dtype=torch.float32)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    io = {}
    for name, cfg in MODELS.items():
        c = cfg["latent_channels"]
        cfg = dict(cfg,
                   latents_mean=[round(float(v), 4) for v in torch.randn(c) * 0.5],
                   latents_std=[round(float(v), 4) for v in 0.5 + torch.rand(c)])
        vae = AutoencoderKLMiniMaxH3Audio(**cfg).eval()
        randomize(vae)
        vae.save_pretrained(f"{OUT}/{name}", safe_serialization=True)
        sd = {k: v.detach().contiguous().clone() for k, v in vae.state_dict().items()}
        save_file(original_file(sd, cfg), f"{OUT}/{name}_original.safetensors")

        samples, frames = IO[name]
        mean_t = torch.tensor(cfg["latents_mean"]).view(1, -1, 1)
        std_t = torch.tensor(cfg["latents_std"]).view(1, -1, 1)
        with torch.no_grad():
            t = torch.arange(samples, dtype=torch.float32)
            x = torch.stack([0.6 * torch.sin(0.37 * t) + 0.1 * torch.randn(samples),
                             0.5 * torch.cos(0.21 * t) + 0.1 * torch.randn(samples)])
            mean = vae.encode(x[:, None]).latent_dist.mode()
            z = torch.randn(2, c, frames)
            y = vae.decode(z * std_t + mean_t).sample
        io[f"{name}.encode.x"] = x
        io[f"{name}.encode.mean"] = mean
        io[f"{name}.encode.normalized"] = (mean - mean_t) / std_t
        io[f"{name}.decode.z"] = z
        io[f"{name}.decode.y"] = y[:, 0]
        print(f"model {name}: {len(sd)} tensors; |mean| max {mean.abs().max():.3f}, "
              f"|y| max {y.abs().max():.3f} ({(y.abs() >= 1).float().mean() * 100:.0f}% clamped), "
              f"y {tuple(y.shape)}")

    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")

    with torch.device("meta"):
        released = AutoencoderKLMiniMaxH3Audio().state_dict()
    shapes = {}
    for k, v in released.items():
        if k.endswith(".weight_g"):
            continue
        shapes[k[: -len("_v")] if k.endswith(".weight_v") else k] = list(v.shape)
    with open(f"{OUT}/released_shapes.json", "w") as fh:
        json.dump(shapes, fh, separators=(",", ":"))
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"fixtures: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
